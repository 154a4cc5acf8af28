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

from ferryman.core.nodes import Ctx, join, mapping, uint32
from ferryman.core.periods import Span, UnitPeriod, read_period
from ferryman.core.rules import UnitLimit, Unnamed

__all__ = ["KIND", "SlidingWindow", "read_sliding_fields", "read_sliding_window"]

KIND = "sliding_window"
_KEYS = frozenset({"unit", "window", "calendar", "requests_per_unit"})


@dataclass(frozen=True)
class SlidingWindow(Unnamed):
    """A sliding-window limit: ``rate`` hits per window (``rate.unit`` the unit Envoy is
    told), over ``period``."""

    rate: UnitLimit
    period: UnitPeriod | Span
    kind: ClassVar[str] = KIND

    @property
    def seconds(self) -> float:
        return self.period.seconds

    @property
    def micros(self) -> int:
        """The window's length in microseconds, as the stores count it."""
        return round(self.period.seconds * 1_000_000)


def read_sliding_window(ctx: Ctx, fields: Mapping[str, Node], path: str) -> SlidingWindow | None:
    """``sliding_window``: a unit or a window, and requests_per_unit, both required."""
    node = fields.get(KIND)
    if node is None:
        return None
    return read_sliding_fields(ctx, node, join(path, KIND))


def read_sliding_fields(ctx: Ctx, node: Node, path: str) -> SlidingWindow | None:
    """One sliding window's map at ``path``."""
    own = mapping(ctx, node, path, _KEYS)
    if not isinstance(node, MappingNode):
        return None
    before = len(ctx.problems)
    period = read_period(ctx, node, own, path, calendar=False)
    rpu = uint32(ctx, own.get("requests_per_unit"), join(path, "requests_per_unit"))
    if "requests_per_unit" not in own:
        ctx.error(node, path, "a sliding_window needs 'requests_per_unit'")
    if len(ctx.problems) > before or rpu is None or not isinstance(period, UnitPeriod | Span):
        return None
    return SlidingWindow(UnitLimit(rpu, period.unit), period)
