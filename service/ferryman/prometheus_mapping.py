"""PROMETHEUS_MAPPER_YAML: the statsd-name-to-Prometheus mapping file the reference accepts.

The file has statsd_exporter's mapping form::

    mappings:
      - match: "ratelimit.service.rate_limit.*.*.total_hits"   # glob: * is one dot-free part
        name: "ratelimit_hits"
        labels: {domain: "$1", descriptor: "$2"}
      - match: "ratelimit\\.service\\.config_load_.*"
        match_type: regex
        action: drop

Each counter of :class:`ferryman.stats.Stats` takes the first mapping that matches its statsd
name: it is served under that ``name`` with those ``labels`` (``$1``, ``$2``... the match's
groups), or left out with ``action: drop``. A name no mapping matches is served as
statsd_exporter serves it, every character outside ``[a-zA-Z0-9_]`` turned into ``_``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

from ferryman.errors import SettingsError

__all__ = ["StatsdMapping"]

_GROUP = re.compile(r"\$\{?(\d+)\}?")
_BAD = re.compile(r"[^a-zA-Z0-9_]")


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern[str]
    name: str
    labels: tuple[tuple[str, str], ...]
    drop: bool


def _glob(match: str) -> re.Pattern[str]:
    return re.compile("^" + "([^.]+)".join(re.escape(part) for part in match.split("*")) + "$")


def _escape(name: str) -> str:
    name = _BAD.sub("_", name)
    return "_" + name if name[:1].isdigit() else name


def _value(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class StatsdMapping:
    """The mappings of one file, applied to statsd names."""

    def __init__(self, rules: Iterable[_Rule]) -> None:
        self._rules = list(rules)

    @classmethod
    def from_file(cls, path: str) -> StatsdMapping:
        """Read ``path``; raises SettingsError naming PROMETHEUS_MAPPER_YAML and the problem."""
        where = f"PROMETHEUS_MAPPER_YAML={path!r}"
        try:
            tree = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise SettingsError(f"{where}: cannot read the mapping file: {exc}") from None
        entries = tree.get("mappings") if isinstance(tree, dict) else None
        if not isinstance(entries, list):
            raise SettingsError(f"{where}: expected a map with a `mappings:` list")
        rules = []
        for i, entry in enumerate(entries):
            at = f"{where}: mappings[{i}]"
            if not isinstance(entry, dict) or not isinstance(entry.get("match"), str):
                raise SettingsError(f"{at}: each mapping needs a `match:` string")
            kind = entry.get("match_type", "glob")
            try:
                pattern = _glob(entry["match"]) if kind == "glob" else re.compile(entry["match"])
            except re.error as exc:
                raise SettingsError(f"{at}: `match:` is not a regex: {exc}") from None
            if kind not in ("glob", "regex"):
                raise SettingsError(f"{at}: match_type {kind!r} must be glob or regex")
            drop = entry.get("action", "map") == "drop"
            name = entry.get("name", "")
            if not drop and (not isinstance(name, str) or not name):
                raise SettingsError(f"{at}: a mapping needs a `name:` (or `action: drop`)")
            labels = entry.get("labels") or {}
            if not isinstance(labels, dict):
                raise SettingsError(f"{at}: `labels:` must be a map")
            rules.append(
                _Rule(pattern, str(name), tuple((str(k), str(v)) for k, v in labels.items()), drop)
            )
        return cls(rules)

    def map(self, stat: str) -> tuple[str, dict[str, str]] | None:
        """The Prometheus name and labels of the statsd name ``stat``; None when dropped."""
        for rule in self._rules:
            match = rule.pattern.search(stat)
            if match is None:
                continue
            if rule.drop:
                return None

            def fill(template: str, m: re.Match[str] = match) -> str:
                return _GROUP.sub(lambda g: m.group(int(g.group(1))) or "", template)

            return _escape(fill(rule.name)), {k: fill(v) for k, v in rule.labels}
        return _escape(stat), {}

    def render(self, counters: Iterable[tuple[str, int]]) -> str:
        """Prometheus text of the counters (statsd name, value), grouped by mapped name."""
        families: dict[str, list[str]] = {}
        for stat, value in counters:
            mapped = self.map(stat)
            if mapped is None:
                continue
            name, labels = mapped
            text = ",".join(f'{_escape(k)}="{_value(v)}"' for k, v in labels.items())
            families.setdefault(name, []).append(
                f"{name}{{{text}}} {value}" if text else f"{name} {value}"
            )
        out: list[str] = []
        for name, lines in families.items():
            out.append(f"# TYPE {name} counter")
            out.extend(lines)
        return "\n".join(out) + "\n" if out else ""
