"""Token buckets in Redis: one ``token_bucket.lua`` call per decision, on Redis time.

Keys (after the CACHE_KEY_PREFIX): a named or default bucket is ``quota:{<ns>/<name>}``, a
hash of one field, expiring once the bucket would be full again; a namespace's dynamic
buckets are the fields of ``quota:{<ns>}:buckets`` with their registry (last use, for the
idle removal and the ``max_dynamic_buckets`` count) in ``quota:{<ns>}:registry``. The hash
tags keep each bucket, and a namespace's dynamic buckets with their registry, on one
Cluster slot, so each decision is one script on one node.
"""

from __future__ import annotations

from typing import Any

from ferryman.algorithms.token_bucket.memory import SWEEP_LIMIT, now_micros
from ferryman.algorithms.token_bucket.model import (
    BucketRef,
    BucketSpec,
    BucketState,
    NodeTake,
    Recent,
    Standing,
    TakeResult,
    TakeStatus,
    refilled,
)
from ferryman.clock import Clock
from ferryman.connections.redis import LuaScript, RedisConnection
from ferryman.errors import BackendError

__all__ = ["RedisNodeBuckets", "RedisTokenBucketStore"]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisTokenBucketStore:
    """Buckets shared by every ferryman replica on one Redis (single, Sentinel, Cluster).

    ``clock`` None decides on the Redis server's clock (TIME); a clock (tests) is sent to
    the script as the time of each decision.
    """

    name = "redis"

    def __init__(
        self, connection: RedisConnection, *, prefix: str = "", clock: Clock | None = None
    ) -> None:
        self._connection = connection
        self._script = LuaScript.of(__package__ or "", "bucket.lua", "token_bucket.lua")
        self._peek = LuaScript.of(__package__ or "", "bucket_peek.lua")
        self._prefix = prefix
        self._clock = clock
        self.recent: Recent[BucketRef] = Recent()

    def keys(self, ref: BucketRef) -> list[str]:
        base = f"{self._prefix}quota:"
        if ref.dynamic:
            tag = "{" + ref.namespace + "}"
            return [f"{base}{tag}:buckets", f"{base}{tag}:registry"]
        return [f"{base}{{{ref.namespace}/{ref.name}}}"]

    async def take(
        self, ref: BucketRef, spec: BucketSpec, tokens: int, max_wait_millis: int
    ) -> TakeResult:
        now = "" if self._clock is None else str(now_micros(self._clock))
        return await self.take_at(ref, spec, tokens, max_wait_millis, now)

    async def take_at(
        self, ref: BucketRef, spec: BucketSpec, tokens: int, max_wait_millis: int, now: str
    ) -> TakeResult:
        """``take`` at ``now`` (microseconds as text; "" for the Redis server's clock)."""
        self.recent.add(ref, spec)
        args: list[Any] = [
            now,
            ref.name,
            tokens,
            max_wait_millis,
            spec.size,
            repr(float(spec.fill_rate)),
            spec.max_debt_millis,
            repr(float(spec.max_tokens)),
            spec.max_idle_millis,
            ref.max_dynamic_buckets,
            SWEEP_LIMIT,
        ]
        reply = await self._connection.run(self._script, self.keys(ref), args)
        try:
            status = TakeStatus(int(reply[0]))
            return TakeResult(
                status,
                tokens if status is TakeStatus.OK else 0,
                int(reply[1]),
                bool(int(reply[2])),
                tuple(sorted(_text(name) for name in reply[3:])),
            )
        except (TypeError, ValueError, IndexError) as exc:
            raise BackendError(f"token bucket script: unexpected reply {reply!r}") from exc

    async def peek(self, ref: BucketRef, spec: BucketSpec) -> Standing | None:
        now = "" if self._clock is None else str(now_micros(self._clock))
        reply = await self._connection.run(self._peek, self.keys(ref)[:1], [now, ref.name])
        try:
            now_us = int(float(_text(reply[0])))
            saved = _text(reply[1])
            state = None
            if saved:
                stored, _, next_free = saved.partition(" ")
                state = BucketState(float(stored), float(next_free))
        except (TypeError, ValueError, IndexError) as exc:
            raise BackendError(f"bucket peek script: unexpected reply {reply!r}") from exc
        if state is None and ref.dynamic:
            return None  # removed while idle (or never given tokens)
        return Standing.of(refilled(state, spec, now_us), now_us)

    async def reset(self, ref: BucketRef) -> int:
        """The bucket's state field goes (a dynamic bucket's registry entry stays)."""
        key = self.keys(ref)[0]
        return int(await self._connection.command("HDEL", key, ref.name, key=key))

    async def close(self) -> None:
        """Nothing: the connection belongs to the backend."""


class RedisNodeBuckets:
    """Descriptor nodes' token buckets in Redis: one ``node_bucket.lua`` call per decision,
    one key per bucket (the engine's keys carry their own hash tag).

    ``server_time`` decides on Redis time; otherwise on the ``now`` the engine sends."""

    name = "redis"

    def __init__(self, connection: RedisConnection, server_time: bool = True) -> None:
        self._connection = connection
        self._script = LuaScript.of(__package__ or "", "bucket.lua", "node_bucket.lua")
        connection.scripts.append(self._script)
        self._server_time = server_time
        self.recent: Recent[str] = Recent()

    async def peek(self, key: str, spec: BucketSpec, now: float) -> Standing:
        """A take of no tokens, which writes nothing."""
        take = await self._ask(key, spec, 0, 0, now)
        return Standing(take.stored, max(0.0, take.debt_us))

    async def take(
        self, key: str, spec: BucketSpec, tokens: int, max_wait_millis: int, now: float
    ) -> NodeTake:
        self.recent.add(key, spec)
        return await self._ask(key, spec, tokens, max_wait_millis, now)

    async def _ask(
        self, key: str, spec: BucketSpec, tokens: int, max_wait_millis: int, now: float
    ) -> NodeTake:
        at = "" if self._server_time else str(round(now * 1_000_000))
        args: list[Any] = [
            at,
            tokens,
            max_wait_millis,
            spec.size,
            repr(float(spec.fill_rate)),
            spec.max_debt_millis,
        ]
        reply = await self._connection.run(self._script, [key], args)
        try:
            return NodeTake(
                TakeStatus.OK if int(reply[0]) == 0 else TakeStatus.REJECTED_TIMEOUT,
                int(reply[1]),
                float(_text(reply[2])),
                float(_text(reply[3])),
            )
        except (TypeError, ValueError, IndexError) as exc:
            raise BackendError(f"node bucket script: unexpected reply {reply!r}") from exc

    async def reset(self, key: str) -> int:
        return await self._connection.delete([key])
