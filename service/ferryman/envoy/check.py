"""Envoy's descriptors against the descriptor trees: each ``rate_limits`` entry walked down its
domain's tree with the engine's own level matcher, the rule it reaches or where it stops."""

from __future__ import annotations

import difflib
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ferryman.algorithms import BY_NAME
from ferryman.config.model import Config
from ferryman.core.answers import EngineOptions
from ferryman.core.keys import ends_at
from ferryman.core.rules import Level, Rule
from ferryman.engine.explain import describe_rule
from ferryman.envoy.actions import Entry, Filter, Inventory, Part

__all__ = ["Report", "check", "render", "sequences", "short", "walk"]


@dataclass
class Report:
    """Findings (an ``error`` fails the check, a ``warning`` only with --strict) and
    per-entry results."""

    filters: list[dict[str, Any]] = field(default_factory=list)
    entries: list[dict[str, Any]] = field(default_factory=list)
    findings: list[dict[str, str]] = field(default_factory=list)

    def add(self, severity: str, file: str, where: str, message: str) -> None:
        self.findings.append(
            {"severity": severity, "file": file, "where": where, "message": message}
        )

    def count(self, severity: str) -> int:
        return sum(1 for f in self.findings if f["severity"] == severity)

    def exit_code(self, strict: bool) -> int:
        failing = self.count("error") + (self.count("warning") if strict else 0)
        return 1 if failing else 0

    def as_dict(self, strict: bool = False) -> dict[str, Any]:
        return {
            "ok": self.exit_code(strict) == 0,
            "errors": self.count("error"),
            "warnings": self.count("warning"),
            "filters": self.filters,
            "entries": self.entries,
            "findings": self.findings,
        }


@dataclass(frozen=True)
class _Outcome:
    path: tuple[Rule, ...]
    values: tuple[str, ...] = ()  # the request values a variable entry must have, if any
    stop: dict[str, Any] | None = None


def _offered(level: Level) -> list[str]:
    return [f"{r.key}={r.value}" if r.value else r.key for r in level.rules]


def walk(level: Level, parts: Sequence[Part], path: tuple[Rule, ...]) -> list[_Outcome]:
    if not parts:
        return [_Outcome(path)]
    part, rest = parts[0], parts[1:]
    if part.value is not None:
        rule = level.match(part.key, part.value)
        found = [] if rule is None else [(rule, "")]
    else:
        # Values the tree names first (exact, then wildcards), then the bare key for the rest.
        found = [
            (r, f"{part.source} = {r.value}") for r in level.rules if r.key == part.key and r.value
        ]
        bare = level.bare.get(part.key)
        if bare is not None:
            found.append((bare, ""))
    if not found:
        shown = part.value if part.value is not None else f"<{part.source}>"
        stop = {
            "level": len(path) + 1,
            "key": part.key,
            "value": shown,
            "expected": _offered(level),
        }
        return [_Outcome(path, stop=stop)]
    out = []
    for rule, value in found:
        if rule.limit is not None and ends_at(rule, [(p.key, p.value or "") for p in rest]):
            # The rest is read by the rule's kind (a cost budget's settle key and mark).
            out.append(_Outcome((*path, rule), (value,) if value else ()))
            continue
        for o in walk(rule.children, rest, (*path, rule)):
            values = (value, *o.values) if value else o.values
            out.append(_Outcome(o.path, values, o.stop))
    return out


def sequences(parts: tuple[Part, ...]) -> list[tuple[Part, ...]]:
    """The descriptors one entry can send: each ``skip_if_absent`` part there or not."""
    optional = [i for i, p in enumerate(parts) if p.optional][:6]
    out = []
    for absent in itertools.product((False, True), repeat=len(optional)):
        gone = {i for i, a in zip(optional, absent, strict=True) if a}
        seq = tuple(p for i, p in enumerate(parts) if i not in gone)
        if seq:
            out.append(seq)
    return out


def _key_paths(level: Level, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for rule in level.rules:
        path = (*prefix, rule.key)
        out.append(path)
        out.extend(_key_paths(rule.children, path))
    return out


def _hint(level: Level, root: Level, parts: Sequence[Part], stop: dict[str, Any]) -> str:
    keys = tuple(p.key for p in parts)
    for path in _key_paths(root):
        if len(path) == len(keys) and path != keys and sorted(path) == sorted(keys):
            return f"the tree nests these keys in another order: {' > '.join(path)}"
    close = difflib.get_close_matches(stop["key"], sorted({r.key for r in level.rules}), 1, 0.6)
    if close:
        return f"did you mean {close[0]!r}?"
    return ""


def short(rule: dict[str, Any]) -> str:
    kind = str(rule.get("kind"))
    algorithm = BY_NAME.get(kind)
    text = algorithm.text(rule) if algorithm is not None else kind
    if rule.get("shadow_mode"):
        text += " (shadow mode)"
    return text


def _level_at(root: Level, path: tuple[Rule, ...]) -> Level:
    return path[-1].children if path else root


def _entry(
    report: Report,
    entry: Entry,
    domains: list[str],
    config: Config,
    reached: set[Rule],
) -> None:
    shown: dict[str, Any] = {
        "file": entry.file,
        "where": entry.where,
        "stage": entry.stage,
        "descriptor": [[p.key, p.value, p.source] for p in entry.parts],
        "hits_addend": entry.hits_addend or None,
        "apply_on_stream_done": entry.apply_on_stream_done,
        "results": [],
    }
    report.entries.append(shown)
    if _report_problems(report, entry):
        return
    for name in domains:
        domain = config.domains.get(name)
        if domain is None:
            continue  # reported once, with the filter or override naming it
        result: dict[str, Any] = {"domain": name, "reaches": [], "stops": []}
        shown["results"].append(result)
        for seq in sequences(entry.parts):
            for outcome in walk(domain.root, seq, ()):
                _record(result, outcome, domain.root, seq, reached)
        if not result["reaches"]:
            report.add("error", entry.file, entry.where, _never(name, entry, result["stops"]))


def _report_problems(report: Report, entry: Entry) -> bool:
    """Report what Envoy rejects or drops in ``entry``; whether Envoy rejects it."""
    broken = [p.problem for p in entry.parts if p.problem]
    for problem in broken:
        report.add("error", entry.file, entry.where, f"{problem}: Envoy rejects this entry")
    for part in entry.parts:
        required = part.source.startswith("header ") and part.source[7:].lower() in entry.required
        if part.drops and part.value is None and not required:
            report.add(
                "warning",
                entry.file,
                entry.where,
                f"Envoy sends no descriptor when the {part.drops.removesuffix(' missing')} is "
                f"missing (add skip_if_absent: true to send the rest, or make sure it is set)",
            )
    _report_addend(report, entry)
    return bool(broken)


_REQUEST_VALUE = re.compile(r"%REQ\(([^)]+)\)%")


def _report_addend(report: Report, entry: Entry) -> None:
    """Where Envoy drops an entry's ``hits_addend``, or the whole descriptor for it."""
    addend = entry.hits_addend
    if not addend:
        return
    if "typed_per_filter_config" not in entry.where and "http_filters" not in entry.where:
        report.add(
            "warning",
            entry.file,
            entry.where,
            f"Envoy drops hits_addend ({addend}) from a route's or virtual host's rate_limits: "
            "move the entry to the route's typed_per_filter_config (RateLimitPerRoute)",
        )
    header = _REQUEST_VALUE.search(addend)
    if header and not entry.apply_on_stream_done and header.group(1).lower() not in entry.required:
        report.add(
            "warning",
            entry.file,
            entry.where,
            f"Envoy sends no descriptor when the request has no {header.group(1)} header "
            "(or one that is not a whole number): such a request passes unchecked; make "
            "the route require it, or set a default before the rate limit filter",
        )


def _record(
    result: dict[str, Any],
    outcome: _Outcome,
    root: Level,
    seq: tuple[Part, ...],
    reached: set[Rule],
) -> None:
    """One walk in a domain's result: the rule with a limit it reaches, or where it stops."""
    last = outcome.path[-1] if outcome.path else None
    if outcome.stop is None and last is not None and last.limit is not None:
        rule = describe_rule(last)
        if outcome.values:
            rule["only_when"] = list(outcome.values)
        result["reaches"].append(rule)
        reached.add(outcome.path[-1])
        return
    stop = outcome.stop
    if stop is None:
        last = outcome.path[-1]
        stop = {
            "level": len(outcome.path),
            "key": last.key,
            "value": last.value,
            "expected": _offered(last.children),
            "no_limit": last.stats_key,
        }
    else:
        hint = _hint(_level_at(root, outcome.path), root, seq, stop)
        if hint:
            stop["hint"] = hint
    result["stops"].append(stop)


def _never(domain: str, entry: Entry, stops: list[dict[str, Any]]) -> str:
    stop = stops[0]
    expected = ", ".join(stop["expected"]) or "nothing (a leaf)"
    if "no_limit" in stop:
        why = (
            f"the walk ends at {stop['no_limit']}, which has no limit; "
            f"the tree expects one more level: {expected}"
        )
    else:
        why = (
            f"the walk stops at level {stop['level']}: no ({stop['key']}, {stop['value']}) "
            f"in the tree, which has there: {expected}"
        )
        if stop.get("hint"):
            why += f"; {stop['hint']}"
    return f"[{entry.shown()}] never matches in domain {domain}: {why}"


def _sent(
    report: Report,
    entry: Entry,
    domains: list[str],
    staged: list[Filter],
    config: Config,
    reached: set[Rule],
) -> None:
    """An entry the ``staged`` filters send, walked in ``domains``; its rules' max_wait
    against the filters' timeouts."""
    mine: set[Rule] = set()
    _entry(report, entry, domains, config, mine)
    reached |= mine
    _timeouts(report, entry, staged, mine)


def _timeouts(report: Report, entry: Entry, staged: list[Filter], rules: set[Rule]) -> None:
    """A rule with max_wait that an entry reaches through a filter whose timeout is shorter:
    Envoy gives up on a held answer before its turn comes."""
    for rule in sorted(rules, key=lambda r: r.stats_key):
        if not rule.max_wait:
            continue
        domain = rule.stats_path[0] if rule.stats_path else ""
        for f in staged:
            if (entry.domain or f.domain) != domain or f.timeout_seconds >= rule.max_wait:
                continue
            then = "refuses the request" if f.failure_mode_deny else "lets it through"
            report.add(
                "warning",
                entry.file,
                entry.where,
                f"{rule.stats_key} ({rule.source}) holds a request up to {rule.max_wait:g}s "
                f"(max_wait), longer than the filter's timeout ({f.timeout}, {f.where}): "
                f"Envoy gives up first and {then} (failure_mode_deny); raise the timeout "
                "above max_wait",
            )


def _rules(level: Level) -> list[Rule]:
    out = []
    for rule in level.rules:
        out.append(rule)
        out.extend(_rules(rule.children))
    return out


def _quota_entries(inventory: Inventory, config: Config) -> list[Entry]:
    from ferryman.envoy.quota_check import quota_entry

    out = []
    for bucket in inventory.quota:
        domain = config.domains.get(bucket.domain)
        out.append(quota_entry(bucket, domain.root if domain is not None else None))
    return out


def _quota(report: Report, entry: Entry, config: Config, reached: set[Rule]) -> None:
    """A quota bucket's id walked down its filter's domain: the rule it reaches, and an
    error where that rule's kind has no rate to share (the bucket would be ALLOW_ALL)."""
    if entry.domain not in config.domains:
        known = ", ".join(sorted(config.domains)) or "none"
        report.add(
            "error",
            entry.file,
            entry.where,
            f"quota filter domain {entry.domain!r} has no config (known: {known})",
        )
    mine: set[Rule] = set()
    _entry(report, entry, [entry.domain], config, mine)
    report.entries[-1]["quota"] = True
    reached |= mine
    for rule in sorted(mine, key=lambda r: r.stats_key):
        limit = rule.limit
        if limit is None:
            continue
        algorithm = BY_NAME[limit.kind]
        reported = algorithm.reported(limit)
        if algorithm.rate(limit) is None and not (reported is not None and reported.unlimited):
            report.add(
                "error",
                entry.file,
                entry.where,
                f"{rule.stats_key} ({rule.source}) is a {limit.kind} rule, which has no rate "
                "to share: the quota service answers this bucket ALLOW_ALL",
            )


def check(inventory: Inventory, config: Config, options: EngineOptions) -> Report:
    """Every entry of ``inventory`` walked against ``config``."""
    report = Report(filters=[f.as_dict() for f in inventory.filters])
    known = ", ".join(sorted(config.domains)) or "none"
    used: set[str] = set()
    for f in inventory.filters:
        used.add(f.domain)
        if f.domain not in config.domains:
            report.add(
                "error",
                f.file,
                f.where,
                f"filter domain {f.domain!r} has no config (known: {known})",
            )
    reached: set[Rule] = set()
    quota = _quota_entries(inventory, config)
    for entry in [*inventory.entries, *quota]:
        if entry in quota:
            _quota(report, entry, config, reached)
            used.add(entry.domain)
            continue
        pool = inventory.filters if entry.filters is None else list(entry.filters)
        staged = [f for f in pool if f.stage == entry.stage]
        if not staged:
            report.add(
                "error",
                entry.file,
                entry.where,
                f"stage {entry.stage} has no rate limit filter: Envoy never sends this entry",
            )
            continue
        if entry.domain:
            domains = [entry.domain]
            if entry.domain not in config.domains and entry.domain not in used:
                report.add(
                    "error",
                    entry.file,
                    entry.where,
                    f"per-route domain {entry.domain!r} has no config (known: {known})",
                )
            used.add(entry.domain)
        else:
            domains = sorted({f.domain for f in staged})
        _sent(report, entry, domains, staged, config, reached)
    if inventory.entries or quota:
        for name in sorted(used):
            domain = config.domains.get(name)
            if domain is None:
                continue
            for rule in _rules(domain.root):
                if rule.limit is not None and rule not in reached:
                    report.add(
                        "warning",
                        rule.source,
                        rule.stats_key,
                        "no Envoy entry reaches this rule",
                    )
    return report


def render(report: Report, strict: bool = False) -> str:
    """The report for people."""
    lines = []
    for f in report.filters:
        mode = "fails closed" if f["failure_mode_deny"] else "fails open"
        lines.append(
            f"filter  domain {f['domain']}, stage {f['stage']}, {mode}, timeout {f['timeout']}, "
            f"cluster {f['cluster']}  ({f['file']}: {f['where']})"
        )
    for e in report.entries:
        desc = ", ".join(
            f"({k}, {v if v is not None else '<' + s + '>'})" for k, v, s in e["descriptor"]
        )
        extra = ""
        if e["hits_addend"]:
            extra += f" hits_addend {e['hits_addend']}"
        if e["apply_on_stream_done"]:
            extra += " on stream done"
        lines.append(f"entry   {e['file']}: {e['where']}{extra}")
        lines.append(f"        {'bucket id' if e.get('quota') else 'sends'} [{desc}]")
        for r in e["results"]:
            for rule in r["reaches"]:
                when = f" when {', '.join(rule['only_when'])}" if rule.get("only_when") else ""
                lines.append(f"        -> {rule['stats_key']}: {short(rule)}{when}")
            if not r["reaches"]:
                lines.append(f"        -> nothing in domain {r['domain']}")
        if not e["results"]:
            lines.append("        -> not walked: see the errors below")
    for f in report.findings:
        lines.append(f"{f['severity']}: {f['file']}: {f['where']}: {f['message']}")
    verdict = "ok" if report.exit_code(strict) == 0 else "FAILED"
    lines.append(
        f"{verdict}: {len(report.entries)} entries, {report.count('error')} errors, "
        f"{report.count('warning')} warnings"
    )
    return "\n".join(lines) + "\n"
