"""The smart token-bucket client: a local reserve of a quota bucket's tokens, refilled in the
background by one ``Allow`` for many, and batched after-the-fact accounting (``charge``).

Most decisions never leave the process: ``take`` spends the reserve, and a refill asks the
service for ``batch - reserve`` tokens once the reserve falls to ``low_water``. The reserve
never holds more than one batch, so a crash loses at most one batch, and it holds only
tokens the service granted: while the service is out of reach, what the reserve lacks is
answered as the client answers any ``allow`` then (its fallback limiter, or degraded mode).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ferryman.client._core import ClientCore, Flow, Granted
from ferryman.tasks import cancel, wait_event

if TYPE_CHECKING:
    from ferryman.client._async import AsyncClient
    from ferryman.client._sync import Client

__all__ = ["AsyncLocalBucket", "BucketStats", "Charges", "LocalBucket"]

_RETRY = 1.0  # seconds before a failed refill is tried again


@dataclass(frozen=True)
class BucketStats:
    """A local bucket's counts: ``used`` tokens taken from the reserve, ``server_tokens``
    the service granted it in all (``used`` never exceeds them), ``refills`` the Allow
    calls, ``refill_failures`` those refused or unanswered, ``refused`` takes the reserve
    could not cover in time, ``local`` takes answered without the service (fallback or
    degraded) while it was out of reach, ``reserve`` and its ``peak``."""

    used: int
    server_tokens: int
    refills: int
    refill_failures: int
    refused: int
    local: int
    reserve: int
    peak: int


class _Reserve:
    """The reserve and its counts, under one condition; no I/O."""

    def __init__(self, core: ClientCore, namespace: str, name: str, batch: int, low: int):
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch: expected an int >= 1, got {batch!r}")
        if isinstance(low, bool) or not isinstance(low, int) or not 0 <= low < batch:
            raise ValueError(f"low_water: expected an int in [0, batch), got {low!r}")
        self.core, self.namespace, self.name = core, namespace, name
        self.batch, self.low = batch, low
        self.cond = threading.Condition()
        self.tokens = 0
        self.refilling = False
        self.outage = False
        self.closed = False
        self.retry_at = -math.inf
        self.counts = dict.fromkeys(
            ("used", "server_tokens", "refills", "refill_failures", "refused", "local", "peak"), 0
        )

    def spend(self, n: int) -> bool:
        """Take ``n`` from the reserve if it has them (under the lock)."""
        if self.tokens < n:
            return False
        self.tokens -= n
        self.counts["used"] += n
        return True

    def wants_refill(self) -> bool:
        """Whether a refill should start now (under the lock); marks it started."""
        if self.refilling or self.closed or self.tokens > self.low:
            return False
        if time.monotonic() < self.retry_at:  # the last one failed: not before then
            return False
        self.refilling = True
        return True

    def ask(self) -> Flow[Granted | None]:
        with self.cond:
            n = self.batch - self.tokens
        return self.core.quota_flow(self.namespace, self.name, max(1, n), None)

    def refilled(self, granted: Granted | None) -> bool:
        """Take a refill's answer; whether it brought tokens."""
        with self.cond:
            self.counts["refills"] += 1
            self.refilling = False
            self.outage = granted is None
            ok = granted is not None and granted.status == "OK"
            if ok:
                assert granted is not None
                self.tokens += granted.tokens
                self.counts["server_tokens"] += granted.tokens
                self.counts["peak"] = max(self.counts["peak"], self.tokens)
            else:
                self.counts["refill_failures"] += 1
                self.retry_at = time.monotonic() + _RETRY
                if granted is not None and granted.status == "REJECTED_TOO_MANY_TOKENS_REQUESTED":
                    # The bucket takes fewer per request: ask for less, at once.
                    self.batch = max(1, self.batch // 2)
                    self.low = min(self.low, self.batch - 1)
                    self.retry_at = -math.inf
            self.cond.notify_all()
            return ok

    def local(self, n: int) -> bool:
        self.counts["local"] += 1
        return self.core.local_allow(self.namespace, self.name, n)

    def check(self, n: int) -> int:
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= self.batch:
            raise ValueError(f"tokens: expected an int in [1, batch={self.batch}], got {n!r}")
        return n

    def stats(self) -> BucketStats:
        with self.cond:
            return BucketStats(**self.counts, reserve=self.tokens)


class LocalBucket:
    """A quota bucket's tokens spent in process (``Client.bucket``); refilled by a thread."""

    def __init__(
        self, client: Client, namespace: str, name: str, batch: int, low_water: int
    ) -> None:
        self._client = client
        self._state = _Reserve(client._core, namespace, name, batch, low_water)
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ferryman-bucket", daemon=True)
        self._thread.start()
        self._refill_soon()

    def take(self, tokens: int = 1, max_wait: float = 0.0) -> bool:
        """Take ``tokens`` from the reserve, waiting up to ``max_wait`` seconds for a refill
        when it is short; False if they could not be had."""
        state = self._state
        n = state.check(tokens)
        deadline = time.monotonic() + max_wait
        with state.cond:
            while not state.spend(n):
                if state.wants_refill():
                    self._wake.set()
                if state.outage:
                    return state.local(n)
                left = deadline - time.monotonic()
                if left <= 0:
                    state.counts["refused"] += 1
                    return False
                state.cond.wait(left)
            if state.wants_refill():
                self._wake.set()
        return True

    def stats(self) -> BucketStats:
        return self._state.stats()

    def _refill_soon(self) -> None:
        with self._state.cond:
            if self._state.wants_refill():
                self._wake.set()

    def _run(self) -> None:
        state = self._state
        while True:
            self._wake.wait()
            self._wake.clear()
            if state.closed:
                return
            try:
                granted = self._client._drive(state.ask())
            except Exception:  # never let the refiller die; the next take asks again
                granted = None
            if not state.refilled(granted):
                # Tried again once retry_at has passed: by the next take, or from here.
                self._wake.wait(max(0.0, state.retry_at - time.monotonic()))
                self._refill_soon()

    def close(self) -> None:
        """Stop refilling; what is left in the reserve is given up."""
        with self._state.cond:
            self._state.closed = True
            self._state.cond.notify_all()
        self._wake.set()
        self._thread.join(self._client.timeout + 1)


class AsyncLocalBucket:
    """``LocalBucket`` for ``AsyncClient.bucket``: refilled by a task of the running loop."""

    def __init__(
        self, client: AsyncClient, namespace: str, name: str, batch: int, low_water: int
    ) -> None:
        self._client = client
        self._state = _Reserve(client._core, namespace, name, batch, low_water)
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())
        self._refill_soon()

    async def take(self, tokens: int = 1, max_wait: float = 0.0) -> bool:
        """Take ``tokens`` from the reserve, waiting up to ``max_wait`` seconds for a refill."""
        state = self._state
        n = state.check(tokens)
        deadline = time.monotonic() + max_wait
        while True:
            with state.cond:
                if state.spend(n):
                    self._refill_soon()
                    return True
                self._refill_soon()
                if state.outage:
                    return state.local(n)
                left = deadline - time.monotonic()
                if left <= 0:
                    state.counts["refused"] += 1
                    return False
                self._changed.clear()
            await wait_event(self._changed, left)

    def stats(self) -> BucketStats:
        return self._state.stats()

    def _refill_soon(self) -> None:
        with self._state.cond:
            if self._state.wants_refill():
                self._wake.set()

    async def _run(self) -> None:
        state = self._state
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                granted = await self._client._drive(state.ask())
            except asyncio.CancelledError:
                raise
            except Exception:  # never let the refiller die
                granted = None
            ok = state.refilled(granted)
            self._changed.set()
            if not ok:
                await wait_event(self._wake, max(0.0, state.retry_at - time.monotonic()))
                self._refill_soon()

    async def aclose(self) -> None:
        """Stop refilling; what is left in the reserve is given up."""
        self._state.closed = True
        await cancel(self._task)


class Charges:
    """Tokens used before asking (after-the-fact accounting), summed per bucket and sent as
    one Allow each per flush. A charge the service refuses or cannot take stays pending for
    the next flush; ``sent`` counts the tokens it took, ``kept`` the flushes that kept some."""

    def __init__(self, core: ClientCore) -> None:
        self._core = core
        self._lock = threading.Lock()
        self.pending: dict[tuple[str, str], int] = {}
        self.sent = 0
        self.kept = 0

    def add(self, namespace: str, bucket: str, tokens: int) -> None:
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise ValueError(f"tokens: expected an int >= 1, got {tokens!r}")
        with self._lock:
            key = (namespace, bucket)
            self.pending[key] = self.pending.get(key, 0) + tokens

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self.pending)

    def due(self) -> list[tuple[str, str, int]]:
        """What to send now, taken off the pending sums (``settle`` puts back what failed)."""
        with self._lock:
            due = [(ns, b, n) for (ns, b), n in self.pending.items()]
            self.pending.clear()
        return due

    def flow(self, namespace: str, bucket: str, tokens: int) -> Flow[Granted | None]:
        # The wait is not slept: these tokens are spent already; a wait is the debt that
        # makes the next callers of the bucket wait.
        return self._core.quota_flow(namespace, bucket, tokens, None)

    def settle(self, namespace: str, bucket: str, tokens: int, granted: Granted | None) -> None:
        if granted is not None and granted.status == "OK":
            with self._lock:
                self.sent += tokens
            return
        with self._lock:
            self.kept += 1
            key = (namespace, bucket)
            self.pending[key] = self.pending.get(key, 0) + tokens
