"""``rate_limits`` on a descriptor node: several limits at once, e.g. 10 per second and
1,000 per day. Each item is a fixed window (``{unit | window | calendar,
requests_per_unit}``, as ``rate_limit``) or a map naming another kind that can be one
(``{sliding_window: {...}}``); any item may have a ``name`` (its stats and what another
rule's ``replaces`` names) and ``replaces``.

```yaml
- key: user
  rate_limits:
    - {name: burst, unit: second, requests_per_unit: 10}
    - {name: daily, calendar: {unit: day, time_zone: Europe/Berlin}, requests_per_unit: 1000}
    - sliding_window: {window: 15m, requests_per_unit: 200}
```
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from yaml.nodes import MappingNode, Node, SequenceNode

from ferryman.core.algorithm import Algorithm, Stepper
from ferryman.core.nodes import Ctx, join, kind, mapping, read_replaces, string
from ferryman.core.rules import Limit, UnitLimit

__all__ = ["KIND", "LimitList", "ListedLimit", "read_limits"]

KIND = "limit_list"
KEY = "rate_limits"
MAX_ITEMS = 8


@dataclass(frozen=True)
class ListedLimit:
    """One limit of the list: the kind's own limit, its decision as a step, its name (or
    the kind and position when it has none) and the names it replaces."""

    limit: Limit
    stepper: Stepper
    name: str
    named: bool
    replaces: tuple[str, ...]
    reported: UnitLimit  # as Envoy is told it, with the item's name


@dataclass(frozen=True)
class LimitList:
    """A node's limits: a request passes only if it fits every one, and is counted in all
    or none."""

    items: tuple[ListedLimit, ...]
    kind: ClassVar[str] = KIND

    @property
    def name(self) -> str:
        return ""

    @property
    def replaces(self) -> tuple[str, ...]:
        return tuple(name for item in self.items for name in item.replaces)

    @property
    def names(self) -> frozenset[str]:
        """The names other rules' ``replaces`` may give to drop one of these limits."""
        return frozenset(item.name for item in self.items if item.named)


#: Reads an item that names no kind (the plain kind's map) at a path.
ReadPlain = Callable[[Ctx, Node, str], Any]


def read_limits(
    ctx: Ctx,
    fields: Mapping[str, Node],
    path: str,
    kinds: Sequence[Algorithm],
    plain: tuple[Algorithm, ReadPlain],
) -> LimitList | None:
    """The list at ``rate_limits``: ``kinds`` are the registered kinds (those with a
    stepper may be items, each under its first key), ``plain`` the kind of an item that
    names none (the fixed window) and its reader."""
    node = fields.get(KEY)
    if node is None:
        return None
    path = join(path, KEY)
    if not isinstance(node, SequenceNode) or not node.value:
        ctx.error(node, path, f"expected a list of limits, found {kind(node)}")
        return None
    if len(node.value) > MAX_ITEMS:
        ctx.error(node, path, f"at most {MAX_ITEMS} limits on one node")
        return None
    before = len(ctx.problems)
    items = [_item(ctx, item, f"{path}[{i}]", i, kinds, plain) for i, item in enumerate(node.value)]
    names = [item.name for item in items if item is not None and item.named]
    for name in {n for n in names if names.count(n) > 1}:
        ctx.error(node, path, f"two limits are named {name!r}")
    if len(ctx.problems) > before:
        return None
    return LimitList(tuple(item for item in items if item is not None))


def _item(
    ctx: Ctx,
    node: Node,
    path: str,
    index: int,
    kinds: Sequence[Algorithm],
    plain: tuple[Algorithm, ReadPlain],
) -> ListedLimit | None:
    if not isinstance(node, MappingNode):
        ctx.error(node, path, f"expected a map, found {kind(node)}")
        return None
    keys = {str(k.value) for k, _ in node.value}
    named = [a for a in kinds if a is not plain[0] and a.keys[0] in keys]
    if not named:
        limit = plain[1](ctx, node, path)
        return _listed(ctx, node, path, index, plain[0], limit, None, None)
    algorithm = named[0]
    own = mapping(ctx, node, path, frozenset({algorithm.keys[0], "name", "replaces"}))
    limit = algorithm.parse(ctx, {algorithm.keys[0]: own[algorithm.keys[0]]}, path)
    return _listed(ctx, node, path, index, algorithm, limit, own.get("name"), own.get("replaces"))


def _listed(
    ctx: Ctx,
    node: Node,
    path: str,
    index: int,
    algorithm: Algorithm,
    limit: Any,
    name_node: Node | None,
    replaces_node: Node | None,
) -> ListedLimit | None:
    if limit is None:
        return None
    stepper = algorithm.stepper(limit)
    if stepper is None:
        ctx.error(node, path, f"a {algorithm.name.replace('_', ' ')} cannot be one of a list")
        return None
    name = limit.name or string(ctx, name_node, join(path, "name"))
    replaces = limit.replaces
    if replaces_node is not None:
        replaces = read_replaces(ctx, replaces_node, join(path, "replaces"), name)
    shown = name or f"{algorithm.name}_{index}"
    reported = stepper.reported
    if name and reported.name != name:
        reported = replace(reported, name=name)
    return ListedLimit(limit, stepper, shown, bool(name), replaces, reported)
