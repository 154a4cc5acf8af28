"""The console's tier simulator: ``GET /console/simulate`` runs a traffic shape against a
node of the configuration in force (or a node pasted as YAML) through the real engine on a
virtual clock, with its own memory backend: the server's counters are never touched."""

from __future__ import annotations

import json
from collections.abc import Callable
from urllib.parse import parse_qs

from ferryman.config.model import Config
from ferryman.edge.http import HttpRequest, HttpResponse
from ferryman.engine.explain import parse_descriptor
from ferryman.errors import FerrymanError, RequestError
from ferryman.simulate import tiers

__all__ = ["MAX_REQUESTS", "Simulator"]

#: The requests one simulation may send (it runs on the event loop: keep it short).
MAX_REQUESTS = 20_000
MAX_SECONDS = 3600


def _number(params: dict[str, list[str]], name: str, default: float, high: float) -> float:
    text = params.get(name, [""])[0].strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise RequestError(name, f"{text!r} is not a number") from None
    if not 0 <= value <= high:
        raise RequestError(name, f"{value:g} is out of range (0 to {high:g})")
    return value


def _pairs(params: dict[str, list[str]], name: str) -> list[tuple[float, float]]:
    out = []
    for text in params.get(name, []):
        for item in text.replace(",", " ").split():
            first, _, second = item.partition(":")
            try:
                out.append((float(first), float(second)))
            except ValueError:
                raise RequestError(name, f"{item!r} is not A:B") from None
    return out


def shape_of(params: dict[str, list[str]]) -> tiers.Shape:
    """The traffic shape a query asks for: seconds, rate, on_off=ON:OFF, burst=AT:N."""
    seconds = int(_number(params, "seconds", 60, MAX_SECONDS))
    rate = _number(params, "rate", 0, MAX_REQUESTS)
    on_off = _pairs(params, "on_off")
    on, off = on_off[0] if on_off else (0.0, 0.0)
    bursts = tuple((at, int(n)) for at, n in _pairs(params, "burst"))
    shape = tiers.Shape(max(1, seconds), rate, on, off, bursts)
    if seconds * rate + sum(n for _, n in bursts) > MAX_REQUESTS:
        raise RequestError("rate", f"at most {MAX_REQUESTS} requests in one simulation")
    return shape


class Simulator:
    """The handler, over the configuration in force."""

    def __init__(self, config: Callable[[], Config | None]) -> None:
        self._config = config

    async def page(self, request: HttpRequest) -> HttpResponse:
        params = parse_qs(request.query)
        try:
            shape = shape_of(params)
            node = params.get("node", [""])[0].strip()
            if node:
                config = tiers.node_config(node)
                domain, entries = tiers.DOMAIN, [(tiers.KEY, tiers.TENANT)]
            else:
                found = self._config()
                if found is None:
                    raise RequestError("domain", "no rate limit configuration is loaded")
                config, domain = found, params.get("domain", [""])[0]
                entries = parse_descriptor(params.get("descriptor", [""])[0])
            rows = await tiers.simulate(config, domain, entries, shape)
        except FerrymanError as exc:
            body = json.dumps({"error": str(exc)}) + "\n"
            return HttpResponse(400, body.encode(), "application/json")
        answer = {"domain": domain, "per_second": [r.as_dict() for r in rows]}
        return HttpResponse(200, (json.dumps(answer) + "\n").encode(), "application/json")
