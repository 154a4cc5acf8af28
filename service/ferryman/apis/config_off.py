"""The config API while it is off (no ADMIN_TOKENS_FILE, CONFIG_STORE=files): its paths
answer 404 saying how to turn it on, and the config API itself is not imported."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ferryman.edge.http import Handler, HttpRequest, HttpResponse

if TYPE_CHECKING:
    from ferryman.config.store import ConfigStore
    from ferryman.settings import Settings

__all__ = ["OFF", "PREFIX", "ConfigApiOff", "config_api_on"]

PREFIX = "/api/v1"
OFF = b"the config API is off: set ADMIN_TOKENS_FILE to a token file\n"


def config_api_on(settings: Settings) -> bool:
    """Whether the settings turn the config API on (a token file, or versions in Redis)."""
    return bool(settings.admin_tokens_file) or settings.config_store == "redis"


class ConfigApiOff:
    """Stands where ``ConfigApi`` would: nothing to start, no store, every path off."""

    store: ConfigStore | None = None
    owns_config = False

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def routes(self) -> dict[tuple[str, str], Handler]:
        methods = ("GET", "PUT", "POST", "DELETE")
        return {(method, f"{PREFIX}/*"): self._off for method in methods}

    async def _off(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(404, OFF)
