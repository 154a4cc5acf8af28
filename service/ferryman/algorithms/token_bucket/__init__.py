"""Token buckets with debt and waits (the quota service's Allow API).

``model`` decides, pure and clock-free; ``memory`` and ``redis`` are the two stores behind
the ``BucketStore`` Protocol, each making one atomic decision per request.
"""

from ferryman.algorithms.token_bucket.model import (
    BucketRef,
    BucketSpec,
    BucketState,
    BucketStore,
    Status,
    TakeResult,
    decide,
)

__all__ = [
    "BucketRef",
    "BucketSpec",
    "BucketState",
    "BucketStore",
    "Status",
    "TakeResult",
    "decide",
]
