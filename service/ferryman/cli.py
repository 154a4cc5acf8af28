"""``ferryman serve | check | query | explain | completion``: the command line.

Exit status, for every command: 0 success; 1 a finding (a configuration with errors, an
answer over the limit); 2 a usage or I/O error (a bad flag or variable, a missing or
unreadable directory, a port in use, a service that cannot be reached).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from ferryman import config_cli, logs
from ferryman.config.loader import load_sources, read_directory
from ferryman.config.smooth import describe_smooth
from ferryman.errors import ConfigError, FerrymanError, RequestError, SettingsError
from ferryman.server.workers import WORKER_ENV
from ferryman.settings import Settings, split_address

if TYPE_CHECKING:
    from ferryman.config.model import Config
    from ferryman.engine.model import EngineOptions

__all__ = ["main"]

log = logging.getLogger("ferryman")


def _version() -> str:
    try:
        return version("ferryman")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0-65535; 0: any free)")
    return int(text)


_EXAMPLES = {
    "serve": """examples:
  ferryman serve                                  # descriptors/ here, memory backend
  ferryman serve --config /etc/ratelimit --backend redis://cache:6379
  LOG_FORMAT=json LOG_LEVEL=warn ferryman serve   # the reference's variables work too""",
    "check": """examples:
  ferryman check descriptors/
  ferryman check --format json k8s/base/descriptors | jq '.domains[].name'""",
    "query": """examples:
  ferryman query --domain messaging --descriptor message_type=marketing,to_number=2061111111
  ferryman query --target rl:8081 --domain edge-proxy --descriptor remote_address=10.0.0.1 \\
      --hits 5 --format json
  ferryman query --target rl.example:8081 --ca-file ca.pem --cert-file me.pem \\
      --key-file me-key.pem --domain edge-proxy --descriptor remote_address=10.0.0.1""",
    "explain": """examples:
  ferryman explain --config descriptors --domain messaging \\
      --descriptor message_type=marketing,to_number=2061111111
  ferryman explain --target 127.0.0.1:6070 --domain edge-proxy \\
      --descriptor remote_address=10.0.0.1 --format json   # with the current counts
  ferryman explain --envoy envoy/front-proxy.yaml --route /api/ --header :path=/api/v1""",
    "envoy": """examples:
  ferryman envoy check envoy/front-proxy.yaml --config descriptors
  ferryman envoy check k8s/overlays/istio/*.yaml --config k8s/base/descriptors --format json
  ferryman envoy generate --domain messaging --config descriptors > envoy.yaml
  ferryman envoy generate --domain edge-proxy --format istio --header plan=x-plan""",
    "completion": """examples:
  source <(ferryman completion bash)              # in ~/.bashrc
  ferryman completion zsh > "${fpath[1]}/_ferryman" # then restart zsh""",
}


def _parser() -> argparse.ArgumentParser:
    # --debug is accepted before or after the command; SUPPRESS keeps a later default from
    # overriding an earlier flag.
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print the traceback of an error (for a bug report)",
    )
    parser = argparse.ArgumentParser(
        prog="ferryman", description="A rate limit service for Envoy.", parents=[debug]
    )
    parser.add_argument("--version", action="version", version=f"ferryman {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    raw = argparse.RawDescriptionHelpFormatter
    serve = sub.add_parser(
        "serve",
        help="run the service",
        description="Run the rate limit service until SIGTERM or SIGINT (then exit 0). "
        "Flags override the environment variables named in their help.",
        epilog=_EXAMPLES["serve"],
        formatter_class=raw,
        parents=[debug],
    )
    serve.add_argument(
        "--config",
        type=Path,
        help="descriptor directory (default: descriptors/ in the current directory)",
    )
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
    serve.add_argument(
        "--health-requires-backend",
        action="store_true",
        default=None,
        help="report unhealthy while the backend is down (REDIS_HEALTH_CHECK_ACTIVE_CONNECTION,"
        " FERRYMAN_HEALTH_REQUIRES_BACKEND)",
    )
    serve.add_argument("--grpc-port", type=_port, help="gRPC port (GRPC_PORT, default 8081)")
    serve.add_argument("--http-port", type=_port, help="HTTP port (PORT, default 8080)")
    serve.add_argument(
        "--debug-port", type=_port, help="debug HTTP port (DEBUG_PORT, default 6070)"
    )
    serve.add_argument(
        "--workers",
        type=int,
        help="processes serving the same ports (WORKERS, default 1; more needs Redis)",
    )
    serve.add_argument(
        "--parent",
        metavar="HOST:PORT",
        help="lease capacity from this doorman.Capacity server (DOORMAN_PARENT)",
    )
    serve.add_argument(
        "--log-level",
        choices=("debug", "info", "warn", "error"),
        help="log level (LOG_LEVEL, default info)",
    )
    serve.add_argument(
        "--log-format", choices=("text", "json"), help="log format (LOG_FORMAT, default text)"
    )
    check = sub.add_parser(
        "check",
        help="validate a descriptor directory",
        description="Validate a descriptor directory exactly as `serve` loads it, and list "
        "its domains and limits. Exit 0 when valid, 1 when it has errors, 2 when it cannot "
        "be read.",
        epilog=_EXAMPLES["check"],
        formatter_class=raw,
        parents=[debug],
    )
    check.add_argument("directory", type=Path)
    check.add_argument(
        "--format", choices=("text", "json"), default="text", help="output (default text)"
    )
    query = sub.add_parser(
        "query",
        help="ask a running service (ShouldRateLimit); exit 0 OK, 1 OVER_LIMIT, 2 error",
        description="Ask a running ferryman ShouldRateLimit and print the answer. Exit status: "
        "0 when the overall code is OK, 1 when it is OVER_LIMIT, 2 on any error.",
        epilog=_EXAMPLES["query"],
        formatter_class=raw,
        parents=[debug],
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
    explain = sub.add_parser(
        "explain",
        help="why a descriptor is limited (or not), counting nothing",
        description="Walk each descriptor through its domain's tree and print, level by "
        "level, what matched (exact value, wildcard, bare key) or what the tree expected, "
        "the rule reached, what replaces removes, and the counter; against a running server "
        "(its debug port) also the current count and what is left. Exit 0 when every "
        "descriptor reaches a rule, 1 when one does not, 2 on an error.",
        epilog=_EXAMPLES["explain"],
        formatter_class=raw,
        parents=[debug],
    )
    where = explain.add_mutually_exclusive_group()
    where.add_argument(
        "--target", help="host:port of a running server's debug port (default 127.0.0.1:6070)"
    )
    where.add_argument("--config", type=Path, help="a descriptor directory, read here")
    explain.add_argument("--domain", help="the domain (with --envoy: only entries sent to it)")
    explain.add_argument(
        "--descriptor",
        dest="descriptors",
        action="append",
        type=_descriptor_arg,
        metavar="K=V[,K=V...]",
        help="one descriptor's entries, in order; repeat for several descriptors",
    )
    explain.add_argument(
        "--format", choices=("text", "json"), default="text", help="output (default text)"
    )
    explain.add_argument(
        "--envoy",
        action="append",
        type=Path,
        metavar="FILE",
        help="an Envoy or Istio file: explain the descriptors its routes send instead "
        "(repeatable; descriptors from --config, default descriptors/; needs ferryman[envoy])",
    )
    explain.add_argument(
        "--route",
        default="",
        metavar="NAME",
        help="with --envoy: only this route (its name or match, e.g. /api/) or virtual host",
    )
    explain.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="with --envoy: a request header's value (headers not given stay variable)",
    )
    explain.add_argument(
        "--remote-address",
        default="",
        metavar="IP",
        help="with --envoy: the client address the remote_address action sends",
    )
    envoy = sub.add_parser(
        "envoy",
        help="check Envoy configs against the descriptors, or generate them",
        description="check: read Envoy bootstraps, Listeners, RouteConfigurations or Istio "
        "EnvoyFilters, derive the descriptor each rate_limits entry sends and walk it down "
        "its domain's tree; exit 0 when every entry reaches a rule, 1 when one cannot (or, "
        "with --strict, on a warning), 2 when a file cannot be read. generate: print the "
        "Envoy pieces that make a domain's rules reachable. Needs pip install ferryman[envoy].",
        epilog=_EXAMPLES["envoy"],
        formatter_class=raw,
        parents=[debug],
    )
    envoy_sub = envoy.add_subparsers(dest="envoy_command", required=True, metavar="ACTION")
    envoy_check = envoy_sub.add_parser(
        "check", help="check Envoy files against the descriptors", parents=[debug]
    )
    envoy_check.add_argument("files", nargs="+", type=Path, metavar="ENVOY_FILE")
    envoy_check.add_argument(
        "--config", type=Path, help="descriptor directory (default: descriptors/ here)"
    )
    envoy_check.add_argument(
        "--format", choices=("text", "json"), default="text", help="output (default text)"
    )
    envoy_check.add_argument("--strict", action="store_true", help="fail on warnings too")
    envoy_generate = envoy_sub.add_parser(
        "generate", help="print Envoy config reaching a domain's rules", parents=[debug]
    )
    envoy_generate.add_argument("--domain", required=True)
    envoy_generate.add_argument(
        "--config", type=Path, help="descriptor directory (default: descriptors/ here)"
    )
    envoy_generate.add_argument(
        "--format",
        choices=("envoy", "istio"),
        default="envoy",
        help="a bootstrap (default) or Istio EnvoyFilter manifests",
    )
    envoy_generate.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="KEY=HEADER",
        help="read descriptor key KEY from request header HEADER (default: the header KEY)",
    )
    envoy_generate.add_argument(
        "--ferryman",
        default="127.0.0.1:8081",
        metavar="HOST:PORT",
        help="ferryman's gRPC address (default 127.0.0.1:8081)",
    )
    envoy_generate.add_argument(
        "--upstream",
        default="127.0.0.1:8000",
        metavar="HOST:PORT",
        help="the upstream the routes lead to (default 127.0.0.1:8000)",
    )
    envoy_generate.add_argument(
        "--listen", type=_port, default=10000, help="Envoy's listener port (default 10000)"
    )
    completion = sub.add_parser(
        "completion",
        help="print a shell completion script",
        description="Print a completion script for bash or zsh on stdout.",
        epilog=_EXAMPLES["completion"],
        formatter_class=raw,
        parents=[debug],
    )
    completion.add_argument("shell", choices=("bash", "zsh"))
    config_cli.add_parser(sub, [debug])
    return parser


def _descriptor_arg(text: str) -> list[tuple[str, str]]:
    from ferryman.engine.explain import parse_descriptor

    try:
        return parse_descriptor(text)
    except RequestError as exc:
        raise argparse.ArgumentTypeError(str(exc).partition(": ")[2]) from None


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
    if args.health_requires_backend:
        changes["health_requires_backend"] = True
    for flag, name in (
        ("grpc_port", "grpc_port"),
        ("http_port", "port"),
        ("debug_port", "debug_port"),
        ("log_level", "log_level"),
        ("log_format", "log_format"),
        ("workers", "workers"),
    ):
        value = getattr(args, flag)
        if value is not None:
            changes[name] = value
    settings = settings.with_overrides(**changes)
    logs.setup(settings.log_level, settings.log_format)
    if args.config is not None:
        origin = "the path given to --config"
    elif settings.runtime_root is not None:
        origin = "RUNTIME_ROOT, RUNTIME_SUBDIRECTORY and RUNTIME_APPDIRECTORY"
    else:
        origin = "the default: run ferryman where descriptors/ is, or pass --config DIR"
    if settings.config_type == "FILE" and not (
        settings.force_start_without_initial_config and not settings.config_dir.exists()
    ):
        # FORCE_START_WITHOUT_INITIAL_CONFIG: the directory may appear later (watched).
        _require_directory(settings.config_dir, origin)
    if settings.workers < 1:
        raise SettingsError(f"--workers {settings.workers}: give 1 or more")
    if settings.workers > 1 and WORKER_ENV not in os.environ:
        return _supervise(args, settings)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run(Service(settings), stop)

    asyncio.run(main())
    return 0


def _supervise(args: argparse.Namespace, settings: Settings) -> int:
    """Run ``serve`` as ``settings.workers`` processes sharing the same ports."""
    from ferryman.server import workers

    workers.check(settings)
    # Every worker must bind the same ports: a port given as 0 is chosen here, once.
    grpc_port = settings.grpc_port or workers.free_port(settings.grpc_host)
    port = settings.port or workers.free_port(settings.host)
    debug_port = settings.debug_port or workers.free_port(settings.debug_host)
    argv = ["serve", "--config", str(settings.config_dir), "--workers", str(settings.workers)]
    argv += ["--grpc-port", str(grpc_port), "--http-port", str(port)]
    argv += ["--debug-port", str(debug_port)]
    if args.backend is not None:
        argv += ["--backend", args.backend]
    if settings.fail_open:
        argv.append("--fail-open")
    argv += ["--log-level", settings.log_level, "--log-format", settings.log_format]
    log.info(
        "%d workers on grpc :%d, http :%d, debug :%d",
        settings.workers,
        grpc_port,
        port,
        debug_port,
    )
    return workers.Supervisor(argv, settings.workers, settings.shutdown_grace_seconds).run()


def _require_directory(directory: Path, origin: str) -> None:
    """Raise SettingsError unless ``directory`` is a directory this process can read."""
    shown = str(directory)
    if not directory.is_absolute():
        shown += f" (in {Path.cwd()})"
    if not directory.exists():
        raise SettingsError(f"config directory {shown} does not exist; check {origin}")
    if not directory.is_dir():
        raise SettingsError(f"config directory {shown} is not a directory; check {origin}")
    try:
        os.listdir(directory)
    except OSError as exc:
        raise SettingsError(
            f"config directory {shown} cannot be read ({exc.strerror}): "
            "give this user read access to it"
        ) from None


def _progress(text: str) -> None:
    """A status line on a terminal, overwritten by the next; nothing when stderr is piped."""
    if sys.stderr.isatty():
        print(f"\r\033[K{text}", end="", file=sys.stderr, flush=True)


def _check(args: argparse.Namespace) -> int:
    directory: Path = args.directory
    settings = Settings.from_env()
    _require_directory(directory, "the path given to ferryman check")
    _progress(f"reading {directory} ...")
    try:
        sources = read_directory(directory, ignore_dotfiles=settings.ignore_dotfiles)
        _progress(f"validating {len(sources)} file(s) of {directory} ...")
        config = load_sources(sources, merge_domains=settings.merge_domain_config)
    except ConfigError as exc:
        _progress("")
        if args.format == "json":
            problems = [
                {
                    "file": p.file,
                    "line": p.line,
                    "column": p.column,
                    "path": p.path,
                    "message": p.message,
                }
                for p in exc.problems
            ]
            print(json.dumps({"ok": False, "directory": str(directory), "errors": problems}))
            return 1
        for problem in exc.problems:
            print(f"error: {problem}")
        print(f"{len(exc.problems)} error(s) in {directory}")
        return 1
    _progress("")
    domains: list[dict[str, Any]] = []
    for name in sorted(config.domains):
        limits: list[dict[str, Any]] = []
        for dom, rule in config.iter_limits():
            if dom != name:
                continue
            limit = rule.rate_limit
            smooth = describe_smooth(rule)
            if smooth is not None:
                what = smooth[1]
            elif rule.burst is not None:
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
            limits.append(
                {
                    "key": rule.stats_key,
                    "limit": what,
                    "name": limit.name if limit is not None and limit.name else None,
                    "shadow_mode": rule.shadow_mode,
                    "quota_mode": rule.quota_mode,
                }
            )
        domains.append({"name": name, "files": list(config.domains[name].files), "limits": limits})
    if args.format == "json":
        report = {
            "ok": True,
            "directory": str(directory),
            "notes": [str(note) for note in config.notes],
            "domains": domains,
            "resources": [
                {
                    "identifier_glob": t.identifier_glob,
                    "capacity": t.capacity,
                    "safe_capacity": t.safe_capacity,
                    "algorithm": t.algorithm.kind.name,
                    "source": t.source,
                }
                for t in config.resources
            ],
            "token_buckets": None
            if config.quota is None
            else {"file": config.quota.file, "buckets": list(config.quota.describe())},
        }
        print(json.dumps(report))
        return 0
    for note in config.notes:
        print(f"note: {note}")
    for domain in domains:
        print(f"domain {domain['name']} ({', '.join(domain['files'])})")
        for entry in domain["limits"]:
            flags = [f for f in ("shadow_mode", "quota_mode") if entry[f]]
            suffix = f" [{', '.join(flags)}]" if flags else ""
            named = f" name={entry['name']}" if entry["name"] else ""
            print(f"  {entry['key']}: {entry['limit']}{named}{suffix}")
    if config.quota is not None:
        print(f"token buckets ({config.quota.file})")
        print("".join(f"  {line}\n" for line in config.quota.describe()), end="")
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
    exit_code = 0 if result.code is Code.OK else 1 if result.code is Code.OVER_LIMIT else 2
    statuses = []
    for entries, status in zip(args.descriptors, result.statuses, strict=False):
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
    if args.format == "json":
        answer = {
            "overall": result.code.name,
            "descriptors": statuses,
            "headers": [[k, v] for k, v in result.headers],
        }
        print(json.dumps(answer))
        return exit_code
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
    return exit_code


def _explain(args: argparse.Namespace) -> int:
    from ferryman.engine.explain import explain, render
    from ferryman.server.app import engine_options

    if args.envoy:
        return _explain_envoy(args)
    if not args.domain or not args.descriptors:
        raise SettingsError("explain: give --domain and --descriptor (or --envoy FILE)")
    if args.config is not None:
        settings = Settings.from_env()
        _require_directory(args.config, "the path given to --config")
        config = load_sources(
            read_directory(args.config, ignore_dotfiles=settings.ignore_dotfiles),
            merge_domains=settings.merge_domain_config,
        )
        options = engine_options(settings)
        answer = explain(config, args.domain, args.descriptors, options, time.time()).as_dict()
    else:
        answer = _explain_remote(args)
    if args.format == "json":
        print(json.dumps(answer))
    else:
        print(render(answer), end="")
    reached = answer["domain_found"] and all(
        d.get("rule", {}).get("kind", "none") != "none" for d in answer["descriptors"]
    )
    return 0 if reached else 1


def _explain_envoy(args: argparse.Namespace) -> int:
    if args.target is not None or args.descriptors:
        raise SettingsError(
            "explain --envoy reads its descriptors from the Envoy files and the tree from "
            "--config: --target and --descriptor do not go with it"
        )
    _needs_envoy_data_plane()
    from ferryman.envoy.actions import collect
    from ferryman.envoy.read import read_file
    from ferryman.envoy.routes import Request, explain_routes, parse_values, render

    config, options = _load_config(args.config)
    request = Request(parse_values(args.header, "--header"), args.remote_address)
    pieces = [piece for path in args.envoy for piece in read_file(path)]
    answer = explain_routes(collect(pieces), config, options, request, args.route, args.domain)
    if args.format == "json":
        print(json.dumps(answer))
    else:
        print(render(answer), end="")
    reached = bool(answer["entries"]) and all(
        "error" not in e
        and all(
            d["explain"].get("rule", {}).get("kind", "none") != "none"
            if "explain" in d
            else bool(d["reaches"])
            for d in e["descriptors"]
        )
        for e in answer["entries"]
    )
    return 0 if reached else 1


def _needs_envoy_data_plane() -> None:
    try:
        import envoy_data_plane  # noqa: F401
    except ImportError:
        raise SettingsError(
            "ferryman envoy needs the envoy-data-plane package: pip install ferryman[envoy]"
        ) from None


def _explain_remote(args: argparse.Namespace) -> dict[str, Any]:
    target: str = args.target or f"127.0.0.1:{os.environ.get('DEBUG_PORT') or '6070'}"
    host, port = split_address(target, "--target")
    query = urlencode(
        [("domain", args.domain)]
        + [("descriptor", ",".join(f"{k}={v}" for k, v in d)) for d in args.descriptors]
    )
    conn = http.client.HTTPConnection(host or "127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", f"/explain?{query}")
        response = conn.getresponse()
        body = json.loads(response.read() or b"{}")
    finally:
        conn.close()
    if response.status != 200:
        raise SettingsError(f"{target}/explain answered {response.status}: {body.get('error')}")
    answer: dict[str, Any] = body
    return answer


def _load_config(directory: Path | None) -> tuple[Config, EngineOptions]:
    from ferryman.server.app import engine_options

    settings = Settings.from_env()
    directory = directory if directory is not None else Path("descriptors")
    _require_directory(directory, "the path given to --config")
    config = load_sources(
        read_directory(directory, ignore_dotfiles=settings.ignore_dotfiles),
        merge_domains=settings.merge_domain_config,
    )
    return config, engine_options(settings)


def _envoy(args: argparse.Namespace) -> int:
    _needs_envoy_data_plane()
    config, options = _load_config(args.config)
    if args.envoy_command == "generate":
        from ferryman.envoy.generate import generate, parse_headers

        print(
            generate(
                config,
                options,
                args.domain,
                fmt=args.format,
                headers=parse_headers(args.header),
                ferryman=args.ferryman,
                upstream=args.upstream,
                listen=args.listen,
            ),
            end="",
        )
        return 0
    from ferryman.envoy.actions import collect
    from ferryman.envoy.check import check, render
    from ferryman.envoy.read import read_file

    pieces = [piece for path in args.files for piece in read_file(path)]
    report = check(collect(pieces), config, options)
    if args.format == "json":
        print(json.dumps(report.as_dict(args.strict)))
    else:
        print(render(report, args.strict), end="")
    return report.exit_code(args.strict)


def _completion(args: argparse.Namespace) -> int:
    print(completion_script(args.shell, _parser()), end="")
    return 0


def completion_script(shell: str, parser: argparse.ArgumentParser) -> str:
    """A bash or zsh completion script for ``parser``'s commands, options and choices."""
    commands: dict[str, list[str]] = {}
    values: dict[str, str] = {}  # option -> a compgen word list, or a marker for paths
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                options = []
                for option in sub._actions:
                    options += [o for o in option.option_strings if o.startswith("--")]
                    for flag in option.option_strings:
                        if option.choices:
                            values[flag] = " ".join(str(c) for c in option.choices)
                        elif option.type is Path:
                            values[flag] = "@dirs"
                    if not option.option_strings and option.choices:
                        options += [str(c) for c in option.choices]
                    elif not option.option_strings and option.type is Path:
                        options.append("@dirs")
                commands[name] = options
    top = " ".join([*commands, "--version", "--help", "--debug"])
    cases = "\n".join(
        f'        {name}) words="{" ".join(o for o in opts if o != "@dirs")}"'
        f"{'; dirs=1' if '@dirs' in opts else ''} ;;"
        for name, opts in commands.items()
    )
    prev_cases = "\n".join(
        f"        {flag}) "
        + (
            'COMPREPLY=($(compgen -d -- "$cur")); return ;;'
            if words == "@dirs"
            else f'COMPREPLY=($(compgen -W "{words}" -- "$cur")); return ;;'
        )
        for flag, words in sorted(values.items())
    )
    body = f"""_ferryman() {{
    local cur prev words dirs=0 i command=""
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${{COMP_WORDS[i]}}" in -*) ;; *) command="${{COMP_WORDS[i]}}"; break ;; esac
    done
    if [[ -z "$command" ]]; then
        COMPREPLY=($(compgen -W "{top}" -- "$cur"))
        return
    fi
    case "$prev" in
{prev_cases}
    esac
    case "$command" in
{cases}
        *) return ;;
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
    if [[ $dirs == 1 && $cur != -* ]]; then
        COMPREPLY+=($(compgen -d -- "$cur"))
    fi
}}
complete -F _ferryman ferryman
"""
    if shell == "zsh":
        return "#compdef ferryman\nautoload -U +X bashcompinit && bashcompinit\n" + body
    return "# bash completion for ferryman\n" + body


_COMMANDS = {
    "serve": _serve,
    "check": _check,
    "query": _query,
    "explain": _explain,
    "envoy": _envoy,
    "completion": _completion,
    "config": config_cli.run,
}


def _report(message: str, debug: bool) -> None:
    if debug:
        traceback.print_exc()
    if logs.json_enabled():
        logging.getLogger("ferryman").critical(message)
    else:
        print(f"ferryman: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 a finding, 2 an error)."""
    args = _parser().parse_args(argv)
    debug: bool = getattr(args, "debug", False)
    try:
        return _COMMANDS[args.command](args)
    except KeyboardInterrupt:
        return 130
    except ConfigError as exc:
        _report(f"configuration rejected:\n{exc}", debug)
        return 1
    except SettingsError as exc:
        message = str(exc)
        if message.split("=", 1)[0].isupper():
            message += "\n  (an environment variable: fix it, or unset it for the default)"
        _report(message, debug)
        return 2
    except (FerrymanError, OSError) as exc:
        _report(str(exc), debug)
        return 2
    except Exception as exc:
        hint = "" if debug else " (add --debug for the traceback)"
        _report(f"unexpected error: {type(exc).__name__}: {exc}{hint}", debug)
        return 2


if __name__ == "__main__":
    sys.exit(main())
