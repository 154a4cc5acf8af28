"""``ferryman serve``: run the service, in this process or as ``--workers`` processes."""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import logging
import os
import signal
from typing import TYPE_CHECKING, Any

from ferryman import logs
from ferryman.cli.common import RAW, require_directory
from ferryman.errors import SettingsError
from ferryman.server.workers import WORKER_ENV
from ferryman.settings import Settings
from ferryman.settings.declare import Flag, Setting
from ferryman.settings.kinds import Boolean
from ferryman.settings.model import declared
from ferryman.tasks import awaiting

if TYPE_CHECKING:
    from ferryman.cli.common import Subcommands

__all__ = ["add_parser", "run"]

log = logging.getLogger("ferryman")

#: Seconds a stopping process has beyond FERRYMAN_SHUTDOWN_DRAIN and
#: FERRYMAN_SHUTDOWN_GRACE (for the exporters' last
#: push and the backend's close) before it exits with status 1 and every thread's stack
#: printed: a worker whose supervisor was killed has nobody else to end it.
STOP_MARGIN = 30.0

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
    # Every flag is declared with its setting (ferryman.settings), in the settings' order.
    for _, setting in declared():
        if setting.flag is not None:
            _add_flag(serve, setting, setting.flag)
    return serve


def _add_flag(parser: argparse.ArgumentParser, setting: Setting, flag: Flag) -> None:
    """One flag from its declaration: a switch for a boolean setting, else a value checked
    as the variable's is (or listed, where the values are a closed list)."""
    help = _flag_help(setting, flag).replace("%", "%%")
    kind = flag.kind or setting.kind
    if isinstance(kind, Boolean):
        parser.add_argument(flag.name, action="store_true", default=None, help=help)
        return
    choices = kind.choices()
    # A closed list keeps argparse's own "invalid choice" message (and completes in shells).
    checked: dict[str, Any] = {"choices": choices} if choices else {"type": kind.argument()}
    parser.add_argument(
        flag.name,
        action="append" if flag.repeat else "store",
        metavar=flag.metavar,
        help=help,
        **checked,
    )


def _flag_help(setting: Setting, flag: Flag) -> str:
    """The flag's help, naming the variable it overrides and the default."""
    notes = ["repeatable"] if flag.repeat else []
    if setting.env:
        notes.append(setting.env)
    default = setting.shown().replace("`", "")
    if default != "(empty)":
        notes.append(f"default {default}")
    # Markdown's code marks are for the settings page, not the terminal.
    return f"{flag.help or setting.help} ({'; '.join(notes)})".replace("`", "")


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
        stop, cut = asyncio.Event(), asyncio.Event()
        loop = asyncio.get_running_loop()
        limit = settings.shutdown_drain_seconds + settings.shutdown_grace_seconds
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, _stopping, stop, cut, limit)
        await serve(Service(settings), stop, cut)

    # The one place the service's event loop is chosen.
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(main())
    return 0


def _stopping(stop: asyncio.Event, cut: asyncio.Event, limit: float) -> None:
    """SIGTERM or SIGINT: drain and stop gracefully, and exit regardless once ``limit``
    (the drain and the grace) and STOP_MARGIN have passed (the deadline is kept by a thread
    of faulthandler's own, which needs neither the event loop nor the interpreter's lock).
    Half-way through the margin, a stop still going logs what each task waits on. A second
    signal ends the drain (``cut``): the stop goes on at once."""
    if stop.is_set():
        if not cut.is_set():
            log.info("signalled again: the drain ends")
            cut.set()
        return
    stop.set()
    faulthandler.dump_traceback_later(limit + STOP_MARGIN, exit=True)
    late = limit + STOP_MARGIN / 2
    asyncio.get_running_loop().call_later(late, _still_stopping, late)


def _still_stopping(seconds: float) -> None:
    chains = []
    for task in asyncio.all_tasks():
        chain = "\n    ".join(awaiting(task)) or "(running)"
        chains.append(f"  {task.get_name()}:\n    {chain}")
    log.warning(
        "still stopping %gs after the signal; what each task waits on:\n%s",
        seconds,
        "\n".join(chains),
    )


def _settings(args: argparse.Namespace) -> Settings:
    """The environment's settings with the flags given over them."""
    changes: dict[str, object] = {}
    for name, setting in declared():
        flag = setting.flag
        value = None if flag is None else getattr(args, flag.dest)
        if flag is not None and value is not None:
            changes[name] = tuple(value) if flag.repeat else value
    if args.config is not None:
        # The directory given replaces the one the RUNTIME_* variables name.
        changes["runtime_root"] = None
    return Settings.from_env().with_overrides(**changes)


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
    limit = settings.shutdown_drain_seconds + settings.shutdown_grace_seconds
    return workers.Supervisor(argv, settings.workers, limit).run()
