"""``ferryman simulate tiers | leases``: a traffic shape against one node, or a Doorman
scenario against the lease algorithms, on a virtual clock, second by second."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ferryman.cli.common import RAW, descriptor_arg
from ferryman.errors import SettingsError

if TYPE_CHECKING:
    from ferryman.cli.common import Subcommands

__all__ = ["add_parser", "run"]

EXAMPLES = """examples:
  ferryman simulate tiers --config descriptors --domain cookbook \\
      --descriptor penalty_user=alice --rate 20 --seconds 40
  ferryman simulate tiers --node '{burst_tiers: [{limit: 5, window: 1s, active: 1d},
      {limit: 50, window: 1s, active: 5s, cooldown: 15s}]}' --rate 8 --burst 10:60
  ferryman simulate leases examples/scenarios/doorman-seven.yaml --format json"""


def _pair(text: str) -> tuple[float, float]:
    first, _, second = text.partition(":")
    try:
        return float(first), float(second)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not A:B (two numbers)") from None


def add_parser(sub: Subcommands, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    simulate = sub.add_parser(
        "simulate",
        help="run a traffic shape against one node, or a lease scenario, on a virtual clock",
        description="Simulate, second by second on a virtual clock, with the service's own "
        "algorithms: `tiers` sends a traffic shape to one node (burst tiers, or any rule) "
        "and shows what is granted, from which tier, and when a cooldown blocks; `leases` "
        "runs a Doorman scenario file (clients and servers leasing one capacity) and shows "
        "the capacity handed out and the over-commit. Exit 0, or 2 on an error.",
        epilog=EXAMPLES,
        formatter_class=RAW,
        parents=parents,
    )
    kinds = simulate.add_subparsers(dest="what", required=True, metavar="tiers|leases")
    tiers = kinds.add_parser("tiers", help="a traffic shape against one node", parents=parents)
    tiers.add_argument("--config", type=Path, help="a descriptor directory (with --domain)")
    tiers.add_argument("--domain", help="the node's domain")
    tiers.add_argument("--descriptor", type=descriptor_arg, metavar="K=V[,K=V...]")
    tiers.add_argument("--node", help="a node's keys as YAML, instead of --config")
    tiers.add_argument("--seconds", type=int, default=60, help="how long (default 60)")
    tiers.add_argument("--rate", type=float, default=0.0, help="requests per second, spread")
    tiers.add_argument(
        "--on-off", type=_pair, metavar="ON:OFF", help="send --rate ON seconds, then pause OFF"
    )
    tiers.add_argument(
        "--burst", type=_pair, action="append", default=[], metavar="AT:N", help="N at once"
    )
    leases = kinds.add_parser("leases", help="a Doorman scenario file", parents=parents)
    leases.add_argument("scenario", type=Path, help="a scenario file (examples/scenarios/)")
    leases.add_argument(
        "--every", type=int, default=60, help="print one second in this many (default 60)"
    )
    for each in (tiers, leases):
        each.add_argument("--format", choices=("text", "json"), default="text")
        each.add_argument("--plot", type=Path, metavar="FILE.svg", help="draw it as SVG")
    return simulate


def run(args: argparse.Namespace) -> int:
    result = _tiers(args) if args.what == "tiers" else _leases(args)
    if args.format == "json":
        print(json.dumps(result))
    return 0


def _tiers(args: argparse.Namespace) -> dict[str, Any]:
    from ferryman.cli.common import load_config
    from ferryman.simulate import tiers

    if args.node:
        config = tiers.node_config(args.node)
        domain, entries = tiers.DOMAIN, [(tiers.KEY, tiers.TENANT)]
    elif args.domain and args.descriptor:
        config = load_config(args.config)[0]
        domain, entries = args.domain, args.descriptor
    else:
        raise SettingsError("simulate tiers: give --node YAML, or --domain and --descriptor")
    on, off = args.on_off or (0.0, 0.0)
    bursts = tuple((at, int(n)) for at, n in args.burst)
    shape = tiers.Shape(args.seconds, args.rate, on, off, bursts)
    rows = [r.as_dict() for r in asyncio.run(tiers.simulate(config, domain, entries, shape))]
    if args.plot is not None:
        shown = ",".join(f"{k}={v}" for k, v in entries)
        args.plot.write_text(_tiers_plot(rows, f"{domain}: {shown}"), encoding="utf-8")
    if args.format == "text":
        for r in rows:
            extra = " ".join(f"{k}={_short(v)}" for k, v in r.items() if k not in _COUNTS)
            sys.stdout.write(
                f"{r['second']:>5}s asked {r['asked']:>4} granted {r['granted']:>4} "
                f"refused {r['refused']:>4}  {extra}\n"
            )
    return {"domain": domain, "descriptor": [list(e) for e in entries], "per_second": rows}


_COUNTS = ("second", "asked", "granted", "refused")


def _tiers_plot(rows: list[dict[str, Any]], title: str) -> str:
    from ferryman.replay.plot import Panel, Series, svg

    series = [Series(n, [(r["second"], r[n]) for r in rows]) for n in _COUNTS[1:]]
    panels = [Panel("requests per second", series)]
    levels = [Series(k, [(r["second"], float(r.get(k) or 0)) for r in rows]) for k in _tier(rows)]
    if levels:
        panels.append(Panel("the tier in use", levels))
    return svg(panels, title)


def _tier(rows: list[dict[str, Any]]) -> list[str]:
    """The numeric fields that name a tier (as the kind calls them), for the plot."""
    names = {k for r in rows for k, v in r.items() if "tier_index" in k and isinstance(v, int)}
    return sorted(names)


def _short(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _leases(args: argparse.Namespace) -> dict[str, Any]:
    from ferryman.replay.plot import Panel, Series, svg
    from ferryman.simulate.leases import load_scenario, run_scenario

    result = run_scenario(load_scenario(args.scenario))
    rows = result["per_second"]
    if args.plot is not None:
        names = ("capacity", "handed", "wants")
        series = [Series(n, [(r["second"], r[n]) for r in rows]) for n in names]
        title = f"{result['scenario']}: capacity handed out"
        args.plot.write_text(svg([Panel("per second", series)], title), encoding="utf-8")
    if args.format == "text":
        every = max(1, args.every)
        for r in rows[::every]:
            sys.stdout.write(
                f"{r['second']:>6}s capacity {r['capacity']:g} handed out {r['handed']:.2f} "
                f"({100 * r['handed'] / r['capacity']:.2f}%) wants {r['wants']:.2f}\n"
            )
        used = result["capacity_used"]
        sys.stdout.write(
            f"{result['scenario']}: capacity used "
            f"{'-' if used is None else f'{100 * used:.2f}%'} over {result['steady_seconds']} "
            f"steady seconds; peak {100 * result['peak']:.2f}% at {result['peak_second']}s; "
            f"{result['seconds_over_capacity']} seconds over capacity\n"
        )
    return result
