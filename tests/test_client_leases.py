"""RateLimiter learning its resource's demand, and one lease shared by every opening of a
resource, against a real server in process on the system clock."""

from __future__ import annotations

import pytest

from ferryman.client import CapacityClient, RateLimiter

from helpers.capacity import resources_yaml
from helpers.ports import refused_port
from helpers.server import ConfigDir, Server, ServerFactory, wait_for


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def server(config_dir: ConfigDir, make_server: ServerFactory) -> Server:
    config_dir.write("resources.yaml", resources_yaml(capacity=120, lease=30))
    return make_server(real_clock=True, doorman_minimum_refresh_interval=0)


def _calls(limiter: RateLimiter, clock: Clock, start: float, n: int = 50) -> list[bool]:
    """``n`` try_acquire calls 20 ms apart on the limiter's clock from ``start``."""
    got = []
    for i in range(n):
        clock.now = start + i * 0.02
        got.append(limiter.try_acquire())
    return got


def _holders(server: Server) -> int:
    state = server.service.capacity.state
    resource = None if state is None else state.resources.get("fair")
    return 0 if resource is None else len(resource.clients)


def test_a_limiter_learns_its_resources_demand_from_how_often_it_is_asked(
    server: Server,
) -> None:
    """Refused calls ask for twice what was seen; a steady 50 calls a second then asks 55."""
    clock = Clock(100.0)
    with CapacityClient(f"127.0.0.1:{server.service.grpc_port}") as client:
        resource = client.resource("fair")
        limiter = RateLimiter(resource, clock=clock)
        assert not any(_calls(limiter, clock, 100.0))  # no lease yet: every call waits
        clock.now = 101.0
        limiter.try_acquire()  # a new second: the last one is counted
        assert resource.wants == pytest.approx(100)
        wait_for("a lease of 100", lambda: resource.capacity == pytest.approx(100), timeout=10)
        _calls(limiter, clock, 101.02, 49)
        assert all(_calls(limiter, clock, 102.0))
        assert resource.wants == pytest.approx(100)  # 101 had a refused call: still probing
        clock.now = 103.0
        limiter.try_acquire()
        assert resource.wants == pytest.approx(55)  # 50 a second, with 10% headroom
        wait_for("the lease follows", lambda: resource.capacity == pytest.approx(55), timeout=10)


def test_opening_a_resource_twice_shares_one_lease_released_with_its_last_user(
    server: Server,
) -> None:
    """The second opening is the same resource, asking the larger demand; the lease goes
    back to the server only when both have released it."""
    with CapacityClient(f"127.0.0.1:{server.service.grpc_port}") as client:
        first = client.resource("fair", 30)
        second = client.resource("fair", 50)
        assert first is second and first.wants == 50
        wait_for("the lease", lambda: first.capacity == pytest.approx(50), timeout=10)
        assert _holders(server) == 1
        first.release()
        assert "fair" in client.stats().capacity
        second.release()
        assert "fair" not in client.stats().capacity
        wait_for("the server frees it", lambda: _holders(server) == 0, timeout=10)


def test_a_numeric_fallback_is_the_capacity_used_without_a_lease() -> None:
    """With no server to lease from, a resource's numeric fallback is its capacity; a
    negative one is refused."""
    with CapacityClient(f"127.0.0.1:{refused_port()}", fallback=25.0, timeout=1) as client:
        resource = client.resource("fair", 100)
        assert resource.capacity == 25 and client.stats().mode == {"fair": "fallback"}
        with pytest.raises(ValueError, match="capacity >= 0"):
            client.resource("other", 1, fallback=-1.0)
