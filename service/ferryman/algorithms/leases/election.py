"""Which replica is master: always this one on memory, one at a time through Redis.

Through Redis the master holds a key (``SET NX PX``; the value is its address and a
nonce of this process, so two replicas advertising one address never share a term) for a
bounded term and renews it (a compare-and-renew script) every third of the term. It counts
itself master only until the term it last renewed would end, measured from before the
renewal was sent, so it steps down before any other replica can take the key over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from importlib import resources
from typing import Any, Protocol

from ferryman.tasks import cancel

__all__ = ["Election", "MemoryElection", "RedisElection"]

log = logging.getLogger("ferryman.capacity")

OnChange = Callable[[bool], None]


class Election(Protocol):
    @property
    def is_master(self) -> bool: ...

    @property
    def master_address(self) -> str:
        """The master's advertised address; empty while none is known."""
        ...

    async def start(self, on_change: OnChange) -> None: ...

    async def stop(self) -> None: ...


class MemoryElection:
    """A single server: master from the start."""

    def __init__(self, address: str) -> None:
        self._address = address

    @property
    def is_master(self) -> bool:
        return True

    @property
    def master_address(self) -> str:
        return self._address

    async def start(self, on_change: OnChange) -> None:
        on_change(True)

    async def stop(self) -> None:
        return None


class RedisElection:
    """One master among the replicas sharing a Redis; ``client`` is a redis.asyncio client."""

    def __init__(
        self, client: Any, key: str, address: str, term: float, also_close: tuple[Any, ...] = ()
    ) -> None:
        self._client = client
        self._also_close = also_close
        self._key = key
        self._address = address
        self._value = f"{address} {uuid.uuid4().hex}"
        self._term = term
        self._term_ms = max(1, round(term * 1000))
        self._renew = client.register_script(
            resources.files(__package__).joinpath("renew_master.lua").read_text("utf-8")
        )
        self._master = False
        self._valid_until = 0.0  # monotonic
        self._known_master = ""
        self._on_change: OnChange = lambda master: None
        self._task: asyncio.Task[None] | None = None

    @property
    def is_master(self) -> bool:
        return self._master and time.monotonic() < self._valid_until

    @property
    def master_address(self) -> str:
        return self._address if self.is_master else self._known_master

    async def start(self, on_change: OnChange) -> None:
        self._on_change = on_change
        await self._round()
        self._task = asyncio.create_task(self._run(), name="ferryman-election")

    async def stop(self) -> None:
        await cancel(self._task)
        self._task = None
        if self._master:
            # Hand over at once rather than making the others wait out the term.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await self._resign()
            self._set(False)
        for client in (self._client, *self._also_close):
            with contextlib.suppress(Exception):
                await client.aclose()

    async def _resign(self) -> None:
        await self._renew(keys=[self._key], args=[self._value, 1])

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._term / 3)
            await self._round()

    async def _round(self) -> None:
        started = time.monotonic()
        try:
            if self._master:
                if await self._renew(keys=[self._key], args=[self._value, self._term_ms]):
                    self._valid_until = started + self._term
                else:
                    log.warning("capacity: lost mastership (%s holds it now)", self._key)
                    self._set(False)
            if not self._master:
                taken = await self._client.set(self._key, self._value, nx=True, px=self._term_ms)
                if taken:
                    self._valid_until = started + self._term
                    self._set(True)
                else:
                    holder = await self._client.get(self._key)
                    value = holder.decode() if isinstance(holder, bytes) else ""
                    self._known_master = value.rpartition(" ")[0] if " " in value else value
        except Exception as exc:  # any Redis or network failure: the term decides
            log.warning("capacity: election round failed: %s", exc)
            if self._master and time.monotonic() >= self._valid_until:
                self._set(False)
            if not self._master:
                self._known_master = ""

    def _set(self, master: bool) -> None:
        if master == self._master:
            return
        self._master = master
        if master:
            log.warning("capacity: this server (%s) is now master", self._address)
        else:
            self._valid_until = 0.0
        self._on_change(master)


def redis_client(target: Any, timeout: float) -> tuple[Any, tuple[Any, ...]]:
    """A redis.asyncio client for the election, to the deployment ``target`` (a RedisTarget)
    describes, and the clients to close with it (a Sentinel's); commands time out after
    ``timeout`` seconds so a round never outlives a term."""
    import redis.asyncio as aioredis
    from redis.asyncio.cluster import ClusterNode
    from redis.asyncio.sentinel import Sentinel

    common: dict[str, Any] = {
        "username": target.username,
        "password": target.password,
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
    }
    if target.kind == "cluster":
        nodes = [ClusterNode(h, p) for h, p in target.addresses]
        return aioredis.RedisCluster(startup_nodes=nodes, ssl=target.tls, **common), ()
    if target.kind == "sentinel":
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            list(target.addresses), sentinel_kwargs={"socket_timeout": timeout}, ssl=target.tls
        )
        master = sentinel.master_for(target.master_name, **common)
        return master, tuple(sentinel.sentinels)
    if target.unix_path:
        return aioredis.Redis(unix_socket_path=target.unix_path, db=target.db, **common), ()
    host, port = target.addresses[0]
    return aioredis.Redis(host=host, port=port, db=target.db, ssl=target.tls, **common), ()
