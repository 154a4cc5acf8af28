"""``ferryman serve``: run the service, in this process or as ``--workers`` processes."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from ferryman import logs
from ferryman.cli.common import RAW, port, require_directory
from ferryman.errors import SettingsError
from ferryman.server.workers import WORKER_ENV
from ferryman.settings import EVENT_LOOPS, Settings, split_address

if TYPE_CHECKING:
    from ferryman.cli.common import Subcommands

__all__ = ["add_parser", "run"]

log = logging.getLogger("ferryman")

EXAMPLES = """examples:
  ferryman serve                                  # descriptors/ here, memory backend
  ferryman serve --config /etc/ratelimit --backend redis://cache:6379
  ferryman serve --envoy envoy/front-proxy.yaml   # the debug page explains its routes
  LOG_FORMAT=json LOG_LEVEL=warn ferryman serve   # the reference's variables work too"""


def add_parser(sub: Subcommands, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    serve = sub.add_parser(
        "serve",
        help="run the service",
        description="Run the rate limit service until SIGTERM or SIGINT (then exit 0). "
        "Flags override the environment variables named in their help.",
        epilog=EXAMPLES,
        formatter_class=RAW,
        parents=parents,
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
    serve.add_argument("--grpc-port", type=port, help="gRPC port (GRPC_PORT, default 8081)")
    serve.add_argument("--http-port", type=port, help="HTTP port (PORT, default 8080)")
    serve.add_argument("--debug-port", type=port, help="debug HTTP port (DEBUG_PORT, default 6070)")
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
        "--envoy",
        action="append",
        type=Path,
        metavar="FILE",
        help="an Envoy or Istio file whose routes the debug page explains (repeatable; "
        "ENVOY_CONFIG_FILES, comma-separated; needs ferryman[envoy])",
    )
    serve.add_argument(
        "--event-loop",
        choices=EVENT_LOOPS,
        help="auto: uvloop when installed, else asyncio's loop; uvloop: refuse to start "
        "without it (EVENT_LOOP, default auto)",
    )
    serve.add_argument(
        "--log-level",
        choices=("debug", "info", "warn", "error"),
        help="log level (LOG_LEVEL, default info)",
    )
    serve.add_argument(
        "--log-format", choices=("text", "json"), help="log format (LOG_FORMAT, default text)"
    )
    return serve


def run(args: argparse.Namespace) -> int:
    from ferryman.server import event_loop
    from ferryman.server.app import Service
    from ferryman.server.app import run as serve

    settings = _settings(args)
    # Resolved before anything starts, so that a missing uvloop refuses the start (and a
    # supervisor refuses before it spawns workers, which would each refuse in turn).
    loop_factory = event_loop.factory(settings.event_loop)
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
        require_directory(settings.config_dir, origin)
    if settings.workers < 1:
        raise SettingsError(f"--workers {settings.workers}: give 1 or more")
    if settings.workers > 1 and WORKER_ENV not in os.environ:
        return _supervise(args, settings)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(Service(settings), stop)

    # The one place the service's event loop is chosen.
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(main())
    return 0


def _settings(args: argparse.Namespace) -> Settings:
    """The environment's settings with the flags given over them."""
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
    if args.envoy:
        changes["envoy_config_files"] = tuple(str(path) for path in args.envoy)
    for flag, name in (
        ("grpc_port", "grpc_port"),
        ("http_port", "port"),
        ("debug_port", "debug_port"),
        ("log_level", "log_level"),
        ("log_format", "log_format"),
        ("workers", "workers"),
        ("event_loop", "event_loop"),
    ):
        value = getattr(args, flag)
        if value is not None:
            changes[name] = value
    return settings.with_overrides(**changes)


def _supervise(args: argparse.Namespace, settings: Settings) -> int:
    """Run ``serve`` as ``settings.workers`` processes sharing the same ports."""
    from ferryman.server import workers

    workers.check(settings)
    # Every worker must bind the same ports: a port given as 0 is chosen here, once.
    grpc_port = settings.grpc_port or workers.free_port(settings.grpc_host)
    http_port = settings.port or workers.free_port(settings.host)
    debug_port = settings.debug_port or workers.free_port(settings.debug_host)
    argv = ["serve", "--config", str(settings.config_dir), "--workers", str(settings.workers)]
    argv += ["--grpc-port", str(grpc_port), "--http-port", str(http_port)]
    argv += ["--debug-port", str(debug_port)]
    if args.backend is not None:
        argv += ["--backend", args.backend]
    if settings.fail_open:
        argv.append("--fail-open")
    for path in args.envoy or ():
        argv += ["--envoy", str(path)]
    argv += ["--log-level", settings.log_level, "--log-format", settings.log_format]
    argv += ["--event-loop", settings.event_loop]
    log.info(
        "%d workers on grpc :%d, http :%d, debug :%d",
        settings.workers,
        grpc_port,
        http_port,
        debug_port,
    )
    return workers.Supervisor(argv, settings.workers, settings.shutdown_grace_seconds).run()
