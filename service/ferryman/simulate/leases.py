"""Doorman's simulations: clients and a tree of servers leasing one resource's capacity,
second by second on a virtual clock, through ferryman's own lease state and algorithms
(``LeaseState.ask``, the division of ``algorithms.leases``).

A scenario (YAML) gives the resource (capacity and algorithm), the tree below the root
(``tree: [3, 3]``: three servers under the root, three under each), the clients of each
leaf server and their wants, how wants drift, and events: clients spiking, joining and
leaving, a server crashing for a while (it comes back knowing nothing, in learning mode).
Each second records the capacity handed out to clients (the sum of their unexpired leases)
and their wants; the report gives ``capacity_used`` (handed out over ``min(capacity,
wants)``, averaged over the steady seconds: after convergence and outside the refresh
intervals that follow each event) and ``peak`` (the highest second over the capacity).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ferryman.algorithms.leases import (
    AlgorithmSpec,
    Band,
    Kind,
    Lease,
    LeaseState,
    ResourceTemplate,
    TemplateSource,
)
from ferryman.errors import FerrymanError

__all__ = ["Scenario", "load_scenario", "run_scenario"]

RESOURCE = "resource"


class ScenarioError(FerrymanError):
    """A scenario file that cannot be run: names the file and the field."""


@dataclass(frozen=True)
class Event:
    at: int
    what: str  # spike, join, leave, crash, demand
    count: int = 0
    amount: float = 0.0
    duration: int = 0
    server: str = ""


@dataclass(frozen=True)
class Scenario:
    name: str
    seconds: int
    template: ResourceTemplate
    tree: tuple[int, ...] = ()
    clients: int = 5
    wants: float = 100.0
    drift_every: int = 0
    drift_by: float = 0.0
    events: tuple[Event, ...] = ()
    seed: int = 1
    description: str = ""


class _Fixed(TemplateSource):
    def __init__(self, template: ResourceTemplate) -> None:
        self._template = template

    def template(self, resource_id: str) -> ResourceTemplate | None:
        return self._template


class _Server(TemplateSource):
    """One server: its lease state, its parent (None for the root) and its own lease."""

    def __init__(self, name: str, parent: _Server | None, root: ResourceTemplate) -> None:
        self.name = name
        self.parent = parent
        self.root = root
        self.lease: Lease | None = None
        self.next_refresh = 0.0
        self.down_until = -1.0
        self.now = 0.0
        self.state = LeaseState(_Fixed(root) if parent is None else self, min_refresh_interval=0)

    def template(self, resource_id: str) -> ResourceTemplate | None:
        lease = self.lease
        capacity = 0.0 if lease is None or lease.expiry_time <= self.now else lease.capacity
        return ResourceTemplate(RESOURCE, capacity, self.root.algorithm)

    def expiry_cap(self, resource_id: str) -> float | None:
        lease = self.lease
        return None if lease is None or lease.expiry_time <= self.now else lease.expiry_time

    def up(self, now: float) -> bool:
        return now >= self.down_until

    def refresh(self, now: float) -> None:
        """Ask the parent for this server's clients' sum (as a band of their number)."""
        parent = self.parent
        assert parent is not None
        self.now = now
        if now < self.next_refresh or not self.up(now):
            return
        if not parent.up(now):
            self.next_refresh = now + 1
            return
        resource = self.state.resources.get(RESOURCE)
        clients = 0 if resource is None else resource.sum_weight
        wants = 0.0 if resource is None else resource.sum_wants
        band = (Band(0, max(1, clients), wants),)
        parent.now = now
        lease, _, _ = parent.state.ask(self.name, RESOURCE, wants=wants, now=now, bands=band)
        self.lease = lease
        self.next_refresh = now + lease.refresh_interval


@dataclass
class _Client:
    name: str
    server: _Server
    wants: float
    lease: Lease | None = None
    next_refresh: float = 0.0
    extra: float = 0.0
    extra_until: float = 0.0

    def refresh(self, now: float) -> None:
        server = self.server
        if now < self.next_refresh:
            return
        if not server.up(now):
            self.next_refresh = now + 1
            return
        server.now = now
        wants = self.wants + (self.extra if now < self.extra_until else 0.0)
        has = self.lease if self.has(now) > 0 else None  # an expired lease is not sent
        self.lease, _, _ = server.state.ask(self.name, RESOURCE, wants=wants, now=now, has=has)
        self.next_refresh = now + self.lease.refresh_interval

    def has(self, now: float) -> float:
        lease = self.lease
        return 0.0 if lease is None or lease.expiry_time <= now else lease.capacity


@dataclass
class _World:
    scenario: Scenario
    servers: list[_Server]
    leaves: list[_Server]
    clients: list[_Client]
    rng: random.Random
    made: int = 0
    left: list[_Client] = field(default_factory=list)

    def add_client(self, leaf: _Server, wants: float, now: float) -> None:
        self.made += 1
        self.clients.append(_Client(f"client-{self.made}", leaf, wants, None, now))


def _build(scenario: Scenario) -> _World:
    root = _Server("root", None, scenario.template)
    servers, level = [root], [root]
    for fan_out in scenario.tree:
        level = [
            _Server(f"{parent.name}/{i}", parent, scenario.template)
            for parent in level
            for i in range(fan_out)
        ]
        servers.extend(level)
    world = _World(scenario, servers, level, [], random.Random(scenario.seed))
    # Nobody is in step: each server and client first asks at a random point of its
    # first refresh interval.
    spread = float(scenario.template.algorithm.refresh_interval)
    for server in servers[1:]:
        server.next_refresh = float(int(world.rng.random() * spread))
    for leaf in level:
        for _ in range(scenario.clients):
            world.add_client(leaf, scenario.wants, float(int(world.rng.random() * spread)))
    return world


def _event(world: _World, event: Event, now: float) -> None:
    rng = world.rng
    if event.what == "spike":
        pool = [c for c in world.clients if not event.server or c.server.name == event.server]
        for client in rng.sample(pool, min(event.count, len(pool))):
            client.extra, client.extra_until = event.amount, now + (event.duration or 1e12)
            client.next_refresh = now
    elif event.what == "join":
        for i in range(event.count):
            world.add_client(world.leaves[i % len(world.leaves)], event.amount, now)
    elif event.what == "leave":
        for client in rng.sample(world.clients, min(event.count, len(world.clients))):
            world.clients.remove(client)
            client.server.state.release(client.name, [RESOURCE])
    elif event.what == "demand":
        for client in world.clients:
            client.wants = max(0.0, client.wants + event.amount)
    elif event.what == "crash":
        server = next((s for s in world.servers if s.name == event.server), None)
        if server is None:
            raise ScenarioError(f"crash: no server {event.server!r}")
        server.down_until = now + max(1, event.duration)
        server.state.reset(server.down_until)  # it comes back knowing nothing: learning


def _drift(world: _World) -> None:
    by = world.scenario.drift_by
    for client in world.clients:
        client.wants = max(0.0, client.wants + world.rng.uniform(-by, by))


def _second(world: _World, now: float) -> tuple[float, float]:
    """One second: servers refresh top down, then clients; (handed out, wants) after it."""
    for server in world.servers[1:]:
        server.refresh(now)
    for client in world.clients:
        client.refresh(now)
    handed = sum(c.has(now) for c in world.clients)
    wants = sum(c.wants + (c.extra if now < c.extra_until else 0.0) for c in world.clients)
    return handed, wants


def run_scenario(scenario: Scenario) -> dict[str, Any]:
    """Every second's capacity, handed out and wants, and the summary figures."""
    world = _build(scenario)
    capacity = scenario.template.capacity
    events = sorted(scenario.events, key=lambda e: e.at)
    rows: list[dict[str, float]] = []
    for second in range(scenario.seconds):
        now = float(second)
        for event in events:
            if event.at == second:
                _event(world, event, now)
        if scenario.drift_every and second and second % scenario.drift_every == 0:
            _drift(world)
        handed, wants = _second(world, now)
        rows.append({"second": second, "capacity": capacity, "handed": handed, "wants": wants})
    return _summary(scenario, rows)


def _unsteady(scenario: Scenario) -> set[int]:
    """The seconds left out of ``capacity_used``: learning and convergence at the start,
    and the refresh intervals after each event (a crash's too, once it is back)."""
    spec = scenario.template.algorithm
    settle = int(spec.refresh_interval * (len(scenario.tree) + 2))
    out = set(range(int(spec.learning_seconds) + settle))
    for event in scenario.events:
        end = event.at + (event.duration if event.what == "crash" else 0)
        extra = int(spec.learning_seconds) if event.what == "crash" else 0
        out.update(range(event.at, end + extra + settle))
        if event.what == "spike" and event.duration:
            out.update(range(event.at + event.duration, event.at + event.duration + settle))
    return out


def _summary(scenario: Scenario, rows: list[dict[str, float]]) -> dict[str, Any]:
    capacity = scenario.template.capacity
    unsteady = _unsteady(scenario)
    used = [
        r["handed"] / min(capacity, r["wants"])
        for r in rows
        if int(r["second"]) not in unsteady and min(capacity, r["wants"]) > 0
    ]
    peak_row = max(rows, key=lambda r: r["handed"]) if rows else {"handed": 0.0, "second": 0}
    over = [r for r in rows if r["handed"] > capacity * (1 + 1e-9)]
    return {
        "scenario": scenario.name,
        "seconds": scenario.seconds,
        "capacity": capacity,
        "capacity_used": round(sum(used) / len(used), 4) if used else None,
        "steady_seconds": len(used),
        "peak": round(peak_row["handed"] / capacity, 4) if capacity else None,
        "peak_second": int(peak_row["second"]),
        "seconds_over_capacity": len(over),
        "per_second": rows,
    }


def _events(raw: Any, where: str) -> tuple[Event, ...]:
    out = []
    for i, item in enumerate(raw or []):
        if not isinstance(item, dict) or "at" not in item:
            raise ScenarioError(f"{where}: events[{i}] needs 'at' (a second)")
        kinds = [k for k in ("spike", "join", "leave", "crash", "demand") if k in item]
        if len(kinds) != 1:
            raise ScenarioError(
                f"{where}: events[{i}] needs one of spike, join, leave, crash, demand"
            )
        what = kinds[0]
        value: Any = item[what]
        out.append(
            Event(
                int(item["at"]),
                what,
                count=int(value) if what in ("spike", "join", "leave") else 0,
                amount=float(item.get("add", item.get("wants", value if what == "demand" else 0))),
                duration=int(item.get("for", 0)),
                server=str(value) if what == "crash" else str(item.get("at_server", "")),
            )
        )
    return tuple(out)


def load_scenario(path: Path) -> Scenario:
    """A scenario file; ScenarioError names the file and what is wrong."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        resource = raw["resource"]
        algorithm = resource.get("algorithm", {})
        spec = AlgorithmSpec(
            Kind[str(algorithm.get("kind", "FAIR_SHARE")).upper()],
            int(algorithm.get("lease_length", 60)),
            int(algorithm.get("refresh_interval", 5)),
            algorithm.get("learning_mode_duration"),
        )
        drift = raw.get("drift") or {}
        return Scenario(
            name=str(raw.get("name", path.stem)),
            seconds=int(raw.get("seconds", 600)),
            template=ResourceTemplate(RESOURCE, float(resource["capacity"]), spec),
            tree=tuple(int(n) for n in raw.get("tree") or ()),
            clients=int(raw.get("clients", 5)),
            wants=float(raw.get("wants", 100)),
            drift_every=int(drift.get("every", 0)),
            drift_by=float(drift.get("by", 0)),
            events=_events(raw.get("events"), str(path)),
            seed=int(raw.get("seed", 1)),
            description=str(raw.get("description", "")),
        )
    except ScenarioError:
        raise
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ScenarioError(f"{path}: not a lease scenario: {exc!r}") from None
