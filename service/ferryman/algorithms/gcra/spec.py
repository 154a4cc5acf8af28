"""``gcra`` on a descriptor node: ``rate`` requests per ``per``, ``burst`` of them at once.

```yaml
- key: user
  gcra: {rate: 10, per: 1s, burst: 20}   # burst defaults to 1; optional name
```
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from yaml.nodes import MappingNode, Node

from ferryman.algorithms.gcra.model import SPAN_MAX, GcraParams
from ferryman.core.nodes import Ctx, duration, join, mapping, string, uint32

__all__ = ["KIND", "Gcra", "read_gcra"]

KIND = "gcra"
_KEYS = frozenset({"rate", "per", "burst", "name"})


@dataclass(frozen=True)
class Gcra:
    """A GCRA limit: ``rate`` per ``per`` seconds, ``burst`` at once; ``params`` the same
    in whole numbers, as the stores take them."""

    rate: int
    per: float
    burst: int
    name: str = ""
    params: GcraParams = field(init=False, compare=False, repr=False)
    kind: ClassVar[str] = KIND

    def __post_init__(self) -> None:
        params = GcraParams.of(self.rate, round(self.per * 1_000_000), self.burst)
        object.__setattr__(self, "params", params)

    @property
    def replaces(self) -> tuple[str, ...]:
        return ()


def read_gcra(ctx: Ctx, fields: Mapping[str, Node], path: str) -> Gcra | None:
    """``gcra: {rate, per, burst, name}``: rate and per required and positive, burst at
    least 1 (1 when absent)."""
    node = fields.get(KIND)
    if node is None:
        return None
    path = join(path, KIND)
    own = mapping(ctx, node, path, _KEYS)
    if not isinstance(node, MappingNode):
        return None
    before = len(ctx.problems)
    rate = uint32(ctx, own.get("rate"), join(path, "rate"))
    per = duration(ctx, own.get("per"), join(path, "per"))
    burst = uint32(ctx, own.get("burst"), join(path, "burst"))
    name = string(ctx, own.get("name"), join(path, "name"))
    for key in ("rate", "per"):
        if key not in own:
            ctx.error(node, path, f"a gcra needs '{key}'")
    if rate == 0:
        ctx.error(own["rate"], join(path, "rate"), "rate must be positive")
    if per is not None and _micros(per) <= 0:
        ctx.error(own["per"], join(path, "per"), "per must be positive (1us at least)")
    if burst == 0:
        ctx.error(own["burst"], join(path, "burst"), "burst must be at least 1")
    if len(ctx.problems) > before or rate is None or per is None:
        return None
    limit = Gcra(rate, _micros(per) / 1e6, 1 if burst is None else burst, name)
    if limit.params.span > SPAN_MAX:
        ctx.error(
            node,
            path,
            f"burst {limit.burst} at {rate} per {per:g}s is too large to decide exactly "
            "(lower the burst, or use a rate that divides per in whole microseconds)",
        )
        return None
    return limit


def _micros(seconds: float) -> int:
    return round(seconds * 1_000_000)
