"""``ferryman serve | check | query | explain | envoy | replay | simulate | completion |
config``: the command line.

Each command is one module here with the same two functions: ``add_parser(sub, parents)``
adds its subparser (and returns it), ``run(args)`` carries it out and returns the exit
status. A new command
is a new module, listed in ``COMMANDS``.

Exit status, for every command: 0 success; 1 a finding (a configuration with errors, an
answer over the limit); 2 a usage or I/O error (a bad flag or variable, a missing or
unreadable directory, a port in use, a service that cannot be reached).
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from ferryman import _version, logs
from ferryman.cli import (
    check,
    completion,
    config,
    envoy,
    explain,
    query,
    replay,
    serve,
    simulate,
)
from ferryman.errors import ConfigError, FerrymanError, SettingsError

if TYPE_CHECKING:
    from ferryman.cli.common import Subcommands

__all__ = ["COMMANDS", "main"]


class Command(Protocol):
    """A command module's interface."""

    def add_parser(
        self, sub: Subcommands, parents: list[argparse.ArgumentParser]
    ) -> argparse.ArgumentParser: ...

    def run(self, args: argparse.Namespace) -> int: ...


# In the order ``ferryman --help`` and the completion list them.
COMMANDS: tuple[Command, ...] = (
    serve,
    check,
    query,
    explain,
    envoy,
    replay,
    simulate,
    completion,
    config,
)


class _Version(argparse.Action):
    """--version: the version, and the commit from a checkout (git is asked only then, not on
    every start as argparse's own version action would)."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, argparse.SUPPRESS, nargs=0, help=help)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        print(_version.describe())
        parser.exit()


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
    parser.add_argument("--version", action=_Version, help="show the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub, [debug]).set_defaults(run=command.run)
    return parser


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
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
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
