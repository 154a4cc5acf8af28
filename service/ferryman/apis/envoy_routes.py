"""/explain/envoy on the debug port: for a route of the Envoy or Istio files that
ENVOY_CONFIG_FILES (``ferryman serve --envoy FILE``) names, the descriptors Envoy sends and
what each reaches, against the configuration in force and with the current counts: the
answer of ``ferryman explain --envoy FILE --route NAME --format json``.

The files are read once, at start. The Envoy tools (and envoy-data-plane, the optional
``ferryman[envoy]`` extra) are imported then, and only when the setting is given: ``read_routes``
is the server's one place that imports them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs

from ferryman.backends.base import Backend
from ferryman.clock import Clock
from ferryman.config.model import Config
from ferryman.config.reloader import ConfigHolder
from ferryman.core.answers import EngineOptions
from ferryman.edge.http import HttpRequest, HttpResponse
from ferryman.engine.explain import Explanation, read_now
from ferryman.errors import FerrymanError, NotFoundError, RequestError, status_of

__all__ = ["EnvoyRoutes", "read_routes"]

PARAMETERS = ("route", "domain", "header", "remote_address")


class _Routes(Protocol):
    """What the server asks of ``ferryman.envoy.routes.Routes``."""

    def listing(self) -> dict[str, Any]: ...

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
    ) -> dict[str, Any]: ...


def read_routes(files: Sequence[str]) -> _Routes | None:
    """The files' routes (None without files); SettingsError when the extra is missing,
    EnvoyFileError when a file cannot be read."""
    if not files:
        return None
    from ferryman.envoy import needs_envoy_data_plane

    needs_envoy_data_plane("ENVOY_CONFIG_FILES (ferryman serve --envoy)")
    from ferryman.envoy.routes import Routes

    return Routes.read([Path(f) for f in files])


class EnvoyRoutes:
    """The page, over the routes read at start (None without ENVOY_CONFIG_FILES)."""

    def __init__(
        self,
        routes: _Routes | None,
        holder: ConfigHolder,
        options: EngineOptions,
        backend: Backend,
        clock: Clock,
    ) -> None:
        self.routes = routes
        self._holder = holder
        self._options = options
        self._backend = backend
        self._clock = clock

    async def page(self, request: HttpRequest) -> HttpResponse:
        """/explain/envoy: the files and their routes; ?route=NAME[&header=NAME=VALUE...]
        [&remote_address=IP][&domain=D]: what that route sends and reaches (JSON)."""
        try:
            body = await self._answer(parse_qs(request.query, keep_blank_values=True))
        except FerrymanError as exc:
            error = json.dumps({"error": str(exc)}) + "\n"
            return HttpResponse(status_of(exc).http, error.encode(), "application/json")
        return HttpResponse(200, (json.dumps(body, indent=2) + "\n").encode(), "application/json")

    async def _answer(self, params: dict[str, list[str]]) -> dict[str, Any]:
        if self.routes is None:
            raise NotFoundError(
                "ENVOY_CONFIG_FILES",
                "not set: no Envoy files to explain (start with ferryman serve --envoy FILE)",
            )
        for name, values in params.items():
            if name not in PARAMETERS:
                raise RequestError(name, f"unknown parameter (known: {', '.join(PARAMETERS)})")
            if name != "header" and len(values) > 1:
                raise RequestError(name, "give it once")
        route = params.get("route", [""])[0]
        if not route:
            if "route" in params:
                raise RequestError("route", "empty: give a route or virtual host name")
            return self.routes.listing()
        config = self._holder.config
        if config is None:
            raise RequestError("route", "no rate limit configuration is loaded")
        now = self._clock.now()
        explained: list[Explanation] = []
        answer = self.routes.explain(
            config,
            self._options,
            route=route,
            domain=params.get("domain", [""])[0],
            headers=params.get("header", []),
            remote_address=params.get("remote_address", [""])[0],
            names=("header", "remote_address"),
            now=now,
            explained=explained,
        )
        if not answer["entries"]:
            known = ", ".join(answer["known_routes"]) or "none"
            raise NotFoundError("route", f"no rate_limits entry for {route!r} (routes: {known})")
        for one in explained:
            await read_now(self._backend.store, one, now)
        return answer
