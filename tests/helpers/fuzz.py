"""Random and mutated messages for every method of every gRPC API, sent as raw bytes to a
real server, and random and mutated requests for every route of its HTTP ports; and what a
well-behaved answer is."""

from __future__ import annotations

import http.client
import json
import random
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote_from_bytes

import grpc
from google.protobuf import message_factory

from ferryman.apis import APIS
from ferryman.server.app import Service
from ferryman.settings import Settings

#: Codes a call may be answered with: anything but the server failing in itself.
FAILURES = frozenset({grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.DATA_LOSS})


@dataclass(frozen=True)
class Target:
    """One method: its path, whether the client or the server streams, and a valid
    request's bytes to mutate."""

    path: str
    client_streams: bool
    server_streams: bool
    seed: bytes


def _seed(descriptor: Any) -> bytes:
    """A plausible request: every string field "x", every number 1, one of each repeated
    message, so that mutations reach past the first field."""
    message = message_factory.GetMessageClass(descriptor)()
    _fill(message, depth=0)
    data: bytes = message.SerializePartialToString()
    return data


def _fill(message: Any, depth: int) -> None:
    for field in message.DESCRIPTOR.fields:
        if field.containing_oneof is not None and field.containing_oneof.fields[0] is not field:
            continue
        repeated = bool(field.is_repeated)
        if field.message_type is not None:
            if depth > 3 or field.message_type.GetOptions().map_entry:
                continue
            child = getattr(message, field.name).add() if repeated else getattr(message, field.name)
            _fill(child, depth + 1)
            continue
        value: Any = {
            field.TYPE_STRING: "x",
            field.TYPE_BYTES: b"x",
            field.TYPE_BOOL: True,
            field.TYPE_DOUBLE: 1.0,
            field.TYPE_FLOAT: 1.0,
        }.get(field.type, 1)
        if repeated:
            getattr(message, field.name).append(value)
        else:
            setattr(message, field.name, value)


def targets() -> list[Target]:
    """Every method of every registered API."""
    found = []
    for api in APIS:
        for method in api.service.methods:
            found.append(
                Target(
                    f"/{api.name}/{method.name}",
                    bool(method.client_streaming),
                    bool(method.server_streaming),
                    _seed(method.input_type),
                )
            )
    return found


def mutated(seed: bytes, rng: random.Random) -> bytes:
    """``seed`` with a few bytes flipped, cut, repeated or spliced in."""
    data = bytearray(seed)
    for _ in range(rng.randint(1, 4)):
        choice = rng.randrange(4)
        if choice == 0 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif choice == 1 and data:
            del data[rng.randrange(len(data)) :]
        elif choice == 2:
            data += data[: rng.randint(0, len(data))]
        else:
            at = rng.randint(0, len(data))
            data[at:at] = rng.randbytes(rng.randint(1, 8))
    return bytes(data)


def send(channel: grpc.Channel, target: Target, payload: bytes) -> grpc.StatusCode:
    """One call of ``target`` carrying ``payload``: the status it ended with (a stream is
    read for its first answer, a short while, and then cancelled: an idle watch stream
    ends DEADLINE_EXCEEDED)."""
    try:
        if target.client_streams:
            call = channel.stream_stream(target.path, None, None)(iter([payload]), timeout=0.2)
            _first(call)
        elif target.server_streams:
            call = channel.unary_stream(target.path, None, None)(payload, timeout=0.2)
            _first(call)
        else:
            channel.unary_unary(target.path, None, None)(payload, timeout=2)
    except grpc.RpcError as error:
        code: grpc.StatusCode = error.code()
        return code
    return grpc.StatusCode.OK


def _first(call: Any) -> None:
    try:
        next(call)
    except StopIteration:
        pass
    finally:
        call.cancel()


def cases(seed: int, count: int) -> Iterator[tuple[Target, bytes]]:
    """``count`` (method, payload) pairs: random bytes, or a mutated valid request."""
    rng = random.Random(seed)
    every = targets()
    for _ in range(count):
        target = rng.choice(every)
        if rng.random() < 0.3:
            yield target, rng.randbytes(rng.randint(0, 64))
        else:
            yield target, mutated(target.seed, rng)


# -- the HTTP ports ------------------------------------------------------------------------

#: A valid body per route that takes one; a route not listed is sent its query string.
HTTP_SEEDS: dict[str, object] = {
    "/json": {
        "domain": "mx",
        "descriptors": [{"entries": [{"key": "fixed", "value": "a"}], "hitsAddend": 1}],
    },
    "/quota/allow": {"namespace": "users", "bucket_name": "b", "tokens_requested": 1},
}
#: A valid query string per debug page that reads one.
HTTP_QUERIES = {
    "/explain": "domain=mx&descriptor=fixed=a",
    "/rlqs/explain": "domain=mx&bucket=fixed=a",
    "/console/tenant": "domain=mx&descriptor=tiers=t",
    "/console/data": "since=0",
    "/console/panel": "id=sessions",
    "/console/simulate": "domain=mx&descriptor=tiers=t&seconds=10&rate=5",
    "/unconfigured": "top=5",
}
# Values a JSON field is swapped for: wrong types, extremes, long and odd strings.
_ODD: list[object] = [
    None,
    True,
    -1,
    0,
    2**32,
    2**64,
    -(2**63),
    1e308,
    0.5,
    "",
    "x" * 5000,
    "\u0000\ud800",
    "../../etc/passwd",
    "<script>",
    [],
    {},
    [[[[[[]]]]]],
    {"a": {"b": {"c": {}}}},
]


@dataclass(frozen=True)
class Route:
    """One route of an HTTP port: the port's name, its method and path."""

    port: str
    method: str
    path: str


def http_routes() -> list[Route]:
    """Every route a Service serves on its HTTP and debug ports, the config API's aside
    (read from a Service's routing table, so that a new route is fuzzed too)."""
    service = Service(Settings(config_dir=Path(tempfile.gettempdir())))
    return [
        Route(port, method, path)
        for port, server in service.http_servers.items()
        for method, path in server.routes
        if not path.startswith("/api/")
    ]


def _swapped(value: object, rng: random.Random) -> object:
    """``value`` with one field, anywhere in it, replaced by an odd value."""
    if isinstance(value, dict) and value:
        key = rng.choice(list(value))
        inner = rng.random() < 0.5 and isinstance(value[key], (dict, list))
        return {**value, key: _swapped(value[key], rng) if inner else rng.choice(_ODD)}
    if isinstance(value, list) and value:
        at = rng.randrange(len(value))
        return [*value[:at], _swapped(value[at], rng), *value[at + 1 :]]
    return rng.choice(_ODD)


def http_case(route: Route, rng: random.Random) -> tuple[str, bytes]:
    """A request target and body for ``route``: random bytes, a body with a field swapped
    for an odd value, a deeply nested body, or a mutated valid body or query."""
    seed = HTTP_SEEDS.get(route.path)
    query = HTTP_QUERIES.get(route.path, "")
    choice = rng.random()
    if seed is None:
        text = query.encode() if choice < 0.7 else rng.randbytes(rng.randint(0, 32))
        mangled = mutated(text, rng) if choice < 0.7 else text
        return route.path + "?" + quote_from_bytes(mangled, safe="=&,"), b""
    if choice < 0.2:
        return route.path, rng.randbytes(rng.randint(0, 64))
    if choice < 0.25:
        depth = rng.choice([33, 1000, 100_000])
        return route.path, b"[" * depth + b"]" * depth
    if choice < 0.7:
        return route.path, json.dumps(_swapped(seed, rng)).encode()
    return route.path, mutated(json.dumps(seed).encode(), rng)


def http_cases(seed: int, count: int) -> Iterator[tuple[Route, str, bytes]]:
    """``count`` (route, target, body) triples over every route."""
    rng = random.Random(seed)
    every = http_routes()
    for _ in range(count):
        route = rng.choice(every)
        target, body = http_case(route, rng)
        yield route, target, body


def http_send(conn: http.client.HTTPConnection, route: Route, target: str, body: bytes) -> int:
    """One request on a kept-alive connection: its status (0 when the connection failed;
    the connection is opened again on the next request)."""
    try:
        conn.request(route.method, target, body=body or None)
        response = conn.getresponse()
        response.read()
        if response.will_close:
            conn.close()
    except (OSError, http.client.HTTPException):
        conn.close()
        return 0
    return response.status


def http_failed(status: int) -> bool:
    """An answer that means the server failed in itself (a 503 for a full port is not)."""
    return status == 0 or (status >= 500 and status != 503)
