"""``ferryman envoy check | generate``: Envoy configs against the descriptors, or made
from them (needs the envoy-data-plane package, ``pip install ferryman[envoy]``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from ferryman.cli.common import RAW, load_config, port

if TYPE_CHECKING:
    from ferryman.cli.common import Subcommands
    from ferryman.config.model import Config
    from ferryman.core.answers import EngineOptions

__all__ = ["add_parser", "run"]

EXAMPLES = """examples:
  ferryman envoy check envoy/front-proxy.yaml --config descriptors
  ferryman envoy check k8s/overlays/istio/*.yaml --config k8s/base/descriptors --format json
  ferryman envoy generate --domain messaging --config descriptors > envoy.yaml
  ferryman envoy generate --domain messaging --quota envoy-a > envoy-quota.yaml
  ferryman envoy generate --domain edge-proxy --format istio --header plan=x-plan
  ferryman envoy generate --domain edge-proxy --quota --format istio \
      --ferryman ferryman.default.svc.cluster.local:8081 > envoyfilters-quota.yaml"""


def add_parser(sub: Subcommands, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    envoy = sub.add_parser(
        "envoy",
        help="check Envoy configs against the descriptors, or generate them",
        description="check: read Envoy bootstraps, Listeners, RouteConfigurations or Istio "
        "EnvoyFilters, derive the descriptor each rate_limits entry sends and walk it down "
        "its domain's tree; exit 0 when every entry reaches a rule, 1 when one cannot (or, "
        "with --strict, on a warning), 2 when a file cannot be read. generate: print the "
        "Envoy pieces that make a domain's rules reachable. Needs pip install ferryman[envoy].",
        epilog=EXAMPLES,
        formatter_class=RAW,
        parents=parents,
    )
    actions = envoy.add_subparsers(dest="envoy_command", required=True, metavar="ACTION")
    _add_check(actions, parents)
    _add_generate(actions, parents)
    return envoy


def _add_check(actions: Subcommands, parents: list[argparse.ArgumentParser]) -> None:
    check = actions.add_parser(
        "check", help="check Envoy files against the descriptors", parents=parents
    )
    check.add_argument("files", nargs="+", type=Path, metavar="ENVOY_FILE")
    check.add_argument(
        "--config", type=Path, help="descriptor directory (default: descriptors/ here)"
    )
    check.add_argument(
        "--format", choices=("text", "json"), default="text", help="output (default text)"
    )
    check.add_argument("--strict", action="store_true", help="fail on warnings too")


def _add_generate(actions: Subcommands, parents: list[argparse.ArgumentParser]) -> None:
    generate = actions.add_parser(
        "generate", help="print Envoy config reaching a domain's rules", parents=parents
    )
    generate.add_argument("--domain", required=True)
    generate.add_argument(
        "--config", type=Path, help="descriptor directory (default: descriptors/ here)"
    )
    generate.add_argument(
        "--format",
        choices=("envoy", "istio"),
        default="envoy",
        help="a bootstrap (default) or Istio EnvoyFilter manifests",
    )
    generate.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="KEY=HEADER",
        help="read descriptor key KEY from request header HEADER (default: the header KEY)",
    )
    generate.add_argument(
        "--ferryman",
        default="127.0.0.1:8081",
        metavar="HOST:PORT",
        help="ferryman's gRPC address (default 127.0.0.1:8081)",
    )
    generate.add_argument(
        "--upstream",
        default="127.0.0.1:8000",
        metavar="HOST:PORT",
        help="the upstream the routes lead to (default 127.0.0.1:8000)",
    )
    generate.add_argument(
        "--listen", type=port, default=10000, help="Envoy's listener port (default 10000)"
    )
    generate.add_argument(
        "--quota",
        nargs="?",
        const="",
        default=None,
        metavar="NAME",
        help="the rate limit quota filter instead (Envoy enforces the shares ferryman "
        "assigns); NAME names this Envoy on ferryman's pages (default envoy; with --format "
        "istio, none: each Envoy shows as its address, and a NAME would be every Envoy's)",
    )


def run(args: argparse.Namespace) -> int:
    from ferryman.envoy import needs_envoy_data_plane

    needs_envoy_data_plane()
    config, options = load_config(args.config)
    if args.envoy_command == "generate":
        return _generate(args, config, options)
    return _check(args, config, options)


def _generate(args: argparse.Namespace, config: Config, options: EngineOptions) -> int:
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
            quota=args.quota,
        ),
        end="",
    )
    return 0


def _check(args: argparse.Namespace, config: Config, options: EngineOptions) -> int:
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
