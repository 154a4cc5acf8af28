"""Held copies (a distributed counting semaphore): one body per behaviour, on every store."""

from __future__ import annotations

import pytest

from ferryman.errors import HoldError, LeaseLostError, NotFoundError

from helpers.copies import LEASE, CopyNode
from helpers.stores import Store, on_stores

pytestmark = on_stores()


@pytest.fixture
def node(store: Store) -> CopyNode:
    """A fresh copy-limited node on the store under test."""
    return CopyNode(store)


def test_reserve_counts_tenant_group_and_global(node: CopyNode) -> None:
    """A reservation counts once for the tenant, once in each of its groups and globally."""
    assert node.reserve("acme", 3) == 3
    assert node.counts() == {"d:acme": 3, "g:vip": 3, "g:wide": 3, "all": 3}
    node.release("acme", 3)
    assert node.counts() == {}


def test_limits_bind_at_every_level(node: CopyNode) -> None:
    """Tenant limit 10, group limits 5 and 8, global 12: each one caps the grant."""
    assert node.reserve("trial-1", 9) == 5  # probation holds 5
    assert node.reserve("trial-2", 1) == 0  # probation is full
    assert node.reserve("acme", 9) == 3  # wide: 8 - 5
    assert node.reserve("acme", 4, min_copies=4) == 0  # wide is full: nothing granted
    assert node.counts()["all"] == 8


def test_tenant_in_two_groups_takes_one_copy_from_each(node: CopyNode) -> None:
    """new-co is in probation and wide: one reservation takes from both pools."""
    assert node.reserve("new-co", 2) == 2
    counts = node.counts()
    assert counts["g:probation"] == 2
    assert counts["g:wide"] == 2


def test_release_names_the_groups_as_they_were_at_reserve_time(node: CopyNode) -> None:
    """After membership changes, a release naming the old groups returns the right pools."""
    node.reserve("new-co", 2)
    # new-co has since left probation; the release names the groups of the reservation.
    node.release("new-co", 2, groups=("probation", "wide"))
    assert node.counts() == {}


def test_over_release_is_rejected_and_changes_nothing(node: CopyNode) -> None:
    """Releasing more than held, or naming a group not held, raises and leaves counts alone."""
    node.reserve("acme", 2)
    before = node.counts()
    with pytest.raises(HoldError):
        node.release("acme", 3)
    with pytest.raises(HoldError):
        node.release("acme", 1, groups=("probation",))
    assert node.counts() == before


def test_transfer_keeps_copies_counted_and_seize_claims_them_once(node: CopyNode) -> None:
    """Staged copies stay counted, cannot be released by the sender, and seize works once."""
    node.reserve("acme", 5)
    tid = node.transfer("acme", 3, ttl=30)
    assert node.counts()["all"] == 5
    with pytest.raises(HoldError):
        node.release("acme", 3)  # A holds only 2 now
    seized = node.seize(tid, server="B")
    assert (seized.tenant, seized.copies, set(seized.groups)) == ("acme", 3, {"vip", "wide"})
    with pytest.raises(NotFoundError):
        node.seize(tid, server="B")
    node.release("acme", 3, server="B")
    node.release("acme", 2, server="A")
    assert node.counts() == {}


def test_unclaimed_transfer_returns_its_copies_after_its_ttl(node: CopyNode) -> None:
    """A transfer nobody seizes is released when its ttl passes (on the next operation)."""
    node.reserve("acme", 4)
    tid = node.transfer("acme", 4, ttl=5)
    node.now += 6
    node.renew("A")
    assert node.counts() == {}
    with pytest.raises(NotFoundError):
        node.seize(tid)


def test_dead_server_holds_are_freed_by_the_next_operation(node: CopyNode) -> None:
    """When server A stops renewing, B's next call frees A's copies; A then learns it lost."""
    node.reserve("acme", 4, server="A")
    node.reserve("trial-1", 2, server="B")
    node.now += LEASE / 1000 / 2
    node.renew("B")
    node.now += LEASE / 1000 / 2 + 1
    assert node.reserve("acme", 1, server="B") == 1
    assert node.counts() == {
        "d:trial-1": 2, "g:probation": 2, "d:acme": 1, "g:vip": 1, "g:wide": 3, "all": 3
    }  # fmt: skip
    with pytest.raises(LeaseLostError):
        node.release("acme", 4, server="A")


def test_trim_frees_only_what_a_server_holds_beyond_what_it_keeps(node: CopyNode) -> None:
    """A trim frees the server's copies beyond those it keeps, from every count, and
    leaves the other servers' holds alone."""
    node.reserve("acme", 3, server="A")
    node.reserve("acme", 2, server="B")
    keep = {"d:acme": 1, "all": 1, "g:vip": 1, "g:wide": 1}
    assert node.store.run(node.copies.trim(node.at("A"), keep)) == 2
    assert node.counts() == {"d:acme": 3, "g:vip": 3, "g:wide": 3, "all": 3}
    node.release("acme", 1, server="A")
    node.release("acme", 2, server="B")
    assert node.counts() == {}
