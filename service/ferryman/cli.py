"""``ferryman serve | check | query``: the command line.

Exit status, for every command: 0 success; 1 a finding (a configuration with errors, an
answer over the limit); 2 a usage or I/O error (a bad flag or variable, a missing or
unreadable directory, a port in use, a service that cannot be reached).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from ferryman import logs
from ferryman.config.loader import load_sources, read_directory
from ferryman.errors import ConfigError, FerrymanError, SettingsError
from ferryman.settings import Settings

__all__ = ["main"]


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
      --hits 5 --format json""",
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
    serve.add_argument("--grpc-port", type=_port, help="gRPC port (GRPC_PORT, default 8081)")
    serve.add_argument("--http-port", type=_port, help="HTTP port (PORT, default 8080)")
    serve.add_argument(
        "--debug-port", type=_port, help="debug HTTP port (DEBUG_PORT, default 6070)"
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
        "--timeout", type=float, default=5.0, help="seconds to wait for the answer (default 5)"
    )
    query.add_argument(
        "--format", choices=("text", "json"), default="text", help="output (default text)"
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
    for flag, name in (
        ("grpc_port", "grpc_port"),
        ("http_port", "port"),
        ("debug_port", "debug_port"),
        ("log_level", "log_level"),
        ("log_format", "log_format"),
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
    if not (settings.force_start_without_initial_config and not settings.config_dir.exists()):
        # FORCE_START_WITHOUT_INITIAL_CONFIG: the directory may appear later (watched).
        _require_directory(settings.config_dir, origin)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run(Service(settings), stop)

    asyncio.run(main())
    return 0


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
    print(f"OK: {len(config.domains)} domain(s), {len(config.iter_limits())} limit(s)")
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
        with Client(target, timeout=args.timeout, fail_open=False) as client:
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


_COMMANDS = {"serve": _serve, "check": _check, "query": _query, "completion": _completion}


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
