"""The cost budget's decision, pure and clock-free (times in whole milliseconds).

A tenant's budget keeps what was charged in the current window, its open reservations
(request id -> estimate, expiry and the identity that made it) and the request ids
settled lately. One call applies a request's operations together:

1. each tenant's state is brought to ``now``: a new window starts at zero charged; an open
   reservation whose time has passed is charged its estimate (to the current window when
   it expired in it; a window that has ended is not charged again); settled ids are
   forgotten after the reservation time;
2. settlements are applied, never refused for the budget: the reservation of their
   request id (if any) is released and the actual cost charged; a request id already
   settled changes nothing; a reservation another identity made is settled only by one
   allowed to settle for it (``delegate``), and then charged at least its estimate (a
   refund comes only from the reserving identity), otherwise the settlement changes
   nothing (``foreign``); an id never reserved is charged in full and remembered as
   settled; ``cancel`` releases a reservation without charging (a refusal elsewhere
   undoing it);
3. reservations are tried: each is admitted when charged + reserved + its estimate stays
   within the cap (the budget plus the allowed debt); if all are, each estimate is
   reserved under its request id, otherwise none is. An id already open under the same
   identity holds nothing more; one open under another identity is refused; an id
   settled lately is decided afresh (checked and reserved as a new one), so that a
   settlement sent first cannot make its request free: a settlement finds an open
   reservation before it looks at the settled ids.

``memory.py`` runs this; ``cost_budget.lua`` is its Redis twin, step for step, so that
both stores give the same answers on the same trace.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "CANCEL",
    "RESERVE",
    "SETTLE_OP",
    "BudgetOp",
    "BudgetResult",
    "BudgetState",
    "BudgetStore",
    "BudgetView",
    "apply",
    "bring_to",
]

RESERVE = "r"
SETTLE_OP = "s"
CANCEL = "x"


@dataclass(slots=True)
class BudgetState:
    """One tenant's budget: the window charged in, what it was charged, the open
    reservations (id -> (estimate, expires at, owner)), their sum, and the ids settled lately
    (id -> forgotten at); each time-ordered too (a heap of (time, id), stale entries
    dropped as they surface), so that a call touches only what is due."""

    window: str = ""
    charged: int = 0
    reserved: int = 0
    open: dict[str, tuple[int, int, str]] = field(default_factory=dict)
    settled: dict[str, int] = field(default_factory=dict)
    end_ms: int = 0  # the end of the window charged in, for dropping idle states
    open_by: list[tuple[int, str]] = field(default_factory=list)
    settled_by: list[tuple[int, str]] = field(default_factory=list)
    cap: int = 0  # the rule's cap when last asked, for telling a spent tenant

    @property
    def size(self) -> int:
        """Entries held: the tenant, its open reservations and its remembered ids."""
        return 1 + len(self.open) + len(self.settled)

    def spent(self, now_ms: int) -> bool:
        """Charged and reserved up to its cap in a window still running: forgetting it
        would let its caller in again."""
        return self.end_ms > now_ms and self.charged + self.reserved >= self.cap

    def shed(self) -> int:
        """Charge every open reservation its estimate and drop it, and forget the settled
        ids (a settlement that comes later charges in full); how many entries went."""
        gone = len(self.open) + len(self.settled)
        for estimate, _, _ in self.open.values():
            self.charged += estimate
        self.reserved = 0
        self.open.clear()
        self.open_by.clear()
        self.settled.clear()
        self.settled_by.clear()
        return gone

    def idle(self, now_ms: int) -> bool:
        """Nothing left that a later call could need."""
        done = self.charged == 0 or self.end_ms <= now_ms
        return done and not self.open and not self.settled

    def copy(self) -> BudgetState:
        return BudgetState(
            self.window,
            self.charged,
            self.reserved,
            dict(self.open),
            dict(self.settled),
            self.end_ms,
            list(self.open_by),
            list(self.settled_by),
            self.cap,
        )

    def open_at(self, rid: str) -> int | None:
        found = self.open.get(rid)
        return None if found is None else found[1]

    def add_open(self, rid: str, estimate: int, at: int, owner: str) -> None:
        self.open[rid] = (estimate, at, owner)
        _push(self.open_by, len(self.open), at, rid, self.open_at)

    def add_settled(self, rid: str, at: int) -> None:
        self.settled[rid] = at
        _push(self.settled_by, len(self.settled), at, rid, self.settled.get)


def _push(
    heap: list[tuple[int, str]], live: int, at: int, rid: str, at_of: Callable[[str], int | None]
) -> None:
    heapq.heappush(heap, (at, rid))
    if len(heap) > 2 * live + 16:  # mostly stale: rebuilt from the live entries
        heap[:] = [(t, r) for t, r in heap if at_of(r) == t]
        heapq.heapify(heap)


def _first(heap: list[tuple[int, str]], at_of: Callable[[str], int | None]) -> tuple[int, str]:
    """The earliest live entry, (time, id) ordered as a Redis sorted set orders them;
    (2^63, "") when there is none."""
    while heap:
        at, rid = heap[0]
        if at_of(rid) == at:
            return at, rid
        heapq.heappop(heap)
    return 2**63, ""


@dataclass(frozen=True, slots=True)
class BudgetOp:
    """One descriptor's operation on the tenant at ``key``: reserve ``amount`` (the
    estimate), settle it (``amount`` the actual cost) or cancel a reservation; the window
    the call falls in (its key suffix, start and end) and the rule's numbers; who asks
    (``owner``, "" for nobody in particular) and whether it may settle for others."""

    key: str
    mode: str
    request_id: str
    amount: int
    cap: int
    window: str
    start_ms: int
    end_ms: int
    ttl_ms: int
    max_open: int
    owner: str = ""
    delegate: bool = False


@dataclass(frozen=True, slots=True)
class BudgetResult:
    """One operation's outcome and its tenant's budget after the call.

    ``admitted``: a reservation within the cap (settlements and cancels always are);
    ``applied``: reserved, settled or released (False for a duplicate settlement, an id
    already reserved, or a reservation refused with another of the call); ``expired``: the
    reservations of this tenant charged on expiry in this call (on its first operation
    only); ``refund``: what a settlement gave back of its estimate; ``cost``: what a
    settlement charged; ``foreign``: a settlement or reservation of an id another identity
    holds open, refused; ``full``: refused, the memory backend's cap reached with nothing
    safe to forget (nothing applied)."""

    admitted: bool
    applied: bool
    charged: int
    reserved: int
    open: int
    expired: int = 0
    refund: int = 0
    cost: int = 0
    foreign: bool = False
    full: bool = False


@dataclass(frozen=True, slots=True)
class BudgetView:
    """A tenant's budget as an operator sees it (nothing counted)."""

    charged: int
    reserved: int
    open: int


def bring_to(state: BudgetState, op: BudgetOp, now_ms: int) -> int:
    """The state at ``now_ms`` in ``op``'s window; how many reservations it charged."""
    state.cap = op.cap
    if state.window != op.window:
        state.window, state.charged, state.end_ms = op.window, 0, op.end_ms
    expired = 0
    at, rid = _first(state.open_by, state.open_at)
    while at <= now_ms:
        heapq.heappop(state.open_by)
        estimate = state.open.pop(rid)[0]
        state.reserved -= estimate
        if at >= op.start_ms:
            state.charged += estimate
        expired += 1
        at, rid = _first(state.open_by, state.open_at)
    at, rid = _first(state.settled_by, state.settled.get)
    while at <= now_ms:
        heapq.heappop(state.settled_by)
        del state.settled[rid]
        at, rid = _first(state.settled_by, state.settled.get)
    return expired


def _foreign(state: BudgetState, op: BudgetOp) -> bool:
    """Whether ``op``'s id is open under another identity (an owner "" is anyone's)."""
    found = state.open.get(op.request_id) if op.request_id else None
    return found is not None and found[2] != "" and found[2] != op.owner


def _settle(state: BudgetState, op: BudgetOp, now_ms: int) -> tuple[bool, int, int]:
    """(applied, refund, cost charged) of a settlement or a cancel."""
    rid = op.request_id
    if op.mode == CANCEL:
        found = state.open.pop(rid, None)
        if found is not None:
            state.reserved -= found[0]
        return found is not None, 0, 0
    cost = op.amount
    found = state.open.get(rid)
    if found is None:
        if rid in state.settled:
            return False, 0, 0
    elif found[2] and found[2] != op.owner:
        if not op.delegate:
            return False, 0, 0
        cost = max(cost, found[0])
    refund = 0
    if found is not None:
        del state.open[rid]
        state.reserved -= found[0]
        refund = max(0, found[0] - cost)
    state.charged += cost
    state.add_settled(rid, now_ms + op.ttl_ms)
    if len(state.settled) > op.max_open:
        _, oldest = _first(state.settled_by, state.settled.get)
        heapq.heappop(state.settled_by)
        del state.settled[oldest]
    return True, refund, cost


def _reserve(state: BudgetState, op: BudgetOp, now_ms: int) -> int:
    """Reserve ``op``'s estimate (an id settled lately reserved afresh); how many older
    reservations it pushed out (charged)."""
    state.add_open(op.request_id, op.amount, now_ms + op.ttl_ms, op.owner)
    state.reserved += op.amount
    pushed = 0
    while len(state.open) > op.max_open:
        _, oldest = _first(state.open_by, state.open_at)
        heapq.heappop(state.open_by)
        estimate = state.open.pop(oldest)[0]
        state.reserved -= estimate
        state.charged += estimate
        pushed += 1
    return pushed


def _admit(
    states: dict[str, BudgetState], ops: Sequence[BudgetOp], foreign: set[int]
) -> tuple[dict[int, bool], set[int]]:
    """Whether each reservation fits, and which would hold an estimate (``foreign`` gets
    those of an id another identity holds open)."""
    admitted: dict[int, bool] = {}
    takes: set[int] = set()
    extra: dict[str, int] = {}
    for i, op in enumerate(ops):
        if op.mode == RESERVE:
            state = states[op.key]
            if _foreign(state, op):
                foreign.add(i)
                admitted[i] = False
                continue
            rid = op.request_id
            # An id this identity holds open: it holds and checks nothing more.
            amount = 0 if rid and rid in state.open else op.amount
            seen = state.charged + state.reserved + extra.get(op.key, 0)
            admitted[i] = seen + amount <= op.cap
            if rid and amount > 0:
                takes.add(i)
                extra[op.key] = extra.get(op.key, 0) + amount
    return admitted, takes


def apply(
    states: dict[str, BudgetState], ops: Sequence[BudgetOp], now_ms: int
) -> list[BudgetResult]:
    """Apply ``ops`` to ``states`` (by key; missing ones are created) at ``now_ms``."""
    expired: dict[str, int] = {}
    for op in ops:
        if op.key not in expired:
            state = states.setdefault(op.key, BudgetState())
            expired[op.key] = bring_to(state, op, now_ms)
    done: dict[int, tuple[bool, int, int]] = {}
    foreign: set[int] = set()
    for i, op in enumerate(ops):
        if op.mode != RESERVE:
            if op.mode == SETTLE_OP and not op.delegate and _foreign(states[op.key], op):
                foreign.add(i)
            done[i] = _settle(states[op.key], op, now_ms)
    admitted, takes = _admit(states, ops, foreign)
    every = all(admitted.values())
    for i, op in enumerate(ops):
        if op.mode == RESERVE and every:
            state = states[op.key]
            # Not an id an earlier reservation of this call took.
            taken = i in takes and op.request_id not in state.open
            if taken:
                expired[op.key] += _reserve(state, op, now_ms)
            done[i] = (taken, 0, 0)
    out: list[BudgetResult] = []
    reported: set[str] = set()
    for i, op in enumerate(ops):
        state = states[op.key]
        applied, refund, cost = done.get(i, (False, 0, 0))
        count = 0 if op.key in reported else expired[op.key]
        reported.add(op.key)
        out.append(
            BudgetResult(
                admitted.get(i, True),
                applied,
                state.charged,
                state.reserved,
                len(state.open),
                count,
                refund,
                cost,
                i in foreign,
            )
        )
    return out


class BudgetStore(Protocol):
    """Where cost budgets live: one atomic call per request."""

    async def apply(self, ops: Sequence[BudgetOp], now: float) -> list[BudgetResult]:
        """Apply a request's ``ops`` together (see the module); ``now`` in seconds (a Redis
        store on server time uses Redis's clock). Raises BackendError when the store
        fails."""
        ...

    async def peek(self, op: BudgetOp, now: float) -> BudgetView:
        """The tenant's budget at ``now`` (expired reservations charged), writing nothing."""
        ...

    async def reset(self, key: str) -> int:
        """Forget the tenant's budget and reservations (an operator's reset); 1 if held."""
        ...
