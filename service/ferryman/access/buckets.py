"""Dynamic token buckets: how many one caller may bring into being.

A namespace with a ``dynamic_bucket_template`` makes a bucket for each new name it is asked
for, up to its ``max_dynamic_buckets``: one caller sending junk names could take them all,
and a real new user would be refused. With MAX_DYNAMIC_BUCKETS_PER_CALLER each caller (an
identity, or the address of a caller without one) may make at most that many per namespace
(a caller that makes buckets for all its users, one proxy say, needs a cap to match).
Names are bounded in length as well.
"""

from __future__ import annotations

from collections.abc import Iterable

from ferryman.stats import Stats

__all__ = ["MAX_BUCKET_NAME", "BucketCaps"]

#: The longest bucket name accepted (the quota service answers REJECTED_INVALID_REQUEST).
MAX_BUCKET_NAME = 128
CAPPED = "ferryman.access.capped.dynamic_buckets"


class BucketCaps:
    """The dynamic buckets each caller made, per namespace, and the cap on them."""

    def __init__(self, stats: Stats, most: int = 0) -> None:
        self._stats = stats
        self.most = most
        self._made: dict[tuple[str, str], set[str]] = {}

    def refuses(self, key: str, namespace: str, bucket: str) -> bool:
        """Whether asking for ``bucket`` may make one more bucket than ``key`` may make
        (counted when it does: the caller is answered REJECTED_TOO_MANY_BUCKETS)."""
        if not self.most:
            return False
        made = self._made.get((key, namespace))
        if made is None or bucket in made or len(made) < self.most:
            return False
        self._stats.inc(CAPPED)
        return True

    def record(
        self, key: str, namespace: str, bucket: str, created: bool, removed: Iterable[str]
    ) -> None:
        """After a take: the bucket ``key`` made, and those the store removed (idle)."""
        gone = set(removed)
        if gone:
            for (_, ns), made in list(self._made.items()):
                if ns == namespace:
                    made -= gone
            self._made = {k: v for k, v in self._made.items() if v}
        if created and self.most:
            self._made.setdefault((key, namespace), set()).add(bucket)
