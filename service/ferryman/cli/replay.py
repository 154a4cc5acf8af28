"""``ferryman replay``: a decision log (or an Envoy access log) decided again, in this
process, against a descriptor directory, and against a second one to compare."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from ferryman.cli.common import RAW, load_config

if TYPE_CHECKING:
    from ferryman.cli.common import Subcommands
    from ferryman.replay.decision_log import Logged, LoggedRequest

__all__ = ["add_parser", "run"]

EXAMPLES = """examples:
  ferryman replay /var/log/ferryman/decisions.jsonl --config descriptors/
  ferryman replay decisions.jsonl --config descriptors/ --against candidate/ --format json
  ferryman replay access.log --envoy envoy/front-proxy.yaml --config descriptors/ \\
      --plot replay.svg"""


def add_parser(sub: Subcommands, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    replay = sub.add_parser(
        "replay",
        help="decide logged requests again against a config (and compare with another)",
        description="Read a decision log (DECISION_LOG) or, with --envoy, an Envoy JSON access "
        "log, and decide every request again in this process with the real engine on the "
        "memory backend and a virtual clock set to each request's time. Print per rule its "
        "requests, allowed, refused, shadow mode violations, first refusal and the tenants "
        "refused most; with --against, also what changes between the two configs. Exit 0, or "
        "2 on an error.",
        epilog=EXAMPLES,
        formatter_class=RAW,
        parents=parents,
    )
    replay.add_argument("log", type=Path, help="the decision log or Envoy access log")
    replay.add_argument("--config", type=Path, help="a descriptor directory (default descriptors/)")
    replay.add_argument("--against", type=Path, help="a second descriptor directory to compare")
    replay.add_argument(
        "--envoy",
        type=Path,
        action="append",
        help="the log is Envoy's JSON access log; the descriptors come from this Envoy file's "
        "rate limit actions (repeatable; needs ferryman[envoy])",
    )
    replay.add_argument(
        "--format", choices=("text", "json"), default="text", help="output (default text)"
    )
    replay.add_argument(
        "--plot", type=Path, metavar="FILE.svg", help="draw allowed/refused per second per rule"
    )
    return replay


def _requests(args: argparse.Namespace) -> Iterable[Logged | LoggedRequest]:
    if args.envoy:
        from ferryman.cli.envoy_log import read_access_log

        return read_access_log(args.log, args.envoy)
    from ferryman.replay.decision_log import read_log

    return read_log(args.log)


def run(args: argparse.Namespace) -> int:
    from ferryman.replay.replay import replay
    from ferryman.replay.report import as_json, as_text, plot

    config, options = load_config(args.config)
    against = None if args.against is None else load_config(args.against)[0]
    outcome = asyncio.run(replay(_requests(args), config, against, options))
    if args.plot is not None:
        args.plot.write_text(plot(outcome), encoding="utf-8")
    if args.format == "json":
        print(json.dumps(as_json(outcome)))
    else:
        sys.stdout.write(as_text(outcome))
    return 0
