"""What a route sends and what it reaches (``ferryman explain --envoy``): for each
``rate_limits`` entry Envoy applies to a route, the descriptors it sends, each value either
given (a request header, the client address) or left variable, walked down the domain's
tree: a descriptor whose values are all known is explained as ``ferryman explain`` does; one
with a variable entry lists the rules it can reach and for which values.

The files are read once (``Routes.read``); the answer is computed on each question, against
the configuration given, so that the debug port's ``/explain/envoy`` answers as the command
does, against the configuration in force."""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ferryman.config.model import Config
from ferryman.core.answers import EngineOptions
from ferryman.engine.explain import Explanation, describe_rule, explain, rule_text
from ferryman.engine.explain import render as render_explained
from ferryman.envoy.actions import Entry, Inventory, Part, collect
from ferryman.envoy.check import sequences, walk
from ferryman.envoy.read import read_file
from ferryman.errors import SettingsError

__all__ = ["Request", "Routes", "explain_routes", "parse_values", "render"]


class Request:
    """The values a request gives Envoy's actions: headers (by lower-cased name) and the
    client address; anything else stays variable."""

    def __init__(self, headers: Mapping[str, str] | None = None, remote_address: str = "") -> None:
        self.headers = {k.lower(): v for k, v in (headers or {}).items()}
        self.remote_address = remote_address

    def value(self, part: Part) -> str | None:
        kind, _, name = part.source.partition(" ")
        if kind == "header":
            return self.headers.get(name.lower())
        if part.source == "client address" and self.remote_address:
            return self.remote_address
        return None


def parse_values(items: Sequence[str], option: str) -> dict[str, str]:
    """``NAME=VALUE`` options as a dict; SettingsError naming the option otherwise."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SettingsError(f"{option}: {item!r} is not NAME=VALUE")
        out[name] = value
    return out


def _domains(entry: Entry, inventory: Inventory) -> list[str]:
    """The domains Envoy sends the entry to: its per-route domain, else those of the rate
    limit filters of its stage (on its own listener when it has one)."""
    if entry.domain:
        return [entry.domain]
    pool = inventory.filters if entry.filters is None else list(entry.filters)
    return sorted({f.domain for f in pool if f.stage == entry.stage})


def _selected(entry: Entry, route: str) -> bool:
    if not route:
        return True
    return route == entry.vhost or any(route in (r, f"{entry.vhost}/{r}") for r in entry.routes)


def _descriptor(
    config: Config,
    options: EngineOptions,
    domain: str,
    parts: tuple[Part, ...],
    request: Request,
    now: float,
    explained: list[Explanation],
) -> dict[str, Any]:
    known = tuple(
        part if part.value is not None else replace(part, value=request.value(part))
        for part in parts
    )
    shown: dict[str, Any] = {
        "entries": [[p.key, p.value, p.source] for p in known],
        "conditions": [p.drops for p in parts if p.drops and p.value is not None],
    }
    variable = [p for p in known if p.value is None]
    if not variable:
        entries = [(p.key, str(p.value)) for p in known]
        answer = explain(config, domain, [entries], options, now)
        explained.append(answer)  # the same dict: counts added to it later show here
        shown["explain"] = answer.descriptors[0]
        return shown
    root = config.domains[domain].root
    reaches, stops = [], []
    for outcome in walk(root, known, ()):
        last = outcome.path[-1] if outcome.path else None
        if outcome.stop is None and last is not None and last.limit is not None:
            rule = describe_rule(last)
            rule["only_when"] = list(outcome.values)
            reaches.append(rule)
        elif outcome.stop is not None:
            stops.append(outcome.stop)
        else:
            last = outcome.path[-1]
            stops.append({"no_limit": last.stats_key, "key": last.key, "value": last.value})
    shown["reaches"] = reaches
    shown["stops"] = stops
    return shown


def explain_routes(
    inventory: Inventory,
    config: Config,
    options: EngineOptions,
    request: Request,
    route: str = "",
    domain: str = "",
    now: float | None = None,
    explained: list[Explanation] | None = None,
) -> dict[str, Any]:
    """Every entry sent for ``route`` (every route when empty), optionally only those sent
    to ``domain``: the descriptors each sends and what each reaches. Each descriptor whose
    values are all known is explained at ``now`` (default: the time now); its Explanation
    is appended to ``explained``, for reading its counter into the answer."""
    now = time.time() if now is None else now
    explained = [] if explained is None else explained
    out: list[dict[str, Any]] = []
    for entry in inventory.entries:
        if not _selected(entry, route):
            continue
        for name in _domains(entry, inventory):
            if domain and name != domain:
                continue
            shown: dict[str, Any] = {
                "file": entry.file,
                "where": entry.where,
                "vhost": entry.vhost,
                "routes": list(entry.routes),
                "domain": name,
                "stage": entry.stage,
                "hits_addend": entry.hits_addend or None,
                "apply_on_stream_done": entry.apply_on_stream_done,
                "sends": entry.shown(),
                "descriptors": [],
            }
            out.append(shown)
            if name not in config.domains:
                shown["error"] = f"domain {name!r} has no config"
                continue
            if any(p.problem for p in entry.parts):
                shown["error"] = "; ".join(p.problem for p in entry.parts if p.problem)
                continue
            for parts in sequences(entry.parts):
                d = _descriptor(config, options, name, parts, request, now, explained)
                left_out = [p.source for p in entry.parts if p.optional and p not in parts]
                if left_out:
                    d["absent"] = left_out
                dropped = [
                    p.drops
                    for p in parts
                    if p.drops and p.value is None and request.value(p) is None
                ]
                if dropped:
                    d["dropped_when"] = dropped
                shown["descriptors"].append(d)
    known = sorted({r for e in inventory.entries for r in e.routes})
    return {"route": route or None, "known_routes": known, "entries": out}


class Routes:
    """The rate limit filters and ``rate_limits`` entries of a set of Envoy or Istio
    files, read once; explained against whatever configuration is given."""

    def __init__(self, files: Sequence[str], inventory: Inventory) -> None:
        self.files = list(files)
        self.inventory = inventory

    @classmethod
    def read(cls, paths: Sequence[Path]) -> Routes:
        """Read the files (EnvoyFileError naming the file and the field otherwise)."""
        pieces = [piece for path in paths for piece in read_file(path)]
        return cls([str(p) for p in paths], collect(pieces))

    def listing(self) -> dict[str, Any]:
        """The files, the routes and the virtual hosts one can ask about."""
        entries = self.inventory.entries
        return {
            "files": self.files,
            "routes": sorted({r for e in entries for r in e.routes}),
            "virtual_hosts": sorted({e.vhost for e in entries if e.vhost}),
        }

    def explain(
        self,
        config: Config,
        options: EngineOptions,
        *,
        route: str = "",
        domain: str = "",
        headers: Sequence[str] = (),
        remote_address: str = "",
        names: tuple[str, str] = ("--header", "--remote-address"),
        now: float | None = None,
        explained: list[Explanation] | None = None,
    ) -> dict[str, Any]:
        """``explain_routes`` for a request with ``headers`` (``NAME=VALUE`` items) from
        ``remote_address``; a bad one is a SettingsError naming its option in ``names``."""
        if remote_address:
            try:
                ipaddress.ip_address(remote_address)
            except ValueError:
                raise SettingsError(
                    f"{names[1]}: {remote_address!r} is not an IP address"
                ) from None
        request = Request(parse_values(headers, names[0]), remote_address)
        return explain_routes(
            self.inventory, config, options, request, route, domain, now, explained
        )


def render(answer: dict[str, Any]) -> str:
    """The answer for people: per entry, the route, what it sends and what each reaches."""
    lines: list[str] = []
    if not answer["entries"]:
        wanted = f" for route {answer['route']!r}" if answer["route"] else ""
        known = ", ".join(answer["known_routes"]) or "none"
        lines.append(f"no rate_limits entry{wanted} (routes: {known})")
    for e in answer["entries"]:
        routes = ", ".join(e["routes"]) or "(every route)"
        extra = ""
        if e["hits_addend"]:
            extra += f", hits_addend {e['hits_addend']}"
        if e["apply_on_stream_done"]:
            extra += ", on stream done"
        vhost = f" (virtual host {e['vhost']})" if e["vhost"] else ""
        lines.append(f"route {routes}{vhost} -> domain {e['domain']}")
        lines.append(f"  {e['file']}: {e['where']}{extra}")
        lines.append(f"  sends [{e['sends']}]")
        if "error" in e:
            lines.append(f"  error: {e['error']}")
        for d in e["descriptors"]:
            lines.extend("  " + line for line in _descriptor_lines(d, e["domain"]))
    return "\n".join(lines) + "\n"


def _descriptor_lines(d: dict[str, Any], domain: str) -> list[str]:
    shown = ",".join(f"{k}={v if v is not None else '<' + s + '>'}" for k, v, s in d["entries"])
    lines = [f"descriptor {shown}"]
    for reason in d.get("conditions", []):
        lines.append(f"  not sent when {reason}")
    if d.get("absent"):
        lines.append(f"  when absent: {', '.join(d['absent'])}")
    for reason in d.get("dropped_when", []):
        if reason.endswith(" missing"):
            reason = f"the {reason.removesuffix(' missing')} is missing"
        lines.append(f"  not sent at all when {reason}")
    if "explain" in d:
        body = render_explained({"domain": domain, "descriptors": [d["explain"]]})
        lines.extend(body.splitlines()[2:])
        return lines
    for rule in d["reaches"]:
        when = f" when {', '.join(rule['only_when'])}" if rule["only_when"] else ""
        lines.append(f"  -> {rule_text(rule)}{when}")
    for stop in d["stops"]:
        if "no_limit" in stop:
            lines.append(f"  -> {stop['no_limit']}: no limit there")
        else:
            expected = ", ".join(stop["expected"]) or "nothing (a leaf)"
            lines.append(
                f"  -> stops at level {stop['level']}: no ({stop['key']}, {stop['value']}); "
                f"the tree has there: {expected}"
            )
    if not d["reaches"] and not d["stops"]:
        lines.append("  -> nothing")
    elif d["reaches"] and all(rule["only_when"] for rule in d["reaches"]):
        lines.append("  -> any other value: no rule, nothing counted")
    return lines
