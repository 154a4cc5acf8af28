"""The console's panel of token buckets as they stand: the buckets each store took from
lately (it remembers the last few hundred), read now without taking anything, the
emptiest first. A bucket in debt shows negative tokens and the wait its debt makes."""

from __future__ import annotations

import asyncio
from typing import Any

from ferryman.algorithms.token_bucket import TOKEN_BUCKET
from ferryman.algorithms.token_bucket.model import (
    BucketSpec,
    BucketStore,
    NodeBucketStore,
    Standing,
    quota_label,
)
from ferryman.backends.base import Backend
from ferryman.clock import Clock

__all__ = ["COLUMNS", "TOP", "BucketTable", "node_label"]

TOP = 20  # rows shown
COLUMNS = ["bucket", "kind", "tokens", "capacity", "fill rate /s", "debt wait ms"]


def node_label(key: str) -> str:
    """A descriptor node bucket's key as ``<stats key>|<the request's values>``."""
    _, sep, rest = key.partition("ferryman_bucket_{")
    return (rest if sep else key).removesuffix("}")


def _row(label: str, kind: str, spec: BucketSpec, now: Standing) -> list[Any]:
    owed = now.debt_us * spec.fill_rate / 1e6  # tokens borrowed from the future
    tokens = now.stored - owed
    return [
        label,
        kind,
        round(tokens, 1),
        spec.size,
        round(spec.fill_rate, 3),
        round(now.debt_us / 1000),
    ]


class BucketTable:
    """The console panel of token buckets: the quota service's buckets and the descriptor
    nodes' ones, at most ``top`` rows, the emptiest (most in debt) first."""

    def __init__(
        self, quota: BucketStore, nodes: NodeBucketStore, clock: Clock, top: int = TOP
    ) -> None:
        self.quota = quota
        self.nodes = nodes
        self.clock = clock
        self.top = top

    @classmethod
    def of(cls, quota: BucketStore, backend: Backend, clock: Clock) -> BucketTable:
        """The table of the quota service's buckets and ``backend``'s node buckets."""
        return cls(quota, backend.store(TOKEN_BUCKET.name), clock)

    async def read(self) -> dict[str, Any]:
        refs = self.quota.recent.items()
        keys = self.nodes.recent.items()
        now = self.clock.now()
        answers = await asyncio.gather(
            *(self.quota.peek(ref, spec) for ref, spec in refs),
            *(self.nodes.peek(key, spec, now) for key, spec in keys),
            return_exceptions=True,
        )
        rows: list[list[Any]] = []
        failed = 0
        for (ref, spec), got in zip(refs, answers[: len(refs)], strict=True):
            if isinstance(got, BaseException):
                failed += 1
            elif got is None:
                self.quota.recent.discard(ref)  # a dynamic bucket removed while idle
            else:
                kind = "quota, dynamic" if ref.dynamic else "quota"
                rows.append(_row(quota_label(ref), kind, spec, got))
        for (key, spec), got in zip(keys, answers[len(refs) :], strict=True):
            if isinstance(got, Standing):
                rows.append(_row(node_label(key), "descriptor", spec, got))
            else:
                failed += 1
        rows.sort(key=lambda r: (r[2] / r[3] if r[3] else 0.0, -r[5], r[0]))
        note = f"{len(rows)} bucket(s) taken from lately on this server"
        if len(rows) > self.top:
            note += f", the {self.top} emptiest shown"
        if failed:
            note += f"; {failed} could not be read"
        note += "; negative tokens are debt, to be waited for"
        return {"columns": COLUMNS, "rows": rows[: self.top], "note": note}
