"""Token bucket configuration in the quota service's YAML shape (a file kind of its own).

A file whose root map has ``namespaces`` or ``global_default_bucket`` is a quota file::

    global_default_bucket: {size: 100, fill_rate: 50}
    namespaces:
      payments:
        default_bucket: {size: 20, fill_rate: 10}     # or dynamic_bucket_template, not both
        max_dynamic_buckets: 0                        # with a template; 0: no limit
        buckets:
          refunds: {size: 10, fill_rate: 1, wait_timeout_millis: 500}

At most one quota file per configuration directory.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from yaml.nodes import MappingNode, Node, ScalarNode

from ferryman.algorithms.token_bucket.model import (
    DEFAULT_BUCKET,
    GLOBAL_NAMESPACE,
    BucketRef,
    BucketSpec,
)
from ferryman.core.nodes import Ctx, compose, is_null, join, mapping, number, whole

__all__ = ["NAME", "QUOTA_KEYS", "Namespace", "QuotaConfig", "is_quota_file", "read_quota"]

NAME = re.compile(r"[a-zA-Z0-9_]+")
QUOTA_KEYS = frozenset({"global_default_bucket", "namespaces"})
_NAMESPACE_KEYS = frozenset(
    {"default_bucket", "dynamic_bucket_template", "max_dynamic_buckets", "buckets"}
)
_BUCKET_KEYS = frozenset(
    {
        "size",
        "fill_rate",
        "wait_timeout_millis",
        "max_debt_millis",
        "max_tokens_per_request",
        "max_idle_millis",
    }
)


@dataclass(frozen=True)
class Namespace:
    name: str
    default_bucket: BucketSpec | None = None
    dynamic_bucket_template: BucketSpec | None = None
    max_dynamic_buckets: int = 0
    buckets: Mapping[str, BucketSpec] = field(default_factory=dict)


@dataclass(frozen=True)
class QuotaConfig:
    """Every bucket of the quota file, and the lookup of a (namespace, bucket) pair."""

    file: str
    global_default_bucket: BucketSpec | None = None
    namespaces: Mapping[str, Namespace] = field(default_factory=dict)

    def lookup(self, namespace: str, name: str) -> tuple[BucketRef, BucketSpec] | None:
        """The named bucket; else a dynamic one from the namespace's template; else the
        namespace's default bucket; else the global default bucket; else None."""
        ns = self.namespaces.get(namespace)
        if ns is not None:
            spec = ns.buckets.get(name)
            if spec is not None:
                return BucketRef(namespace, name), spec
            if ns.dynamic_bucket_template is not None:
                ref = BucketRef(namespace, name, True, ns.max_dynamic_buckets)
                return ref, ns.dynamic_bucket_template
            if ns.default_bucket is not None:
                return BucketRef(namespace, DEFAULT_BUCKET), ns.default_bucket
        if self.global_default_bucket is not None:
            return BucketRef(GLOBAL_NAMESPACE, DEFAULT_BUCKET), self.global_default_bucket
        return None

    def describe(self) -> list[str]:
        """One line per bucket, for ``ferryman check``."""
        lines = []
        if self.global_default_bucket is not None:
            lines.append(f"quota global_default_bucket: {_show(self.global_default_bucket)}")
        for ns in self.namespaces.values():
            if ns.default_bucket is not None:
                lines.append(f"quota {ns.name}.default_bucket: {_show(ns.default_bucket)}")
            if ns.dynamic_bucket_template is not None:
                limit = ns.max_dynamic_buckets or "unlimited"
                lines.append(
                    f"quota {ns.name}.dynamic_bucket_template: "
                    f"{_show(ns.dynamic_bucket_template)}, max_dynamic_buckets={limit}"
                )
            for name, spec in ns.buckets.items():
                lines.append(f"quota {ns.name}.{name}: {_show(spec)}")
        return lines


def _show(spec: BucketSpec) -> str:
    return (
        f"size={spec.size} fill_rate={spec.fill_rate:g} "
        f"wait_timeout_millis={spec.wait_timeout_millis} "
        f"max_debt_millis={spec.max_debt_millis} max_tokens_per_request={spec.max_tokens:g} "
        f"max_idle_millis={spec.max_idle_millis}"
    )


def is_quota_file(text: str) -> bool:
    """Whether ``text`` is a quota file: its root map has one of the quota keys. A file
    that does not parse is not (the descriptor reader reports its syntax error)."""
    if not any(key in text for key in QUOTA_KEYS):
        return False  # most files: no second parse
    root = compose(Ctx("", []), text)
    if not isinstance(root, MappingNode):
        return False
    return any(isinstance(k, ScalarNode) and k.value in QUOTA_KEYS for k, _ in root.value)


def _name(ctx: Ctx, node: Node, path: str, name: str) -> bool:
    if NAME.fullmatch(name):
        return True
    ctx.error(node, path, f"name {name!r} must match [a-zA-Z0-9_]+")
    return False


def _bucket(ctx: Ctx, node: Node, path: str) -> BucketSpec | None:
    if is_null(node):
        return BucketSpec()
    fields = mapping(ctx, node, path, _BUCKET_KEYS)
    if not isinstance(node, MappingNode):
        return None
    before = len(ctx.problems)
    d = BucketSpec()
    size = whole(ctx, fields.get("size"), join(path, "size"))
    fill_rate = number(ctx, fields.get("fill_rate"), join(path, "fill_rate"))
    wait = whole(ctx, fields.get("wait_timeout_millis"), join(path, "wait_timeout_millis"))
    debt = whole(ctx, fields.get("max_debt_millis"), join(path, "max_debt_millis"))
    per_request = whole(
        ctx, fields.get("max_tokens_per_request"), join(path, "max_tokens_per_request")
    )
    idle = whole(ctx, fields.get("max_idle_millis"), join(path, "max_idle_millis"), minimum=-1)
    if len(ctx.problems) > before:
        return None
    return BucketSpec(
        size=d.size if size is None else size,
        fill_rate=d.fill_rate if fill_rate is None else fill_rate,
        wait_timeout_millis=d.wait_timeout_millis if wait is None else wait,
        max_debt_millis=d.max_debt_millis if debt is None else debt,
        max_tokens_per_request=None if per_request is None else float(per_request),
        max_idle_millis=d.max_idle_millis if idle is None else idle,
    )


def _namespace(ctx: Ctx, name: str, node: Node, path: str) -> Namespace | None:
    if is_null(node):
        return Namespace(name)
    fields = mapping(ctx, node, path, _NAMESPACE_KEYS)
    if not isinstance(node, MappingNode):
        return None
    default = template = None
    if "default_bucket" in fields:
        default = _bucket(ctx, fields["default_bucket"], join(path, "default_bucket"))
    if "dynamic_bucket_template" in fields:
        template_path = join(path, "dynamic_bucket_template")
        template = _bucket(ctx, fields["dynamic_bucket_template"], template_path)
        if "default_bucket" in fields:
            ctx.error(
                fields["dynamic_bucket_template"],
                template_path,
                "a namespace may have a default_bucket or a dynamic_bucket_template, not both",
            )
    limit_path = join(path, "max_dynamic_buckets")
    limit = whole(ctx, fields.get("max_dynamic_buckets"), limit_path) or 0
    buckets: dict[str, BucketSpec] = {}
    buckets_node = fields.get("buckets")
    if buckets_node is not None and not is_null(buckets_node):
        buckets_path = join(path, "buckets")
        entries = mapping(ctx, buckets_node, buckets_path)
        for bucket_name, bucket_node in entries.items():
            bucket_path = join(buckets_path, bucket_name)
            if not _name(ctx, bucket_node, bucket_path, bucket_name):
                continue
            spec = _bucket(ctx, bucket_node, bucket_path)
            if spec is not None:
                buckets[bucket_name] = spec
    return Namespace(name, default, template, limit, buckets)


def read_quota(ctx: Ctx, text: str) -> QuotaConfig | None:
    """The quota file ``text`` (named by ``ctx``), or None with its problems in ``ctx``."""
    root = compose(ctx, text)
    if root is None:
        return None
    before = len(ctx.problems)
    fields = mapping(ctx, root, "", QUOTA_KEYS)
    global_default = None
    if "global_default_bucket" in fields:
        global_default = _bucket(ctx, fields["global_default_bucket"], "global_default_bucket")
    namespaces: dict[str, Namespace] = {}
    ns_node = fields.get("namespaces")
    if ns_node is not None and not is_null(ns_node):
        for name, node in mapping(ctx, ns_node, "namespaces").items():
            path = join("namespaces", name)
            if not _name(ctx, node, path, name):
                continue
            namespace = _namespace(ctx, name, node, path)
            if namespace is not None:
                namespaces[name] = namespace
    if len(ctx.problems) > before:
        return None
    return QuotaConfig(ctx.file, global_default, namespaces)
