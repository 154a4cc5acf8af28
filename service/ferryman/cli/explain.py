"""``ferryman explain``: why a descriptor is limited (or not), from a descriptor directory,
a running server's debug port, or the descriptors an Envoy file's routes send."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from ferryman.cli.common import RAW, descriptor_arg, load_config
from ferryman.errors import SettingsError
from ferryman.settings import split_address

if TYPE_CHECKING:
    from ferryman.cli.common import Subcommands

__all__ = ["add_parser", "run"]

EXAMPLES = """examples:
  ferryman explain --config descriptors --domain messaging \\
      --descriptor message_type=marketing,to_number=2061111111
  ferryman explain --target 127.0.0.1:6070 --domain edge-proxy \\
      --descriptor remote_address=10.0.0.1 --format json   # with the current counts
  ferryman explain --envoy envoy/front-proxy.yaml --route /api/ --header :path=/api/v1
  ferryman explain --config envoy/quota/descriptors --domain quota --bucket tenant=acme"""


def add_parser(sub: Subcommands, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    explain = sub.add_parser(
        "explain",
        help="why a descriptor is limited (or not), counting nothing",
        description="Walk each descriptor through its domain's tree and print, level by "
        "level, what matched (exact value, wildcard, bare key) or what the tree expected, "
        "the rule reached, what replaces removes, and the counter; against a running server "
        "(its debug port) also the current count and what is left. Exit 0 when every "
        "descriptor reaches a rule, 1 when one does not, 2 on an error.",
        epilog=EXAMPLES,
        formatter_class=RAW,
        parents=parents,
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
        type=descriptor_arg,
        metavar="K=V[,K=V...]",
        help="one descriptor's entries, in order; repeat for several descriptors",
    )
    explain.add_argument(
        "--format", choices=("text", "json"), default="text", help="output (default text)"
    )
    explain.add_argument(
        "--bucket",
        type=descriptor_arg,
        metavar="K=V[,K=V...]",
        help="a rate limit quota bucket id (its entries in any order): the rule it reaches and "
        "what Envoys are assigned (with --target: also each Envoy's share now)",
    )
    _add_envoy_arguments(explain)
    return explain


def _add_envoy_arguments(explain: argparse.ArgumentParser) -> None:
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


def run(args: argparse.Namespace) -> int:
    from ferryman.engine.explain import explain, render

    if args.envoy:
        return _explain_envoy(args)
    if args.bucket is not None:
        return _explain_bucket(args)
    if not args.domain or not args.descriptors:
        raise SettingsError("explain: give --domain and --descriptor (or --envoy FILE)")
    if args.config is not None:
        config, options = load_config(args.config)
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


def _explain_bucket(args: argparse.Namespace) -> int:
    from ferryman.apis.rlqs import explain_bucket, render_bucket

    if not args.domain or args.descriptors:
        raise SettingsError("explain --bucket: give --domain (the filter's), and no --descriptor")
    bucket = dict(args.bucket)
    if args.config is not None:
        config, options = load_config(args.config)
        answer = explain_bucket(config, options, args.domain, bucket, time.time())
    else:
        answer = _get(
            args.target, "/rlqs/explain", [("domain", args.domain), ("bucket", _pairs(bucket))]
        )
    if args.format == "json":
        print(json.dumps(answer))
    else:
        print(render_bucket(answer), end="")
    return 0 if answer["entries"] else 1


def _pairs(bucket: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in bucket.items())


def _explain_envoy(args: argparse.Namespace) -> int:
    if args.target is not None or args.descriptors:
        raise SettingsError(
            "explain --envoy reads its descriptors from the Envoy files and the tree from "
            "--config: --target and --descriptor do not go with it"
        )
    from ferryman.envoy import needs_envoy_data_plane

    needs_envoy_data_plane()
    from ferryman.envoy.routes import Routes, render

    config, options = load_config(args.config)
    answer = Routes.read(args.envoy).explain(
        config,
        options,
        route=args.route,
        domain=args.domain or "",
        headers=args.header,
        remote_address=args.remote_address,
    )
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


def _explain_remote(args: argparse.Namespace) -> dict[str, Any]:
    """The explain answer of a running server's debug port, with its current counts."""
    query = [("domain", args.domain)] + [
        ("descriptor", ",".join(f"{k}={v}" for k, v in d)) for d in args.descriptors
    ]
    return _get(args.target, "/explain", query)


def _get(target: str | None, path: str, query: list[tuple[str, str]]) -> dict[str, Any]:
    """A debug page's JSON (``target``: the debug port, default 127.0.0.1:DEBUG_PORT)."""
    target = target or f"127.0.0.1:{os.environ.get('DEBUG_PORT') or '6070'}"
    host, port = split_address(target, "--target")
    conn = http.client.HTTPConnection(host or "127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", f"{path}?{urlencode(query)}")
        response = conn.getresponse()
        body = json.loads(response.read() or b"{}")
    finally:
        conn.close()
    if response.status != 200:
        raise SettingsError(f"{target}{path} answered {response.status}: {body.get('error')}")
    answer: dict[str, Any] = body
    return answer
