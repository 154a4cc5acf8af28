"""``ferryman serve | check | query``: the command line."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from ferryman.config.loader import load_directory
from ferryman.errors import ConfigError, FerrymanError
from ferryman.settings import Settings, split_address

__all__ = ["main"]

_LEVELS = {
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "FATAL": logging.CRITICAL,
    "PANIC": logging.CRITICAL,
    "TRACE": logging.DEBUG,
}


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def _setup_logging(settings: Settings) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_format == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS.get(settings.log_level, logging.WARNING))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ferryman", description="A rate limit service for Envoy.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the service")
    serve.add_argument("--config", type=Path, help="descriptor directory (default: descriptors/)")
    serve.add_argument(
        "--backend",
        help="memory (default), redis://host:port, rediss://..., redis+cluster://h:p,h:p, "
        "redis+sentinel://h:p,h:p/master or unix:///path",
    )
    serve.add_argument(
        "--fail-open",
        action="store_true",
        default=None,
        help="answer OK (counted as degraded) when the backend fails (FAIL_OPEN)",
    )
    serve.add_argument("--grpc-port", type=int, help="gRPC port (GRPC_PORT, default 8081)")
    serve.add_argument("--http-port", type=int, help="HTTP port (PORT, default 8080)")
    serve.add_argument("--debug-port", type=int, help="debug HTTP port (DEBUG_PORT, default 6070)")
    serve.add_argument(
        "--parent",
        metavar="HOST:PORT",
        help="lease capacity from this doorman.Capacity server (DOORMAN_PARENT)",
    )
    check = sub.add_parser("check", help="validate a descriptor directory")
    check.add_argument("directory", type=Path)
    query = sub.add_parser(
        "query",
        help="ask a running service (ShouldRateLimit); exit 0 OK, 1 OVER_LIMIT, 2 error",
        description="Ask a running ferryman ShouldRateLimit and print the answer. Exit status: "
        "0 when the overall code is OK, 1 when it is OVER_LIMIT, 2 on any error.",
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
        type=_descriptor_arg,
        metavar="K=V[,K=V...]",
        help="one descriptor's entries, in order; repeat for several descriptors",
    )
    query.add_argument("--hits", type=int, default=1, help="hits to add (default 1)")
    query.add_argument(
        "--timeout", type=float, default=5.0, help="seconds to wait for the answer (default 5)"
    )
    return parser


def _descriptor_arg(text: str) -> list[tuple[str, str]]:
    entries = []
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"{part!r} is not key=value (in {text!r})")
        entries.append((key, value))
    return entries


def _serve(args: argparse.Namespace) -> int:
    from ferryman.server.app import Service, run

    settings = Settings.from_env()
    changes: dict[str, object] = {}
    if args.config is not None:
        changes["config_dir"] = args.config
        changes["runtime_root"] = None
    if args.backend is not None:
        changes["backend"] = args.backend
    if args.fail_open:
        changes["fail_open"] = True
    if args.parent is not None:
        split_address(args.parent, "--parent")
        changes["doorman_parent"] = args.parent
    for flag, name in (
        ("grpc_port", "grpc_port"),
        ("http_port", "port"),
        ("debug_port", "debug_port"),
    ):
        value = getattr(args, flag)
        if value is not None:
            changes[name] = value
    settings = settings.with_overrides(**changes)
    _setup_logging(settings)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run(Service(settings), stop)

    asyncio.run(main())
    return 0


def _check(args: argparse.Namespace) -> int:
    directory: Path = args.directory
    settings = Settings.from_env()
    try:
        config = load_directory(
            directory,
            ignore_dotfiles=settings.ignore_dotfiles,
            merge_domains=settings.merge_domain_config,
        )
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"error: {problem}")
        print(f"{len(exc.problems)} error(s) in {directory}")
        return 1
    for note in config.notes:
        print(f"note: {note}")
    for name in sorted(config.domains):
        domain = config.domains[name]
        print(f"domain {name} ({', '.join(domain.files)})")
        for dom, rule in config.iter_limits():
            if dom != name:
                continue
            limit = rule.rate_limit
            if rule.burst is not None:
                what = rule.burst.describe()
            elif rule.copies is not None:
                what = rule.copies.describe()
            elif limit is None:
                continue
            elif limit.unlimited:
                what = "unlimited"
            else:
                unit = limit.unit.name.lower() if limit.unit is not None else "?"
                what = f"{limit.requests_per_unit}/{unit}"
            flags = [f for f in ("shadow_mode", "quota_mode") if getattr(rule, f)]
            suffix = f" [{', '.join(flags)}]" if flags else ""
            named = f" name={limit.name}" if limit is not None and limit.name else ""
            print(f"  {rule.stats_key}: {what}{named}{suffix}")
    for template in config.resources:
        spec = template.algorithm
        safe = "" if template.safe_capacity is None else f" safe={template.safe_capacity:g}"
        print(
            f"resource {template.identifier_glob}: capacity {template.capacity:g}{safe}, "
            f"{spec.kind.name} lease {spec.lease_length}s refresh {spec.refresh_interval}s "
            f"({template.source})"
        )
    resources = f", {len(config.resources)} resource(s)" if config.resources else ""
    print(f"OK: {len(config.domains)} domain(s), {len(config.iter_limits())} limit(s){resources}")
    return 0


def _query(args: argparse.Namespace) -> int:
    from ferryman.client import Client, Code, RateLimitResult
    from ferryman.errors import RequestError, ServiceUnavailableError

    target: str | None = args.target
    if target is None:
        port = os.environ.get("GRPC_PORT") or "8081"
        if not port.isdigit():
            print(f"ferryman query: GRPC_PORT={port!r} is not a port number", file=sys.stderr)
            return 2
        target = f"127.0.0.1:{port}"
    try:
        with Client(target, timeout=args.timeout, fail_open=False) as client:
            result: RateLimitResult = client.should_rate_limit(
                args.domain, args.descriptors, hits=args.hits
            )
    except (RequestError, ServiceUnavailableError, ValueError) as exc:
        print(f"ferryman query: {exc}", file=sys.stderr)
        return 2
    print(f"overall: {result.code.name}")
    for i, (entries, status) in enumerate(zip(args.descriptors, result.statuses, strict=False)):
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
    return 0 if result.code is Code.OK else 1 if result.code is Code.OVER_LIMIT else 2


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "query":
            return _query(args)
        return _check(args)
    except ConfigError as exc:
        print(f"ferryman: configuration rejected:\n{exc}", file=sys.stderr)
        return 1
    except FerrymanError as exc:
        print(f"ferryman: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
