"""``sliding_window`` on a descriptor node: ``{unit, requests_per_unit}``, both required.

```yaml
- key: ip
  sliding_window: {unit: minute, requests_per_unit: 100}
```
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from yaml.nodes import MappingNode, Node

from ferryman.core.nodes import Ctx, join, mapping, string, uint32
from ferryman.core.rules import Unit, UnitLimit, Unnamed

__all__ = ["KIND", "SlidingWindow", "read_sliding_window"]

KIND = "sliding_window"
_KEYS = frozenset({"unit", "requests_per_unit"})


@dataclass(frozen=True)
class SlidingWindow(Unnamed):
    """A sliding-window limit: ``rate`` hits per unit."""

    rate: UnitLimit
    kind: ClassVar[str] = KIND

    @property
    def seconds(self) -> int:
        assert self.rate.unit is not None
        return self.rate.unit.seconds


def read_sliding_window(ctx: Ctx, fields: Mapping[str, Node], path: str) -> SlidingWindow | None:
    """``sliding_window``: a unit and requests_per_unit, both required."""
    node = fields.get(KIND)
    if node is None:
        return None
    path = join(path, KIND)
    own = mapping(ctx, node, path, _KEYS)
    if not isinstance(node, MappingNode):
        return None
    before = len(ctx.problems)
    text = string(ctx, own.get("unit"), join(path, "unit"))
    rpu = uint32(ctx, own.get("requests_per_unit"), join(path, "requests_per_unit"))
    unit: Unit | None = None
    if not text:
        ctx.error(node, path, "missing 'unit' (second, minute, hour, day, week, month or year)")
    else:
        try:
            unit = Unit[text.upper()]
        except KeyError:
            ctx.error(own["unit"], join(path, "unit"), f"invalid unit {text!r}")
    if "requests_per_unit" not in own:
        ctx.error(node, path, "a sliding_window needs 'requests_per_unit'")
    if len(ctx.problems) > before or unit is None or rpu is None:
        return None
    return SlidingWindow(UnitLimit(rpu, unit))
