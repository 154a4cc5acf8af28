"""The Algorithm protocol: what a rule kind gives the loader, the engine, explain, the
console, counter resets and the backends. Each kind is one package under
``ferryman.algorithms``, registered once in that package's ``__init__``.

A kind has two faces. The :class:`Algorithm` is static: the YAML keys it reads, how it
describes its limit, how it builds its stores. The :class:`Limiter` it makes is one per
engine (it holds the engine's switches, its stats and any in-process state): it prepares a
rule once per loaded config, plans each descriptor that reaches the rule, asks the store,
and turns the store's results into statuses. The Algorithm also finds, reads and clears the
state one descriptor counts in, for explain, the console and resets.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

from yaml.nodes import Node

from ferryman.clock import Clock
from ferryman.core.answers import EngineOptions, Status, Tally
from ferryman.core.memory_cap import MemoryCap
from ferryman.core.nodes import Ctx
from ferryman.core.rules import Limit, Rule, UnitLimit
from ferryman.stats import Stats

__all__ = [
    "Algorithm",
    "AlgorithmBase",
    "Ask",
    "Call",
    "Counters",
    "Granted",
    "Item",
    "Limiter",
    "Prepared",
    "Rate",
    "Requests",
    "Step",
    "Stepper",
    "StoreOptions",
    "Target",
    "Timed",
]


@dataclass(frozen=True, slots=True)
class StoreOptions:
    """What building a store may need: the clock of in-process stores, the memory
    backend's key cap (``cap``, shared by every kind; else one of ``max_keys`` per store),
    a Redis store's expiry jitter and whether it takes Redis's time."""

    clock: Clock
    max_keys: int = 0
    jitter_max: int = 0
    server_time: bool = True
    cap: MemoryCap | None = None


@dataclass(frozen=True, slots=True)
class Rate:
    """A limit as a sustained rate (per second) and a burst (hits allowed at once): what a
    share of it handed to another decider is built from."""

    per_second: float
    burst: float


class Item(Protocol):
    """One descriptor planned for a store call: where its status goes, and its rule
    (None for a limit Envoy sent in place of a configured one)."""

    @property
    def index(self) -> int: ...

    @property
    def rule(self) -> Rule | None: ...


#: One store call of a request: how many items it carries (for timing) and the call.
Call = tuple[int, Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Target:
    """The state one descriptor counts in, found without counting: the key shown to an
    operator and what the kind's store needs to read or clear it."""

    key: str
    state: Any


class Prepared(Protocol):
    """What a limiter works out once per rule and loaded config."""

    @property
    def rule(self) -> Rule: ...


class Limiter(Protocol):
    """One kind's part of an engine. ``store`` arguments are the backend's store of this
    kind (``Backend.store(algorithm.name)``)."""

    @property
    def algorithm(self) -> Algorithm: ...

    def prepare(self, domain: str, path: tuple[Rule, ...], quota: bool) -> Prepared:
        """The rule at the end of ``path``, worked out once per loaded config."""
        ...

    def plan(
        self,
        prepared: Any,
        index: int,
        domain: str,
        entries: Sequence[tuple[str, str]],
        hits: int,
        now: float,
    ) -> Item | Status:
        """One descriptor's item for the store, or its status when it needs no store."""
        ...

    def calls(self, store: Any, items: Sequence[Any], now: float) -> list[Call]:
        """The store calls for ``items``, to be awaited together with other kinds' calls
        (a pipelined Redis sends them in one write)."""
        ...

    def answer(
        self,
        items: Sequence[Any],
        replies: Sequence[Any],
        now: float,
        statuses: list[Status | None],
        tally: Tally,
    ) -> None:
        """Each item's status from the replies of :meth:`calls`, in the same order, stats
        counted, the outcome tallied."""
        ...


#: Times one store call: ``timed(items, call)`` (the engine's telemetry).
Timed = Callable[[int, Awaitable[Any]], Awaitable[Any]]


class Counters(Limiter, Protocol):
    """The limiter of the kind that also counts the limits Envoy sends with a descriptor,
    and answers a request made only of its plain rules with no plan at all (compiled once
    per distinct request)."""

    @property
    def local(self) -> Any:
        """Its over-limit cache (LOCAL_CACHE_SIZE_IN_BYTES), or None."""
        ...

    def override(
        self,
        index: int,
        limit: UnitLimit,
        domain: str,
        entries: Sequence[tuple[str, str]],
        hits: int,
        now: float,
    ) -> Item:
        """An item for a limit sent with the descriptor, in place of any configured one."""
        ...

    def compile(
        self,
        prepared: Sequence[Any],
        entries: Sequence[Sequence[tuple[str, str]]],
        hits: Sequence[int],
    ) -> Any | None:
        """What answers a request whose descriptors were ``prepared`` by this limiter (None
        for the others), or None when it cannot be answered without a plan."""
        ...

    def send(self, store: Any, compiled: Any, now: float) -> Call:
        """The one store call that answers a compiled request at ``now``."""
        ...

    def answer_now(self, store: Any, compiled: Any, now: float) -> Any | None:
        """The reply :meth:`send`'s call would give, when ``store`` can give it at once
        (it lives in this process); None when the call must be sent."""
        ...

    def finish(self, compiled: Any, replies: Any, now: float) -> tuple[list[Status | None], Tally]:
        """The statuses and tally of a compiled request, from its call's reply."""
        ...


@dataclass(frozen=True, slots=True)
class Ask:
    """ferryman.v1's ``Request`` on the node at the end of ``path``: up to ``copies`` hits,
    at least ``min_copies`` or none, after a wait of at most ``max_wait_millis`` where the
    kind can wait."""

    domain: str
    entries: tuple[tuple[str, str], ...]
    path: tuple[Rule, ...]
    copies: int
    min_copies: int
    max_wait_millis: int


@dataclass(frozen=True, slots=True)
class Granted:
    """A ``Request``'s answer as the fields of ``ferryman.v1.RateResponse``: ``granted``,
    the kind's counts and flags, and its durations in seconds."""

    granted: int
    fields: Mapping[str, int | bool]
    durations: Mapping[str, float]


@runtime_checkable
class Requests(Protocol):
    """A limiter that answers ferryman.v1's ``Request`` (some hits now, a few or none)."""

    async def request(
        self, store: Any, ask: Ask, now: Callable[[], float], timed: Timed
    ) -> Granted: ...


@dataclass(frozen=True, slots=True)
class Step:
    """One limit's decision as an item of a ``rate_limits`` list: whether the hits fit, the
    state to keep when every item of the list fits, what is left, the microseconds until
    the limit is whole again, and how long the state matters (microseconds)."""

    fits: bool
    state: tuple[float, ...]
    remaining: int
    reset_us: float
    keep_us: float


class Stepper(Protocol):
    """One limit of a ``rate_limits`` list: its decision as a pure step over a few numbers,
    written in Python (the memory store) and in Lua (the Redis store), so that a node's
    limits are decided all or none in one atomic script. The Lua file defines
    ``STEPS['<kind>'] = function(state, cost, now_us, args)`` returning fits (1/0), the
    state to keep (a table of numbers), remaining, reset_us and keep_us, as :meth:`step`
    (the kind's ``step_lua`` names that file)."""

    @property
    def kind(self) -> str: ...

    @property
    def reported(self) -> UnitLimit:
        """The limit as Envoy is told it."""
        ...

    @property
    def window(self) -> float | None:
        """The exact window for the headers' ``w=`` (None: the reported unit's)."""
        ...

    def args(self, now: float) -> tuple[float, ...]:
        """The numbers the step takes at ``now`` besides the state (the same in Python and
        in Lua)."""
        ...

    def step(
        self, state: tuple[float, ...] | None, cost: int, now_us: int, args: tuple[float, ...]
    ) -> Step:
        """The decision on ``cost`` hits (0 only looks) at ``now_us``."""
        ...


class Algorithm(Protocol):
    """A rule kind, registered once in ``ferryman.algorithms``."""

    @property
    def name(self) -> str:
        """The kind's name, as explain, resets, metrics and the console show it."""
        ...

    @property
    def stats(self) -> Mapping[str, str]:
        """The per-rule stats this kind counts besides every rule's (total_hits,
        within_limit, over_limit, shadow_mode), each with its help."""
        ...

    @property
    def held(self) -> bool:
        """Whether hits are held until given back (Envoy sends them negative when the
        request's stream ends) rather than counted."""
        ...

    @property
    def shapes(self) -> bool:
        """Whether the kind tells when hits will fit and books them ahead, so that a
        ShouldRateLimit may be held until then (a node's ``max_wait``)."""
        ...

    @property
    def keys(self) -> tuple[str, ...]:
        """The keys of a descriptor node this kind reads; the first one marks a node of the
        kind (a node has one kind at most)."""
        ...

    def parse(self, ctx: Ctx, fields: Mapping[str, Node], path: str) -> Limit | None:
        """The node's limit from its ``fields`` (problems reported into ``ctx`` with file,
        line and path), or None."""
        ...

    def describe(self, limit: Any) -> dict[str, Any]:
        """The limit's numbers as plain data (explain, the console, ``ferryman check``)."""
        ...

    def text(self, described: Mapping[str, Any]) -> str:
        """One line of :meth:`describe`'s data."""
        ...

    def rate(self, limit: Any) -> Rate | None:
        """The limit as a sustained rate and burst, where it has them."""
        ...

    def reported(self, limit: Any) -> UnitLimit | None:
        """The limit as Envoy is told it, where one fixed figure describes it."""
        ...

    def target(
        self,
        options: EngineOptions,
        domain: str,
        path: Sequence[Rule],
        entries: Sequence[tuple[str, str]],
        now: float,
    ) -> Target | None:
        """The state ``entries`` (reaching ``path``) count in now, found without counting
        (None: nothing an operator can read or clear)."""
        ...

    async def peek(self, store: Any, target: Target, now: float) -> dict[str, Any]:
        """What the state holds now, as fields of an explanation, counting nothing."""
        ...

    def now_text(self, fields: Mapping[str, Any]) -> str:
        """:meth:`peek`'s fields in words ("" when there are none)."""
        ...

    async def reset(self, store: Any, target: Target) -> bool:
        """Clear the state (an operator's reset); whether the store held any."""
        ...

    def limiter(self, options: EngineOptions, stats: Stats) -> Limiter:
        """This kind's part of one engine."""
        ...

    def memory_store(self, options: StoreOptions) -> Any:
        """The kind's state in this process."""
        ...

    def stepper(self, limit: Any) -> Stepper | None:
        """The limit as an item of a ``rate_limits`` list (None: the kind cannot be one)."""
        ...

    def cannot_hold(self, limit: Any) -> str:
        """Why a ShouldRateLimit on ``limit`` cannot be held until its hits fit (a node's
        ``max_wait``), or "" when it can: the kind tells when hits will fit and books them."""
        ...

    @property
    def step_lua(self) -> tuple[str, ...] | None:
        """The package and files (shared functions first) of the Lua twin of the kind's
        steps (None: no steps)."""
        ...

    def redis_store(self, connection: Any, options: StoreOptions) -> Any:
        """The kind's state in Redis, over ``connection`` (a RedisConnection)."""
        ...


class AlgorithmBase:
    """What a kind is unless it says otherwise: it counts hits (holds none), cannot hold a
    request until its hits fit, names no stats of its own, has no rate, burst or single
    figure for Envoy, and keeps no state an operator can read or clear."""

    held = False
    shapes = False
    stats: Mapping[str, str] = MappingProxyType({})
    step_lua: tuple[str, ...] | None = None

    def rate(self, limit: Any) -> Rate | None:
        return None

    def reported(self, limit: Any) -> UnitLimit | None:
        return None

    def stepper(self, limit: Any) -> Stepper | None:
        return None

    def cannot_hold(self, limit: Any) -> str:
        if self.shapes:
            return ""
        return f"a {limit.kind.replace('_', ' ')} node cannot tell when its hits will fit"

    def target(
        self,
        options: EngineOptions,
        domain: str,
        path: Sequence[Rule],
        entries: Sequence[tuple[str, str]],
        now: float,
    ) -> Target | None:
        return None

    async def peek(self, store: Any, target: Target, now: float) -> dict[str, Any]:
        return {}

    def now_text(self, fields: Mapping[str, Any]) -> str:
        return ""

    async def reset(self, store: Any, target: Target) -> bool:
        return False
