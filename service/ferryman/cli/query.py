"""``ferryman query``: ask a running service ShouldRateLimit and print the answer."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from ferryman.cli.common import RAW, descriptor_arg
from ferryman.errors import RequestError, ServiceUnavailableError, SettingsError

if TYPE_CHECKING:
    from ferryman.cli.common import Subcommands
    from ferryman.client import RateLimitResult

__all__ = ["add_parser", "run"]

EXAMPLES = """examples:
  ferryman query --domain messaging --descriptor message_type=marketing,to_number=2061111111
  ferryman query --target rl:8081 --domain edge-proxy --descriptor remote_address=10.0.0.1 \\
      --hits 5 --format json
  ferryman query --target rl.example:8081 --ca-file ca.pem --cert-file me.pem \\
      --key-file me-key.pem --domain edge-proxy --descriptor remote_address=10.0.0.1"""


def add_parser(sub: Subcommands, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    query = sub.add_parser(
        "query",
        help="ask a running service (ShouldRateLimit); exit 0 OK, 1 OVER_LIMIT, 2 error",
        description="Ask a running ferryman ShouldRateLimit and print the answer. Exit status: "
        "0 when the overall code is OK, 1 when it is OVER_LIMIT, 2 on any error.",
        epilog=EXAMPLES,
        formatter_class=RAW,
        parents=parents,
    )
    query.add_argument(
        "--target", help="host:port of the gRPC service (default 127.0.0.1:$GRPC_PORT, 8081)"
    )
    query.add_argument("--domain", required=True)
    query.add_argument(
        "--descriptor",
        dest="descriptors",
        action="append",
        required=True,
        type=descriptor_arg,
        metavar="K=V[,K=V...]",
        help="one descriptor's entries, in order; repeat for several descriptors",
    )
    query.add_argument("--hits", type=int, default=1, help="hits to add (default 1)")
    query.add_argument(
        "--tls", action="store_true", help="speak TLS (implied by --ca-file and --cert-file)"
    )
    query.add_argument(
        "--ca-file", metavar="PEM", help="CA certificate to verify the service with (TLS)"
    )
    query.add_argument(
        "--cert-file", metavar="PEM", help="client certificate for mutual TLS (with --key-file)"
    )
    query.add_argument("--key-file", metavar="PEM", help="the client certificate's private key")
    query.add_argument(
        "--timeout", type=float, default=5.0, help="seconds to wait for the answer (default 5)"
    )
    query.add_argument(
        "--format", choices=("text", "json"), default="text", help="output (default text)"
    )
    return query


def run(args: argparse.Namespace) -> int:
    from ferryman.client import Client, Code

    target: str | None = args.target
    if target is None:
        port = os.environ.get("GRPC_PORT") or "8081"
        if not port.isdigit():
            raise SettingsError(f"GRPC_PORT={port!r} is not a port number (or pass --target)")
        target = f"127.0.0.1:{port}"
    try:
        with Client(
            target,
            timeout=args.timeout,
            fail_open=False,
            tls=args.tls,
            ca_file=args.ca_file,
            cert_file=args.cert_file,
            key_file=args.key_file,
        ) as client:
            result: RateLimitResult = client.should_rate_limit(
                args.domain, args.descriptors, hits=args.hits
            )
    except (RequestError, ServiceUnavailableError, ValueError) as exc:
        print(f"ferryman query: {exc}", file=sys.stderr)
        return 2
    if args.format == "json":
        _print_json(args.descriptors, result)
    else:
        _print_text(args.descriptors, result)
    return 0 if result.code is Code.OK else 1 if result.code is Code.OVER_LIMIT else 2


def _print_json(descriptors: list[list[tuple[str, str]]], result: RateLimitResult) -> None:
    statuses: list[dict[str, Any]] = []
    for entries, status in zip(descriptors, result.statuses, strict=False):
        limit = status.limit
        statuses.append(
            {
                "entries": [[k, v] for k, v in entries],
                "code": status.code.name,
                "limit": None
                if limit is None
                else {
                    "requests_per_unit": limit.requests_per_unit,
                    "unit": limit.unit,
                    "name": limit.name or None,
                },
                "remaining": status.remaining if limit is not None else None,
                "reset": status.reset,
            }
        )
    answer = {
        "overall": result.code.name,
        "descriptors": statuses,
        "headers": [[k, v] for k, v in result.headers],
    }
    print(json.dumps(answer))


def _print_text(descriptors: list[list[tuple[str, str]]], result: RateLimitResult) -> None:
    print(f"overall: {result.code.name}")
    for i, (entries, status) in enumerate(zip(descriptors, result.statuses, strict=False)):
        shown = ",".join(f"{k}={v}" for k, v in entries)
        if status.limit is None:
            detail = "no limit"
        else:
            limit = status.limit
            named = f" ({limit.name})" if limit.name else ""
            detail = f"limit {limit.requests_per_unit}/{limit.unit}{named}"
            detail += f", remaining {status.remaining}"
            if status.reset is not None:
                detail += f", resets in {status.reset:g}s"
        print(f"descriptor[{i}] {shown}: {status.code.name}, {detail}")
    for key, value in result.headers:
        print(f"header {key}: {value}")
