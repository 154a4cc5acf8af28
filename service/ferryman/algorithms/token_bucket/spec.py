"""``token_bucket`` on a descriptor node: the quota service's bucket, with the same keys as
the quota YAML.

```yaml
- key: user
  token_bucket:
    size: 10                 # tokens the bucket holds (its burst)
    fill_rate: 5             # tokens per second
    max_debt_millis: 0       # borrowing allowed, in ms of fill (0: none)
    wait_timeout_millis: 0   # the longest wait a ferryman.v1 caller may be given
```

A node bucket starts full; each hit takes a token. Envoy cannot wait, so ShouldRateLimit
never waits: its descriptor is over the limit when the bucket lacks the tokens (beyond the
allowed debt). Defaults differ from the quota YAML's where a node's caller cannot wait:
debt and waits are off unless set.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from yaml.nodes import MappingNode, Node

from ferryman.algorithms.token_bucket.model import BucketSpec
from ferryman.core.nodes import Ctx, join, mapping, number, whole
from ferryman.core.rules import Unnamed

__all__ = ["KIND", "NodeBucket", "read_node_bucket"]

KIND = "token_bucket"
_KEYS = frozenset({"size", "fill_rate", "max_debt_millis", "wait_timeout_millis"})
_MAX = 2**32 - 1


@dataclass(frozen=True)
class NodeBucket(Unnamed):
    """A descriptor node's token bucket (``spec``: size, fill rate, debt, waits)."""

    spec: BucketSpec
    kind: ClassVar[str] = KIND


def read_node_bucket(ctx: Ctx, fields: Mapping[str, Node], path: str) -> NodeBucket | None:
    """``token_bucket`` on a node: size and fill_rate required, positive."""
    node = fields.get(KIND)
    if node is None:
        return None
    path = join(path, KIND)
    own = mapping(ctx, node, path, _KEYS)
    if not isinstance(node, MappingNode):
        return None
    before = len(ctx.problems)
    size = whole(ctx, own.get("size"), join(path, "size"), 1, _MAX)
    rate = number(ctx, own.get("fill_rate"), join(path, "fill_rate"), 0.0, 1e9)
    debt = whole(ctx, own.get("max_debt_millis"), join(path, "max_debt_millis"), 0, _MAX)
    wait = whole(ctx, own.get("wait_timeout_millis"), join(path, "wait_timeout_millis"), 0, _MAX)
    for name in ("size", "fill_rate"):
        if name not in own:
            ctx.error(node, path, f"a token_bucket needs '{name}'")
    if rate is not None and rate <= 0:
        ctx.error(own["fill_rate"], join(path, "fill_rate"), "fill_rate must be positive")
    if len(ctx.problems) > before or size is None or rate is None:
        return None
    spec = BucketSpec(
        size=size,
        fill_rate=rate,
        wait_timeout_millis=wait or 0,
        max_debt_millis=debt or 0,
        max_tokens_per_request=float(size),
    )
    return NodeBucket(spec)
