"""An Envoy JSON access log as the requests Envoy sent the rate limit service: each line's
route, headers and client address through the routes' ``rate_limits`` actions (as
``ferryman explain --envoy`` reads them), for ``ferryman replay --envoy``.

A line is one JSON object. Its time is ``start_time`` (ISO 8601) or ``timestamp`` (seconds);
its route ``route_name``, else the longest route match that prefixes its path; its client
address ``downstream_remote_address`` (the port dropped); every other string field is a
request header by its name (``path``, ``method`` and ``authority`` stand for ``:path``,
``:method`` and ``:authority``, and ``request_headers`` may hold them as an object).
The matchers of ``header_value_match`` and ``query_parameter_value_match`` actions are not
evaluated: their entries' descriptors are left out.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from ferryman.core.answers import DescriptorRequest
from ferryman.errors import FerrymanError
from ferryman.replay.decision_log import Logged

__all__ = ["read_access_log"]

_PSEUDO = {"path": ":path", "method": ":method", "authority": ":authority", "scheme": ":scheme"}


def _time(raw: dict[str, Any]) -> float:
    if "timestamp" in raw:
        return float(raw["timestamp"])
    text = str(raw["start_time"]).replace("Z", "+00:00")
    return datetime.fromisoformat(text).timestamp()


def _headers(raw: dict[str, Any]) -> dict[str, str]:
    headers = {_PSEUDO.get(k.lower(), k.lower()): v for k, v in raw.items() if isinstance(v, str)}
    nested = raw.get("request_headers")
    if isinstance(nested, dict):
        headers.update({k.lower(): str(v) for k, v in nested.items()})
    return headers


def _address(raw: dict[str, Any]) -> str:
    address = str(raw.get("downstream_remote_address") or raw.get("remote_address") or "")
    if address.startswith("["):  # [v6]:port
        return address[1:].partition("]")[0]
    host, sep, port = address.rpartition(":")
    return host if sep and port.isdigit() and host.count(":") == 0 else address


def _route(raw: dict[str, Any], path: str, labels: Sequence[str]) -> str:
    named = raw.get("route_name")
    if isinstance(named, str) and named and named != "-":
        return named
    prefixes = [label for label in labels if path.startswith(label)]
    return max(prefixes, key=len) if prefixes else ""


def read_access_log(path: Path, envoy_files: Sequence[Path]) -> Iterator[Logged]:
    """The requests each line of ``path`` made Envoy send, one per domain and stage."""
    from ferryman.envoy import needs_envoy_data_plane

    needs_envoy_data_plane("ferryman replay --envoy")
    from ferryman.envoy.routes import Request, Routes

    inventory = Routes.read(envoy_files).inventory
    return _read(path, inventory, Request)


def _read(path: Path, inventory: Any, request_of: Any) -> Iterator[Logged]:
    labels = sorted({r for e in inventory.entries for r in e.routes})
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
                t = _time(raw)
            except (ValueError, KeyError, TypeError) as exc:
                message = f"{path}:{number}: not an Envoy JSON access log line: {exc}"
                raise FerrymanError(message) from None
            request = request_of(_headers(raw), _address(raw))
            route = _route(raw, request.headers.get(":path", ""), labels)
            sent: dict[tuple[str, int, bool], list[DescriptorRequest]] = {}
            for entry in inventory.entries:
                if route not in entry.routes:
                    continue
                descriptor = _descriptor(entry.parts, request, entry.hits_addend)
                if descriptor is None:
                    continue
                for domain in _domains_of(entry, inventory):
                    key = (domain, entry.stage, entry.apply_on_stream_done)
                    sent.setdefault(key, []).append(descriptor)
            for (domain, _, _), descriptors in sent.items():
                yield Logged(t, domain, 0, tuple(descriptors), (), "")


def _descriptor(parts: Sequence[Any], request: Any, addend: str) -> DescriptorRequest | None:
    """The descriptor the actions make of ``request``, or None when Envoy sends none."""
    entries: list[tuple[str, str]] = []
    for part in parts:
        if part.value is not None and part.drops:
            return None  # a header or query match: its matchers are not evaluated here
        value = part.value if part.value is not None else request.value(part)
        if value is None:
            if part.optional:
                continue
            return None
        entries.append((part.key, str(value)))
    if not entries:
        return None
    hits = None
    negative = addend.startswith("-")
    if addend.lstrip("-").isdigit():
        hits = int(addend.lstrip("-"))
    return DescriptorRequest(tuple(entries), None, hits, negative and hits is not None)


def _domains_of(entry: Any, inventory: Any) -> list[str]:
    if entry.domain:
        return [entry.domain]
    pool = inventory.filters if entry.filters is None else list(entry.filters)
    return sorted({f.domain for f in pool if f.stage == entry.stage})
