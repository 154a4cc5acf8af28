"""Why a request is limited (or not): the walk of each descriptor through its domain's tree,
the rule it reaches, what ``replaces`` removes, and the state its rule's kind would count it
in, worked out without counting anything."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ferryman.algorithms import BY_NAME, algorithm_of
from ferryman.config.model import Config
from ferryman.core.algorithm import Algorithm, Target
from ferryman.core.answers import EngineOptions
from ferryman.core.keys import ends_at, stats_key
from ferryman.core.rules import Level, Rule
from ferryman.engine.validate import check_descriptor
from ferryman.errors import RequestError

__all__ = [
    "Explanation",
    "describe_rule",
    "explain",
    "now_text",
    "parse_descriptor",
    "read_now",
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


def describe_rule(rule: Rule) -> dict[str, Any]:
    """A rule as plain data: its kind and numbers, as its algorithm describes them."""
    out: dict[str, Any] = {
        "stats_key": rule.stats_key,
        "source": rule.source,
        "shadow_mode": rule.shadow_mode,
        "quota_mode": rule.quota_mode,
    }
    if rule.limit is None:
        out["kind"] = "none"
    else:
        out.update(algorithm_of(rule.limit.kind).describe(rule.limit))
    if rule.max_wait:
        out["max_wait"] = rule.max_wait
    return out


@dataclass
class Explanation:
    """The answer, as plain data (``as_dict`` for JSON). ``reads``: by descriptor index,
    the state the request would count in (its kind and where), for :func:`read_now`."""

    domain: str
    descriptors: list[dict[str, Any]]
    domain_found: bool = True
    reads: dict[int, tuple[Algorithm, Target]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "domain": self.domain,
            "domain_found": self.domain_found,
            "descriptors": self.descriptors,
        }


async def read_now(store_of: Callable[[str], Any], answer: Explanation, now: float) -> None:
    """Add to ``answer`` what the state of each descriptor holds now, counting nothing
    (``store_of(name)``: the backend's store of a kind)."""
    for index, (algorithm, target) in answer.reads.items():
        fields = await algorithm.peek(store_of(algorithm.name), target, now)
        answer.descriptors[index].update(fields)


def _walk(level: Level, entries: Sequence[tuple[str, str]]) -> tuple[list[Rule], list[Any]]:
    walk: list[dict[str, Any]] = []
    path: list[Rule] = []
    for key, value in entries:
        rule, step = _step(level, key, value)
        walk.append(step)
        if rule is None:
            break
        path.append(rule)
        if rule.limit is not None and ends_at(rule, entries[len(path) :]):
            break
        level = rule.children
    return path, walk


def _missing(
    domain: str, config: Config, requests: Sequence[Sequence[tuple[str, str]]]
) -> Explanation:
    known = ", ".join(sorted(config.domains))
    missing: list[dict[str, Any]] = [
        {
            "entries": [list(e) for e in entries],
            "outcome": f"domain {domain!r} is not configured (known: {known})",
        }
        for entries in requests
    ]
    return Explanation(domain, missing, domain_found=False)


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
        return _missing(domain, config, requests)
    out = Explanation(domain, [])
    rules: list[Rule | None] = []
    for entries in requests:
        path, walk = _walk(dom.root, entries)
        d: dict[str, Any] = {"entries": [list(e) for e in entries], "walk": walk}
        done = len(path) == len(entries) or (bool(path) and ends_at(path[-1], entries[len(path) :]))
        last = path[-1] if done and path else None
        rules.append(last)
        if last is not None and len(path) < len(entries):
            d["read_by_rule"] = [list(e) for e in entries[len(path) :]]
        if last is None:
            d["outcome"] = f"no match at level {len(path) + 1}: OK, nothing counted"
        else:
            _reached(out, d, options, domain, path, entries, now)
        out.descriptors.append(d)
    _replaced(out, rules)
    return out


def _reached(
    out: Explanation,
    d: dict[str, Any],
    options: EngineOptions,
    domain: str,
    path: list[Rule],
    entries: Sequence[tuple[str, str]],
    now: float,
) -> None:
    """A descriptor that reaches a rule: the rule, its stats key and its state's key."""
    last = path[-1]
    d["rule"] = describe_rule(last)
    d["stats_key"] = stats_key(domain, entries[: len(path)], path)[0]
    if last.limit is None:
        d["outcome"] = "the path matches a node with no limit: OK, nothing counted"
        return
    algorithm = algorithm_of(last.limit.kind)
    target = algorithm.target(options, domain, path, entries, now)
    if target is not None:
        d["counter_key"] = target.key
        out.reads[len(out.descriptors)] = (algorithm, target)


def _replaced(out: Explanation, rules: Sequence[Rule | None]) -> None:
    """What ``replaces`` removes: those descriptors are OK and count nothing."""
    replaced: dict[str, str] = {}
    for rule in rules:
        if rule is not None:
            for name in rule.replaces:
                replaced.setdefault(name, rule.stats_key)
    for index, (shown, rule) in enumerate(zip(out.descriptors, rules, strict=True)):
        name = rule.name if rule is not None else ""
        if name and name in replaced:
            shown["replaced_by"] = replaced[name]
            shown["outcome"] = f"replaced by {replaced[name]}: OK, nothing counted"
            shown.pop("counter_key", None)
            out.reads.pop(index, None)


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
        if d.get("read_by_rule"):
            tail = ", ".join(f"{k}={v}" for k, v in d["read_by_rule"])
            lines.append(f"  then: {tail}: read by the rule itself, not a level of the tree")
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
    """What a descriptor's state holds now, in words ("" if not read)."""
    algorithm = BY_NAME.get(d.get("rule", {}).get("kind", ""))
    return algorithm.now_text(d) if algorithm is not None else ""


def rule_text(rule: dict[str, Any]) -> str:
    kind = rule["kind"]
    algorithm = BY_NAME.get(kind)
    text = algorithm.text(rule) if algorithm is not None else kind
    if rule.get("name"):
        text += f" (name {rule['name']})"
    if rule.get("replaces"):
        text += f", replaces {', '.join(rule['replaces'])}"
    if rule.get("max_wait"):
        text += f", Envoy's requests held up to {rule['max_wait']:g}s for their turn (max_wait)"
    modes = [m for m in ("shadow_mode", "quota_mode") if rule.get(m)]
    if modes:
        text += f", {' and '.join(modes)}"
    return text + f" [{rule['stats_key']} at {rule['source']}]"
