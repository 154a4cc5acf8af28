"""Random and mutated messages for every method of every gRPC API, sent as raw bytes to a
real server, and what a well-behaved answer is."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import message_factory

from ferryman.apis import APIS

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
