"""The console: a page on the debug port that shows what the limiter is doing.

The page (``index.html``, ``console.js``, ``console.css`` beside this file, shipped as package
data) is static and works offline; it polls JSON endpoints served here:

- ``/console/config``: the configuration in force as trees, its version and load time, the
  last load error, and the Envoy files whose routes ``/explain/envoy`` explains;
- ``/console/data?since=T``: the samples taken after T (see :class:`Sampler`), the top
  over-limit series, and the held-resource state;
- ``/console/tenant?domain=D&descriptor=k=v[,k=v...]``: one tenant's burst tiers now (the
  current tier, each tier's phase, hits in its window, when its active period and cooldown
  end), read from the backend without counting anything;
- ``/console/panels`` and ``/console/panel?id=ID``: extra panels, each a table that a part
  of the service registers with :meth:`Console.add_panel` (the page draws every one it
  lists, so a new feature adds a panel without touching the page).

Everything comes from the server's own state and counters, bounded in memory.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

from ferryman.algorithms import BY_NAME, algorithm_of
from ferryman.apis.console.sampler import LatencyRecorder, Sampler, SpaceSaving, series_label
from ferryman.apis.console.simulator import Simulator
from ferryman.apis.holds import HoldManager
from ferryman.backends.base import Backend
from ferryman.clock import Clock
from ferryman.config.reloader import ConfigHolder
from ferryman.core.rules import Level, Rule
from ferryman.edge.http import Handler, HttpRequest, HttpResponse
from ferryman.engine import RateLimitEngine
from ferryman.engine.explain import parse_descriptor
from ferryman.errors import FerrymanError, RequestError, status_of
from ferryman.stats import Stats

__all__ = ["Console", "LatencyRecorder", "Panel", "Sampler", "SpaceSaving"]

STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/console/console.js": ("console.js", "text/javascript; charset=utf-8"),
    "/console/console.css": ("console.css", "text/css; charset=utf-8"),
    "/console/editor.js": ("editor.js", "text/javascript; charset=utf-8"),
    "/console/simulator.js": ("simulator.js", "text/javascript; charset=utf-8"),
}
TOP = 10  # over-limit series shown
SESSIONS = 50  # sessions listed, the biggest holders first
JSON = "application/json"


@dataclass(frozen=True)
class Panel:
    """An extra console panel: a title and a function returning its table as
    ``{"columns": [...], "rows": [[...], ...], "note": "..."}`` (or a coroutine of it)."""

    id: str
    title: str
    read: Callable[[], dict[str, Any] | Awaitable[dict[str, Any]]]


def _node(rule: Rule) -> dict[str, Any]:
    """One node of a domain's tree, as the page draws it."""
    node: dict[str, Any] = {
        "key": rule.key,
        "value": rule.value or None,
        "stats_key": rule.stats_key,
        "series": series_label(rule.stats_path or None),
        "source": rule.source,
        "shadow_mode": rule.shadow_mode,
        "quota_mode": rule.quota_mode,
        "detailed_metric": rule.detailed_metric,
    }
    if rule.limit is None:
        node["kind"] = "none"
    else:
        algorithm = algorithm_of(rule.limit.kind)
        described = algorithm.describe(rule.limit)
        node["kind"] = described["kind"]
        node["numbers"] = algorithm.text(described) if described["kind"] in BY_NAME else "unlimited"
        node["name"] = rule.name or None
        if "tier_list" in described:
            node["tiers"] = described["tier_list"]
    if rule.replaces:
        node["replaces"] = list(rule.replaces)
    node["children"] = _level(rule.children)
    return node


def _level(level: Level) -> list[dict[str, Any]]:
    return [_node(rule) for rule in level.rules]


def _iso_or_none(epoch: float, present: bool) -> float | None:
    return round(epoch, 3) if present else None


class Console:
    """The console's endpoints and its sampler, for one Service."""

    def __init__(
        self,
        stats: Stats,
        holder: ConfigHolder,
        holds: HoldManager,
        latency: LatencyRecorder,
        engine: RateLimitEngine,
        backend: Backend,
        clock: Clock,
        *,
        directory: str = "",
        envoy_files: tuple[str, ...] = (),
        help_text: str = "",
        interval: float = 3.0,
    ) -> None:
        self.stats = stats
        self.holder = holder
        self.holds = holds
        self.engine = engine
        self.backend = backend
        self.clock = clock
        self.directory = directory
        self.envoy_files = envoy_files
        self.help_text = help_text
        self.sampler = Sampler(stats, latency, self._hold_gauges, interval=interval)
        self.panels: dict[str, Panel] = {}
        self.add_panel("sessions", "Sessions", self._sessions_panel)

    def add_panel(
        self,
        panel_id: str,
        title: str,
        read: Callable[[], dict[str, Any] | Awaitable[dict[str, Any]]],
    ) -> None:
        """Show a table on the console; ``read`` (a function or a coroutine function) is
        called on every refresh and must be cheap and bounded (a few dozen rows)."""
        self.panels[panel_id] = Panel(panel_id, title, read)

    def start(self) -> None:
        self.sampler.start()

    async def stop(self) -> None:
        await self.sampler.stop()

    def routes(self) -> dict[tuple[str, str], Handler]:
        routes: dict[tuple[str, str], Handler] = {("GET", path): self._static for path in STATIC}
        routes.update(
            {
                ("GET", "/help"): self._help,
                ("GET", "/console/config"): self._config,
                ("GET", "/console/data"): self._data,
                ("GET", "/console/tenant"): self._tenant,
                ("GET", "/console/panels"): self._panels,
                ("GET", "/console/panel"): self._panel,
                ("GET", "/console/simulate"): Simulator(lambda: self.holder.config).page,
            }
        )
        return routes

    # -- state ------------------------------------------------------------------------

    def _hold_gauges(self) -> dict[str, int]:
        return {"sessions": self.holds.session_count(), "copies": self.holds.copies_held}

    def config(self) -> dict[str, Any]:
        """The configuration in force as trees, with its load state."""
        holder = self.holder
        config = holder.config
        domains = []
        if config is not None:
            for name in sorted(config.domains):
                domain = config.domains[name]
                domains.append(
                    {"name": name, "files": list(domain.files), "nodes": _level(domain.root)}
                )
        return {
            "version": holder.version,
            "loaded_at": _iso_or_none(holder.loaded_at, config is not None),
            "directory": self.directory,
            "last_error": holder.last_error,
            "last_error_at": _iso_or_none(holder.last_error_at, bool(holder.last_error)),
            "domains": domains,
            # The Envoy files /explain/envoy explains (ENVOY_CONFIG_FILES).
            "envoy_files": list(self.envoy_files),
        }

    def holds_state(self) -> dict[str, Any]:
        holds = self.holds
        return {
            **holds.status(),
            "groups": [{**labels, "held": held} for labels, held in holds.by_group()],
            "transfers": {
                "staged": self.stats.get("ratelimit.service.holds.transfers_staged"),
                "seized": self.stats.get("ratelimit.service.holds.transfers_seized"),
                "expired": holds.transfers_expired,
            },
        }

    def data(self, since: float) -> dict[str, Any]:
        """Samples after ``since``, the top over-limit series and the held resources."""
        holder = self.holder
        return {
            "interval": self.sampler.interval,
            "span": self.sampler.span,
            "config_version": holder.version,
            "config_error": holder.last_error,
            "samples": self.sampler.since(since),
            "top_over_limit": [
                {"series": key, "weight": round(count, 2), "error": round(error, 2)}
                for key, count, error in self.sampler.top.top(TOP)
            ],
            "holds": self.holds_state(),
        }

    async def tenant(self, domain: str, entries: list[tuple[str, str]]) -> dict[str, Any]:
        """One tenant's tiers now, read through its rule's kind without counting;
        RequestError / NotFoundError for a descriptor that reaches no node with tiers."""
        path = self.engine.resolve(domain, entries, tuple(BY_NAME), "limit")
        rule = path[-1]
        assert rule.limit is not None
        algorithm = algorithm_of(rule.limit.kind)
        now = self.clock.now()  # as the engine decides (a Redis store may use its own clock)
        target = algorithm.target(self.engine.options, domain, path, entries, now)
        seen = {}
        if target is not None:
            seen = await algorithm.peek(self.backend.store(algorithm.name), target, now)
        if "tiers" not in seen:
            raise RequestError(
                "descriptor", f"{rule.stats_key} has no tiers to show: it is not a burst-tier node"
            )
        return {
            "domain": domain,
            "entries": [list(e) for e in entries],
            "series": series_label(rule.stats_path or None),
            **seen,
        }

    def _sessions_panel(self) -> dict[str, Any]:
        sessions = sorted(self.holds.sessions.values(), key=lambda s: -s.held)
        rows: list[list[Any]] = [[s.id[:12], s.client, s.held] for s in sessions[:SESSIONS]]
        note = f"{len(sessions)} open" + (
            f", the {SESSIONS} biggest holders shown" if len(sessions) > SESSIONS else ""
        )
        return {"columns": ["session", "client", "copies held"], "rows": rows, "note": note}

    # -- handlers ---------------------------------------------------------------------

    async def _static(self, request: HttpRequest) -> HttpResponse:
        name, content_type = STATIC[request.path]
        body = resources.files(__package__ or __name__).joinpath(name).read_bytes()
        return HttpResponse(200, body, content_type, {"Cache-Control": "no-cache"})

    async def _help(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(200, self.help_text.encode())

    async def _config(self, request: HttpRequest) -> HttpResponse:
        return _json(self.config())

    async def _data(self, request: HttpRequest) -> HttpResponse:
        raw = parse_qs(request.query).get("since", ["0"])[0]
        try:
            since = float(raw)
        except ValueError:
            return _json({"error": f"since: {raw!r} is not a number of seconds"}, 400)
        return _json(self.data(since))

    async def _tenant(self, request: HttpRequest) -> HttpResponse:
        params = parse_qs(request.query)
        domain = params.get("domain", [""])[0]
        try:
            text = params.get("descriptor", [""])[0]
            if not text:
                raise RequestError("descriptor", "give descriptor=k=v[,k=v...]")
            return _json(await self.tenant(domain, parse_descriptor(text)))
        except FerrymanError as exc:
            return _json({"error": str(exc)}, status_of(exc).http)

    async def _panels(self, request: HttpRequest) -> HttpResponse:
        return _json({"panels": [{"id": p.id, "title": p.title} for p in self.panels.values()]})

    async def _panel(self, request: HttpRequest) -> HttpResponse:
        panel_id = parse_qs(request.query).get("id", [""])[0]
        panel = self.panels.get(panel_id)
        if panel is None:
            known = ", ".join(self.panels)
            return _json({"error": f"no panel {panel_id!r} (known: {known})"}, 404)
        table = panel.read()
        if inspect.isawaitable(table):
            table = await table
        return _json({"id": panel.id, "title": panel.title, **table})


def _json(body: dict[str, Any], status: int = 200) -> HttpResponse:
    return HttpResponse(status, (json.dumps(body) + "\n").encode(), JSON)
