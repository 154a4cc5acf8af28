"""What the reference service (envoyproxy/ratelimit) does with one descriptor file: load it,
or refuse it and why. Told beside each problem ferryman finds, so that a file that does not
load says whether it would have loaded there.

The reference reads a file in three passes: every map key anywhere is checked against its
one list of key names (``REFERENCE_KEYS``), each list item must be a map and each value a
string, a whole number, a boolean or null (``metadata`` aside); then the file's first YAML
document is decoded into its fields (a null is the zero value, a key it does not read in a
place is ignored, a repeated key is read from its last place); then each descriptor is
checked (a key, a unique key and value, a valid unit unless unlimited, its replaces).
"""

from __future__ import annotations

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ferryman.core.nodes import BOOL, NULL, Ctx, go_int, join, mapping, reference_shape
from ferryman.core.rules import Unit

__all__ = ["reference_verdict"]

_UINT32 = 2**32 - 1
_SUFFIX = ": the reference refuses the file"


class _Refused(Exception):
    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"at {path}: {reason}" if path else reason)


def reference_verdict(root: Node | None) -> str | None:
    """Why the reference refuses the file whose first document is ``root`` (with the YAML
    path it stops at); None when it loads it."""
    try:
        _root(root)
    except _Refused as refused:
        return str(refused)
    return None


def _fields(node: Node, path: str, into: str) -> dict[str, Node]:
    """A map's keys as the reference decodes them (merges, last of a repeated key, nulls
    dropped); a value that is not a map cannot be decoded into ``into``."""
    if not isinstance(node, MappingNode):
        raise _Refused(path, f"cannot unmarshal {_shown(node)} into {into}")
    scratch = Ctx("", [])
    fields = mapping(scratch, node, path, reference=True)
    if scratch.problems:
        problem = scratch.problems[0]
        raise _Refused(problem.path, problem.message.removesuffix(_SUFFIX))
    return fields


def _shown(node: Node) -> str:
    if isinstance(node, MappingNode):
        return "!!map"
    if isinstance(node, SequenceNode):
        return "!!seq"
    return f"!!{node.tag.rsplit(':', 1)[-1]} `{getattr(node, 'value', '')}`"


def _string(node: Node | None, path: str) -> str:
    if node is None:
        return ""
    if not isinstance(node, ScalarNode):
        raise _Refused(path, f"cannot unmarshal {_shown(node)} into string")
    return "" if node.tag == NULL else str(node.value)


def _bool(node: Node | None, path: str) -> bool:
    if node is None:
        return False
    if isinstance(node, ScalarNode) and node.style is None and node.value in ("y", "Y", "n", "N"):
        return node.value in "yY"
    if not isinstance(node, ScalarNode) or node.tag != BOOL:
        raise _Refused(path, f"cannot unmarshal {_shown(node)} into bool")
    return node.value.lower() in ("true", "yes", "on", "y")


def _uint32(node: Node | None, path: str) -> int:
    if node is None:
        return 0
    value = go_int(node.value) if isinstance(node, ScalarNode) and node.style is None else None
    if value is None or not 0 <= value <= _UINT32:
        raise _Refused(path, f"cannot unmarshal {_shown(node)} into uint32")
    return value


def _list(node: Node | None, path: str, into: str) -> list[Node]:
    if node is None:
        return []
    if not isinstance(node, SequenceNode):
        raise _Refused(path, f"cannot unmarshal {_shown(node)} into []{into}")
    return list(node.value)


def _root(root: Node | None) -> None:
    if root is None:
        raise _Refused("", "config file cannot have empty domain")
    if not isinstance(root, MappingNode):
        raise _Refused("", f"cannot unmarshal {_shown(root)} into a map")
    shape = Ctx("", [])
    reference_shape(shape, root, "")
    if shape.problems:
        first = shape.problems[0]
        raise _Refused(first.path, first.message.removesuffix(_SUFFIX))
    fields = _fields(root, "", "YamlRoot")
    domain = _string(fields.get("domain"), "domain")
    descriptors = _list(fields.get("descriptors"), "descriptors", "YamlDescriptor")
    if not domain:
        raise _Refused("domain", "config file cannot have empty domain")
    _level(descriptors, "descriptors", domain + ".", frozenset())


def _level(items: list[Node], path: str, parent: str, within: frozenset[int]) -> None:
    seen: set[str] = set()
    for i, item in enumerate(items):
        ipath = f"{path}[{i}]"
        if id(item) in within:
            raise _Refused(ipath, "an anchor's value contains itself")
        fields = _fields(item, ipath, "YamlDescriptor")
        key = _string(fields.get("key"), join(ipath, "key"))
        value = _string(fields.get("value"), join(ipath, "value"))
        for flag in ("shadow_mode", "quota_mode", "detailed_metric", "value_to_metric"):
            _bool(fields.get(flag), join(ipath, flag))
        share = _bool(fields.get("share_threshold"), join(ipath, "share_threshold"))
        children = _list(fields.get("descriptors"), join(ipath, "descriptors"), "YamlDescriptor")
        if "metadata" in fields and not isinstance(fields["metadata"], MappingNode):
            raise _Refused(join(ipath, "metadata"), "cannot unmarshal metadata that is not a map")
        if not key:
            raise _Refused(ipath, "descriptor has empty key")
        final = f"{key}_{value}" if value else key
        if final in seen:
            raise _Refused(ipath, f"duplicate descriptor composite key '{parent}{final}'")
        seen.add(final)
        if "rate_limit" in fields:
            _rate_limit(fields["rate_limit"], join(ipath, "rate_limit"))
        if share and "*" not in final:
            raise _Refused(ipath, "share_threshold can only be used with wildcard values")
        _level(children, join(ipath, "descriptors"), f"{parent}{final}.", within | {id(item)})


def _rate_limit(node: Node, path: str) -> None:
    fields = _fields(node, path, "YamlRateLimit")
    _uint32(fields.get("requests_per_unit"), join(path, "requests_per_unit"))
    unit = _string(fields.get("unit"), join(path, "unit"))
    unlimited = _bool(fields.get("unlimited"), join(path, "unlimited"))
    name = _string(fields.get("name"), join(path, "name"))
    items = _list(fields.get("replaces"), join(path, "replaces"), "yamlReplaces")
    replaces = [
        _string(_fields(item, f"{path}.replaces[{i}]", "yamlReplaces").get("name"), "name")
        for i, item in enumerate(items)
    ]
    valid = unit.upper() in Unit.__members__
    if unlimited and valid:
        raise _Refused(path, "should not specify rate limit unit when unlimited")
    if not unlimited and not valid:
        raise _Refused(path, f"invalid rate limit unit '{unit}'")
    for replaced in replaces:
        if not replaced:
            raise _Refused(path, "should not have an empty replaces entry")
        if replaced == name:
            raise _Refused(path, "replaces should not contain name of same descriptor")
