"""``copies`` on descriptor nodes: parsing, errors with locations, normalization."""

from __future__ import annotations

import pytest

from ferryman.algorithms.copies.model import CopyGroup, CopyPolicy
from ferryman.config import load_sources
from ferryman.errors import ConfigError


def test_copies_are_read_with_groups_and_hold_ttl() -> None:
    """Limits, groups with wildcard members and hold_ttl land in the policy."""
    config = load_sources(
        [
            (
                "c.yaml",
                """
domain: d
descriptors:
  - key: tenant
    copies:
      limit: 10
      global_limit: 100
      hold_ttl: 90s
      groups:
        - {name: probation, limit: 5, members: [new-co, trial-*]}
""",
            )
        ]
    )
    policy = config.domains["d"].root.rules[0].limit
    assert isinstance(policy, CopyPolicy)
    assert policy == CopyPolicy(10, 100, (CopyGroup("probation", 5, ("new-co", "trial-*")),), 90.0)
    assert [g.name for g in policy.groups_of("trial-7")] == ["probation"]
    assert policy.groups_of("acme") == ()


def test_limits_above_the_global_limit_are_lowered_and_reported() -> None:
    """A tenant or group limit above global_limit is lowered to it, with a note."""
    config = load_sources(
        [
            (
                "c.yaml",
                "domain: d\ndescriptors:\n  - key: t\n    copies:\n      limit: 50\n"
                "      global_limit: 12\n      groups: [{name: vip, limit: 40, members: [a]}]\n",
            )
        ]
    )
    policy = config.domains["d"].root.rules[0].limit
    assert isinstance(policy, CopyPolicy)
    assert policy.limit == 12
    assert policy.groups[0].limit == 12
    notes = "\n".join(config.notes)
    assert "limit 50 lowered to the global limit 12" in notes
    assert "group 'vip' limit 40 lowered to the global limit 12" in notes


@pytest.mark.parametrize(
    ("body", "path", "message"),
    [
        (
            "    copies: {limit: 1}\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
            "descriptors[0].copies",
            "not both rate_limit and copies",
        ),
        ("    copies: {limit: -2}\n", "descriptors[0].copies.limit", "out of range"),
        ("    copies: {limit: 1, max: 3}\n", "descriptors[0].copies.max", "unknown key"),
        (
            "    copies: {groups: [{limit: 1, members: [a]}]}\n",
            "descriptors[0].copies.groups[0].name",
            "needs a name",
        ),
        (
            "    copies: {groups: [{name: g, members: [a]}]}\n",
            "descriptors[0].copies.groups[0]",
            "needs a 'limit'",
        ),
        (
            "    copies: {groups: [{name: g, limit: 1, members: a}]}\n",
            "descriptors[0].copies.groups[0].members",
            "list of tenant values",
        ),
        (
            "    copies: {groups: [{name: g, limit: 1, members: [a]}, "
            "{name: g, limit: 2, members: [b]}]}\n",
            "descriptors[0].copies.groups[1]",
            "defined twice",
        ),
        ("    copies: {hold_ttl: 0s}\n", "descriptors[0].copies.hold_ttl", "positive"),
    ],
)
def test_invalid_copies_config_is_rejected_with_location(
    body: str, path: str, message: str
) -> None:
    """Each mistake names the file, a line and the YAML path."""
    with pytest.raises(ConfigError) as info:
        load_sources([("c.yaml", "domain: d\ndescriptors:\n  - key: t\n" + body)])
    problems = [p for p in info.value.problems if p.path == path]
    assert problems, info.value.problems
    assert problems[0].file == "c.yaml"
    assert problems[0].line is not None
    assert message in problems[0].message
