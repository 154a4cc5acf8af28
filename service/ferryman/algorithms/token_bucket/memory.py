"""Token buckets in process memory: the embedded store, and the reference for the Redis one."""

from __future__ import annotations

from collections import OrderedDict

from ferryman.algorithms.token_bucket.model import (
    BucketRef,
    BucketSpec,
    BucketState,
    NodeTake,
    Recent,
    Standing,
    TakeResult,
    TakeStatus,
    decide,
    decide_node,
    refilled,
)
from ferryman.clock import Clock
from ferryman.core.memory_cap import SCAN_PAST, MemoryCap, forget_safe

__all__ = ["SWEEP_LIMIT", "MemoryNodeBuckets", "MemoryTokenBucketStore", "now_micros"]

# Idle dynamic buckets removed by one request at most (the Redis script's bound too), so
# that a request never pays for a large sweep.
SWEEP_LIMIT = 100


def now_micros(clock: Clock) -> int:
    return round(clock.now() * 1_000_000)


class _Dynamic:
    __slots__ = ("last_ms", "spec", "state")

    def __init__(self, last_ms: int, state: BucketState | None) -> None:
        self.last_ms = last_ms
        self.state = state
        self.spec: BucketSpec | None = None


def _full(entry: _Dynamic, now_us: int) -> bool:
    """Whether a dynamic bucket holds every token again (then it is as good as new)."""
    assert entry.spec is not None
    return refilled(entry.state, entry.spec, now_us).stored >= entry.spec.size


class MemoryTokenBucketStore:
    """Buckets by (namespace, name); a namespace's dynamic buckets in least recently used
    order, so that idle ones are found at the front. Every take runs without awaiting,
    hence atomically on the event loop.

    Every bucket counts against the memory backend's cap (``quota`` in its shares). To
    make room, dynamic buckets full again go, least recently used first (forgetting one
    gives its caller nothing it would not have: it is as good as new), and are reported
    as removed by the namespace's next take; a bucket still short of tokens is never
    forgotten. With no room, a new bucket is refused (``REJECTED_TOO_MANY_BUCKETS``)."""

    name = "memory"

    def __init__(self, clock: Clock, cap: MemoryCap | None = None) -> None:
        self._clock = clock
        self._fixed: dict[tuple[str, str], BucketState] = {}
        self._dynamic: dict[str, OrderedDict[str, _Dynamic]] = {}
        self._entries = 0  # buckets held, fixed and dynamic
        self._forgotten: dict[str, list[str]] = {}  # made room for, not yet reported
        self._now_us = 0  # the last take's time, for making room between takes
        self.recent: Recent[BucketRef] = Recent()
        self.cap = MemoryCap() if cap is None else cap
        self.cap.join("quota", self)

    def __len__(self) -> int:
        return self._entries

    def _admit(self) -> bool:
        return not self.cap.max_keys or self.cap.admit(self)

    def make_room(self, want: int) -> int:
        """Forget up to ``want`` dynamic buckets full again, least recently used first in
        each namespace (the oldest few only: later ones were used later)."""
        now_us, gone, budget = self._now_us, 0, SCAN_PAST
        for namespace, buckets in self._dynamic.items():
            names: list[str] = []
            for name, entry in buckets.items():
                if gone + len(names) >= want or budget < 0:
                    break
                if entry.state is None or entry.spec is None or _full(entry, now_us):
                    names.append(name)
                else:
                    budget -= 1
            for name in names:
                del buckets[name]
            if names:
                self._forgotten.setdefault(namespace, []).extend(names)
                gone += len(names)
            if gone >= want:
                break
        self._entries -= gone
        return gone

    async def take(
        self, ref: BucketRef, spec: BucketSpec, tokens: int, max_wait_millis: int
    ) -> TakeResult:
        return self.take_at(ref, spec, tokens, max_wait_millis, now_micros(self._clock))

    def take_at(
        self, ref: BucketRef, spec: BucketSpec, tokens: int, max_wait_millis: int, now_us: int
    ) -> TakeResult:
        """``take`` at a given time (microseconds since the epoch)."""
        self.recent.add(ref, spec)
        self._now_us = now_us
        if not ref.dynamic:
            return self._take_fixed(ref, spec, tokens, max_wait_millis, now_us)
        now_ms = now_us // 1000
        buckets = self._dynamic.setdefault(ref.namespace, OrderedDict())
        removed: list[str] = self._forgotten.pop(ref.namespace, [])
        if spec.max_idle_millis >= 0:
            idle: list[str] = []
            for name, entry in buckets.items():
                if len(idle) >= SWEEP_LIMIT or now_ms - entry.last_ms <= spec.max_idle_millis:
                    break
                idle.append(name)
            for name in idle:
                del buckets[name]
            self._entries -= len(idle)
            removed.extend(idle)
        removed.sort()  # as the Redis script reports them
        found = buckets.get(ref.name)
        created = found is None
        if found is None:
            if 0 < ref.max_dynamic_buckets <= len(buckets) or not self._admit():
                return TakeResult(TakeStatus.REJECTED_TOO_MANY_BUCKETS, removed=tuple(removed))
            # Room may have been made in this namespace: those are reported now.
            removed.extend(self._forgotten.pop(ref.namespace, []))
            removed.sort()
            entry = buckets[ref.name] = _Dynamic(now_ms, None)
            self._entries += 1
        else:
            entry = found
            buckets.move_to_end(ref.name)
            entry.last_ms = now_ms
        if tokens > spec.max_tokens:
            return TakeResult(
                TakeStatus.REJECTED_TOO_MANY_TOKENS_REQUESTED,
                created=created,
                removed=tuple(removed),
            )
        status, wait, after = decide(entry.state, spec, tokens, now_us, max_wait_millis * 1000.0)
        entry.spec = spec
        if after is not None:
            entry.state = after
        return TakeResult(
            status, tokens if status is TakeStatus.OK else 0, wait, created, tuple(removed)
        )

    def _take_fixed(
        self, ref: BucketRef, spec: BucketSpec, tokens: int, max_wait_millis: int, now_us: int
    ) -> TakeResult:
        key = (ref.namespace, ref.name)
        if tokens > spec.max_tokens:
            return TakeResult(TakeStatus.REJECTED_TOO_MANY_TOKENS_REQUESTED)
        found = self._fixed.get(key)
        status, wait, after = decide(found, spec, tokens, now_us, max_wait_millis * 1000.0)
        if after is not None:
            if found is None:
                if not self._admit():
                    return TakeResult(TakeStatus.REJECTED_TOO_MANY_BUCKETS)
                self._entries += 1
            self._fixed[key] = after
        return TakeResult(status, tokens if status is TakeStatus.OK else 0, wait)

    async def peek(self, ref: BucketRef, spec: BucketSpec) -> Standing | None:
        now_us = now_micros(self._clock)
        if not ref.dynamic:
            return Standing.of(
                refilled(self._fixed.get((ref.namespace, ref.name)), spec, now_us), now_us
            )
        buckets = self._dynamic.get(ref.namespace)
        entry = None if buckets is None else buckets.get(ref.name)
        if entry is None:
            return None
        return Standing.of(refilled(entry.state, spec, now_us), now_us)

    async def reset(self, ref: BucketRef) -> int:
        if not ref.dynamic:
            if self._fixed.pop((ref.namespace, ref.name), None) is None:
                return 0
            self._entries -= 1
            return 1
        buckets = self._dynamic.get(ref.namespace)
        entry = None if buckets is None else buckets.get(ref.name)
        if entry is None or entry.state is None:
            return 0
        entry.state = None
        return 1

    async def close(self) -> None:
        self._fixed.clear()
        self._dynamic.clear()
        self._forgotten.clear()
        self._entries = 0


class MemoryNodeBuckets:
    """Descriptor nodes' token buckets in process memory, by key, least recently used
    first; a bucket found full again at the front is dropped (it is as good as new).
    Buckets count against the memory backend's cap: to make room, buckets with a token
    left go, least recently used first (an empty one is kept: forgetting it would let its
    caller in again); with none, a new bucket is refused."""

    name = "memory"

    def __init__(self, clock: Clock, cap: MemoryCap | None = None) -> None:
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[BucketSpec, BucketState]] = OrderedDict()
        self.recent: Recent[str] = Recent()
        self.cap = MemoryCap() if cap is None else cap
        self.cap.join("token_bucket", self)
        self._now_us = 0  # the last call's time, for making room between calls

    def make_room(self, want: int) -> int:
        now_us = self._now_us
        return forget_safe(
            self._buckets, want, lambda entry: refilled(entry[1], entry[0], now_us).stored >= 1
        )

    def __len__(self) -> int:
        return len(self._buckets)

    async def take(
        self, key: str, spec: BucketSpec, tokens: int, max_wait_millis: int, now: float
    ) -> NodeTake:
        return self.take_at(key, spec, tokens, max_wait_millis, round(now * 1_000_000))

    def take_at(
        self, key: str, spec: BucketSpec, tokens: int, max_wait_millis: int, now_us: int
    ) -> NodeTake:
        self.recent.add(key, spec)
        buckets = self._buckets
        self._now_us = now_us
        for _ in range(2):  # a little sweeping per call, never a large one
            if not buckets:
                break
            first = next(iter(buckets))
            if first == key:
                break
            old_spec, old = buckets[first]
            if refilled(old, old_spec, now_us).stored < old_spec.size:
                break
            del buckets[first]
        found = buckets.get(key)
        result, after = decide_node(
            None if found is None else found[1], spec, tokens, now_us, max_wait_millis
        )
        if after is not None:
            if found is None and self.cap.max_keys and not self.cap.admit(self):
                # No room, and nothing safe to forget: refused, as a bucket with no token.
                return NodeTake(TakeStatus.REJECTED_TOO_MANY_BUCKETS, 0, 0.0, 0.0)
            buckets[key] = (spec, after)
            buckets.move_to_end(key)
        return result

    async def reset(self, key: str) -> int:
        return 0 if self._buckets.pop(key, None) is None else 1

    async def peek(self, key: str, spec: BucketSpec, now: float) -> Standing:
        now_us = round(now * 1_000_000)
        found = self._buckets.get(key)
        return Standing.of(refilled(None if found is None else found[1], spec, now_us), now_us)

    def clear(self) -> None:
        self._buckets.clear()
