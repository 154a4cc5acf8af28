"""Why a request is limited (or not): the walk of each descriptor through its domain's tree,
the rule it reaches, what ``replaces`` removes, and the counter, bucket or sliding window it
would count in, worked out without counting anything."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ferryman.algorithms.fixed_window.model import CounterOp, reset_after, window_start
from ferryman.algorithms.sliding_window.model import SlidingResult
from ferryman.algorithms.token_bucket.model import BucketSpec, Standing
from ferryman.config.model import Config, Level, Rule
from ferryman.engine.buckets import BucketLimiter
from ferryman.engine.matcher import cache_key, stats_key
from ferryman.engine.model import EngineOptions
from ferryman.engine.policy import (
    BucketNode,
    BurstNode,
    CopiesNode,
    LeasedNode,
    Plain,
    Policy,
    SlidingNode,
    Unlimited,
    Window,
)
from ferryman.engine.policy import policies as build_policies
from ferryman.engine.sliding import SlidingLimiter
from ferryman.engine.validate import check_descriptor
from ferryman.errors import RequestError

__all__ = [
    "Explanation",
    "SlidingRead",
    "describe_rule",
    "explain",
    "now_text",
    "parse_descriptor",
    "render",
    "rule_text",
]


def parse_descriptor(text: str) -> list[tuple[str, str]]:
    """``k=v[,k=v...]`` as entries; RequestError when a part is not ``key=value``."""
    entries = []
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise RequestError("descriptor", f"{part!r} is not key=value (in {text!r})")
        entries.append((key, value))
    return entries


def _offered(level: Level) -> list[str]:
    """What a level of the tree matches, as ``key=value``, ``key=pattern*`` or bare ``key``."""
    return [f"{r.key}={r.value}" if r.value else r.key for r in level.rules]


def _step(level: Level, key: str, value: str) -> tuple[Rule | None, dict[str, Any]]:
    """One level of the walk: the rule found and how (exact, wildcard, bare key) or why not."""
    step: dict[str, Any] = {"key": key, "value": value}
    rule = level.exact.get((key, value))
    if rule is not None:
        step["matched"] = "exact"
    else:
        tried = []
        for pattern, candidate in level.wildcards.get(key, ()):
            if pattern.fullmatch(value):
                rule = candidate
                step["matched"] = "wildcard"
                step["pattern"] = candidate.value
                break
            tried.append(candidate.value)
        if tried:
            step["wildcards_not_matching"] = tried
        if rule is None:
            rule = level.bare.get(key)
            if rule is not None:
                step["matched"] = "bare key"
    if rule is None:
        step["matched"] = None
        step["expected"] = _offered(level)
        return None, step
    step["rule"] = rule.stats_key
    step["source"] = rule.source
    return rule, step


def describe_rule(policy: Policy | None, rule: Rule) -> dict[str, Any]:
    """A rule as plain data: its kind (fixed_window, burst_tiers, copies...) and numbers."""
    out: dict[str, Any] = {
        "stats_key": rule.stats_key,
        "source": rule.source,
        "shadow_mode": rule.shadow_mode,
        "quota_mode": rule.quota_mode,
    }
    if isinstance(policy, Plain | Window):
        limit = policy.limit
        assert limit.unit is not None
        out.update(
            kind="fixed_window",
            requests_per_unit=limit.requests_per_unit,
            unit=limit.unit.name.lower(),
            name=limit.name or None,
            replaces=list(limit.replaces),
        )
    elif isinstance(policy, Unlimited):
        out.update(kind="unlimited", name=rule.rate_limit.name if rule.rate_limit else None)
    elif isinstance(policy, BurstNode):
        assert rule.burst is not None
        out.update(
            kind="burst_tiers",
            tiers=rule.burst.describe(),
            name=rule.name or None,
            replaces=list(rule.replaces),
        )
    elif isinstance(policy, CopiesNode):
        assert rule.copies is not None
        out.update(kind="copies", copies=rule.copies.describe())
    elif isinstance(policy, BucketNode):
        spec = rule.token_bucket
        assert spec is not None
        out.update(
            kind="token_bucket",
            size=spec.size,
            fill_rate=spec.fill_rate,
            max_debt_millis=spec.max_debt_millis,
            wait_timeout_millis=spec.wait_timeout_millis,
        )
    elif isinstance(policy, SlidingNode):
        assert policy.limit.unit is not None
        out.update(
            kind="sliding_window",
            requests_per_unit=policy.limit.requests_per_unit,
            unit=policy.limit.unit.name.lower(),
        )
    elif isinstance(policy, LeasedNode):
        assert rule.leased is not None
        out.update(
            kind="leased_limit",
            resource=rule.leased.resource,
            safe_capacity=rule.leased.safe_capacity,
        )
    else:
        out.update(kind="none")
    return out


@dataclass(frozen=True)
class SlidingRead:
    """A sliding window to read: its key, limit and window length (seconds)."""

    key: str
    limit: int
    seconds: int


@dataclass
class Explanation:
    """The answer, as plain data (``as_dict`` for JSON). By descriptor index, what the
    request would count in, for reading it: ``ops`` the fixed-window counters, ``buckets``
    the token buckets (key and spec), ``sliding`` the sliding windows."""

    domain: str
    descriptors: list[dict[str, Any]]
    domain_found: bool = True
    ops: dict[int, CounterOp] = field(default_factory=dict)
    buckets: dict[int, tuple[str, BucketSpec]] = field(default_factory=dict)
    sliding: dict[int, SlidingRead] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "domain": self.domain,
            "domain_found": self.domain_found,
            "descriptors": self.descriptors,
        }

    def add_counts(self, values: Sequence[int], now: float) -> None:
        """The current value of each counter in ``ops`` (in their order), with what is left."""
        for (index, op), value in zip(self.ops.items(), values, strict=True):
            d = self.descriptors[index]
            d["count"] = value
            d["remaining"] = max(0, op.limit - value)
            d["reset_after"] = reset_after(now, op.ttl)

    def add_bucket(self, index: int, spec: BucketSpec, now: Standing) -> None:
        """A token bucket as it stands: its tokens (negative: debt, tokens promised ahead),
        the whole tokens left (as ShouldRateLimit's remaining), and the wait its debt
        makes."""
        tokens = now.stored - now.debt_us * spec.fill_rate / 1e6
        d = self.descriptors[index]
        d["tokens"] = round(tokens, 3)
        d["remaining"] = max(0, math.floor(tokens))
        d["debt_ms"] = round(now.debt_us / 1000)

    def add_sliding(self, index: int, read: SlidingRead, now: SlidingResult) -> None:
        """A sliding window now: its estimated count, the whole hits it leaves, and the end
        of its current window."""
        d = self.descriptors[index]
        d["estimate"] = round(now.estimate, 3)
        d["remaining"] = max(0, math.floor(read.limit - now.estimate))
        d["reset_after"] = math.ceil(now.left_us / 1e6)


def explain(
    config: Config,
    domain: str,
    requests: Sequence[Sequence[tuple[str, str]]],
    options: EngineOptions,
    now: float,
) -> Explanation:
    """The explanation of a request of ``requests`` (each one descriptor's entries)."""
    for i, entries in enumerate(requests):
        check_descriptor(domain, entries, f"descriptors[{i}]")
    dom = config.domains.get(domain)
    if dom is None:
        known = ", ".join(sorted(config.domains))
        missing: list[dict[str, Any]] = [
            {
                "entries": [list(e) for e in entries],
                "outcome": f"domain {domain!r} is not configured (known: {known})",
            }
            for entries in requests
        ]
        return Explanation(domain, missing, domain_found=False)
    table = build_policies(config, options)
    out = Explanation(domain, [])
    rules: list[Rule | None] = []
    for entries in requests:
        level = dom.root
        walk: list[dict[str, Any]] = []
        path: list[Rule] = []
        for key, value in entries:
            rule, step = _step(level, key, value)
            walk.append(step)
            if rule is None:
                break
            path.append(rule)
            level = rule.children
        d: dict[str, Any] = {"entries": [list(e) for e in entries], "walk": walk}
        if len(path) < len(entries):
            d["outcome"] = f"no match at level {len(path) + 1}: OK, nothing counted"
            rules.append(None)
        else:
            last = path[-1]
            policy = table.get(last)
            d["rule"] = describe_rule(policy, last)
            d["stats_key"] = stats_key(domain, entries, path)[0]
            if isinstance(policy, Plain | Window):
                seconds = policy.limit.unit.seconds if policy.limit.unit else 1
                start = window_start(now, seconds)
                key = cache_key(options.cache_key_prefix, domain, entries, path) + str(start)
                d["counter_key"] = key
                op = CounterOp(key, 0, policy.limit.requests_per_unit, start + seconds, seconds)
                out.ops[len(out.descriptors)] = op
            elif isinstance(policy, BucketNode):
                assert last.token_bucket is not None
                d["counter_key"] = BucketLimiter.key(policy, entries)
                out.buckets[len(out.descriptors)] = (d["counter_key"], last.token_bucket)
            elif isinstance(policy, SlidingNode):
                assert policy.limit.unit is not None
                d["counter_key"] = SlidingLimiter.key(policy, entries)
                out.sliding[len(out.descriptors)] = SlidingRead(
                    d["counter_key"], policy.limit.requests_per_unit, policy.limit.unit.seconds
                )
            if policy is None:
                d["outcome"] = "the path matches a node with no limit: OK, nothing counted"
            rules.append(last)
        out.descriptors.append(d)
    replaced: dict[str, str] = {}
    for rule in rules:
        if rule is None:
            continue
        names = rule.rate_limit.replaces if rule.rate_limit else rule.replaces
        for name in names:
            replaced.setdefault(name, rule.stats_key)
    for index, (shown, rule) in enumerate(zip(out.descriptors, rules, strict=True)):
        name = (rule.rate_limit.name if rule.rate_limit else rule.name) if rule else ""
        if name and name in replaced:
            shown["replaced_by"] = replaced[name]
            shown["outcome"] = f"replaced by {replaced[name]}: OK, nothing counted"
            shown.pop("counter_key", None)
            out.ops.pop(index, None)
            out.buckets.pop(index, None)
            out.sliding.pop(index, None)
    return out


def render(answer: dict[str, Any]) -> str:
    """The explanation as text, one block per descriptor."""
    lines = [f"domain {answer['domain']}"]
    for i, d in enumerate(answer["descriptors"]):
        shown = ",".join(f"{k}={v}" for k, v in d["entries"])
        lines.append(f"descriptor[{i}] {shown}")
        for n, step in enumerate(d.get("walk", []), start=1):
            where = f"{step['key']}={step['value']}"
            matched = step["matched"]
            if matched is None:
                expected = ", ".join(step["expected"]) or "nothing (a leaf)"
                lines.append(f"  level {n}: {where}: no match; this level has: {expected}")
                continue
            how = f"wildcard {step['pattern']}" if matched == "wildcard" else matched
            lines.append(f"  level {n}: {where}: {how} ({step['source']})")
            if step.get("wildcards_not_matching"):
                tried = ", ".join(step["wildcards_not_matching"])
                lines.append(f"           wildcards not matching: {tried}")
        rule = d.get("rule")
        if rule is not None:
            lines.append("  rule: " + rule_text(rule))
        if "counter_key" in d:
            lines.append(f"  counter: {d['counter_key']}")
        now = now_text(d)
        if now:
            lines.append(f"  now: {now}")
        if "outcome" in d:
            lines.append(f"  outcome: {d['outcome']}")
    return "\n".join(lines) + "\n"


def now_text(d: dict[str, Any]) -> str:
    """What a descriptor's counter, bucket or sliding window holds now ("" if not read)."""
    if "count" in d:
        return f"{d['count']} counted, {d['remaining']} left, window resets in {d['reset_after']}s"
    if "tokens" in d:
        text = f"{d['tokens']:g} tokens, {d['remaining']} left"
        if d["debt_ms"]:
            text += f", in debt: {d['debt_ms']}ms to wait"
        return text
    if "estimate" in d:
        return (
            f"{d['estimate']:g} counted (estimate), {d['remaining']} left, "
            f"window ends in {d['reset_after']}s"
        )
    return ""


def rule_text(rule: dict[str, Any]) -> str:
    kind = rule["kind"]
    if kind == "fixed_window":
        text = f"fixed window {rule['requests_per_unit']} per {rule['unit']}"
    elif kind == "burst_tiers":
        text = rule["tiers"]
    elif kind == "copies":
        text = rule["copies"]
    elif kind == "sliding_window":
        text = f"sliding window {rule['requests_per_unit']} per {rule['unit']}"
    elif kind == "token_bucket":
        text = (
            f"token bucket size {rule['size']}, {rule['fill_rate']:g} per second, "
            f"debt up to {rule['max_debt_millis']}ms, waits up to {rule['wait_timeout_millis']}ms"
        )
    elif kind == "leased_limit":
        text = f"per second as leased on {rule['resource']}"
    else:
        text = kind
    if rule.get("name"):
        text += f" (name {rule['name']})"
    if rule.get("replaces"):
        text += f", replaces {', '.join(rule['replaces'])}"
    modes = [m for m in ("shadow_mode", "quota_mode") if rule.get(m)]
    if modes:
        text += f", {' and '.join(modes)}"
    return text + f" [{rule['stats_key']} at {rule['source']}]"
