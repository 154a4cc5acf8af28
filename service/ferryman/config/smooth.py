"""The smooth limits of a descriptor node: ``token_bucket`` (the quota service's bucket,
with the same keys as the quota YAML) and ``sliding_window``.

```yaml
- key: user
  token_bucket:
    size: 10                 # tokens the bucket holds (its burst)
    fill_rate: 5             # tokens per second
    max_debt_millis: 0       # borrowing allowed, in ms of fill (0: none)
    wait_timeout_millis: 0   # the longest wait a ferryman.v1 caller may be given
  - key: ip
    sliding_window: {unit: minute, requests_per_unit: 100}
```

A node bucket starts full; each hit takes a token. Envoy cannot wait, so ShouldRateLimit
never waits: its descriptor is over the limit when the bucket lacks the tokens (beyond the
allowed debt). Defaults differ from the quota YAML's where a node's caller cannot wait:
debt and waits are off unless set.
"""

from __future__ import annotations

from yaml.nodes import MappingNode, Node

from ferryman.algorithms.token_bucket.model import BucketSpec
from ferryman.config.model import RateLimit, Rule, Unit
from ferryman.config.nodes import Ctx, join, mapping, number, string, uint32, whole

__all__ = [
    "NODE_BUCKET_KEYS",
    "SLIDING_KEYS",
    "describe_smooth",
    "read_node_bucket",
    "read_sliding_window",
]

SLIDING_KEYS = frozenset({"unit", "requests_per_unit"})
NODE_BUCKET_KEYS = frozenset({"size", "fill_rate", "max_debt_millis", "wait_timeout_millis"})
_MAX = 2**32 - 1


def read_node_bucket(ctx: Ctx, node: Node | None, path: str) -> BucketSpec | None:
    """``token_bucket`` on a node: size and fill_rate required, positive."""
    if node is None:
        return None
    fields = mapping(ctx, node, path, NODE_BUCKET_KEYS)
    if not isinstance(node, MappingNode):
        return None
    before = len(ctx.problems)
    size = whole(ctx, fields.get("size"), join(path, "size"), 1, _MAX)
    rate = number(ctx, fields.get("fill_rate"), join(path, "fill_rate"), 0.0, 1e9)
    debt = whole(ctx, fields.get("max_debt_millis"), join(path, "max_debt_millis"), 0, _MAX)
    wait = whole(ctx, fields.get("wait_timeout_millis"), join(path, "wait_timeout_millis"), 0, _MAX)
    for name in ("size", "fill_rate"):
        if name not in fields:
            ctx.error(node, path, f"a token_bucket needs '{name}'")
    if rate is not None and rate <= 0:
        ctx.error(fields["fill_rate"], join(path, "fill_rate"), "fill_rate must be positive")
    if len(ctx.problems) > before or size is None or rate is None:
        return None
    return BucketSpec(
        size=size,
        fill_rate=rate,
        wait_timeout_millis=wait or 0,
        max_debt_millis=debt or 0,
        max_tokens_per_request=float(size),
    )


def read_sliding_window(ctx: Ctx, node: Node | None, path: str) -> RateLimit | None:
    """``sliding_window``: a unit and requests_per_unit, both required."""
    if node is None:
        return None
    fields = mapping(ctx, node, path, SLIDING_KEYS)
    if not isinstance(node, MappingNode):
        return None
    before = len(ctx.problems)
    text = string(ctx, fields.get("unit"), join(path, "unit"))
    rpu = uint32(ctx, fields.get("requests_per_unit"), join(path, "requests_per_unit"))
    unit: Unit | None = None
    if not text:
        ctx.error(node, path, "missing 'unit' (second, minute, hour, day, week, month or year)")
    else:
        try:
            unit = Unit[text.upper()]
        except KeyError:
            ctx.error(fields["unit"], join(path, "unit"), f"invalid unit {text!r}")
    if "requests_per_unit" not in fields:
        ctx.error(node, path, "a sliding_window needs 'requests_per_unit'")
    if len(ctx.problems) > before or unit is None or rpu is None:
        return None
    return RateLimit(rpu, unit)


def describe_smooth(rule: Rule) -> tuple[str, str] | None:
    """(kind, numbers) of a node's smooth limit, for ``ferryman check`` and the console;
    None for any other node."""
    spec = rule.token_bucket
    if spec is not None:
        return "token_bucket", (
            f"token bucket size {spec.size}, {spec.fill_rate:g}/s, "
            f"debt {spec.max_debt_millis}ms, waits {spec.wait_timeout_millis}ms"
        )
    window = rule.sliding_window
    if window is not None and window.unit is not None:
        unit = window.unit.name.lower()
        return "sliding_window", f"sliding window {window.requests_per_unit} per {unit}"
    return None
