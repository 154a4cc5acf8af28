"""``ferryman check``: validate a descriptor directory as ``serve`` loads it, and list it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ferryman.algorithms import BY_NAME, COUNTERS, algorithm_of
from ferryman.cli.common import RAW, require_directory
from ferryman.config.loader import load_sources, read_directory
from ferryman.core.rules import Limit
from ferryman.errors import ConfigError
from ferryman.settings import Settings

if TYPE_CHECKING:
    from ferryman.cli.common import Subcommands
    from ferryman.config.model import Config

__all__ = ["add_parser", "run"]

EXAMPLES = """examples:
  ferryman check descriptors/
  ferryman check --format json k8s/base/descriptors | jq '.domains[].name'"""


def add_parser(sub: Subcommands, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    check = sub.add_parser(
        "check",
        help="validate a descriptor directory",
        description="Validate a descriptor directory exactly as `serve` loads it, and list "
        "its domains and limits. Exit 0 when valid, 1 when it has errors, 2 when it cannot "
        "be read.",
        epilog=EXAMPLES,
        formatter_class=RAW,
        parents=parents,
    )
    check.add_argument("directory", type=Path)
    check.add_argument(
        "--format", choices=("text", "json"), default="text", help="output (default text)"
    )
    return check


def run(args: argparse.Namespace) -> int:
    directory: Path = args.directory
    settings = Settings.from_env()
    require_directory(directory, "the path given to ferryman check")
    _progress(f"reading {directory} ...")
    try:
        sources = read_directory(directory, ignore_dotfiles=settings.ignore_dotfiles)
        _progress(f"validating {len(sources)} file(s) of {directory} ...")
        config = load_sources(
            sources, merge_domains=settings.merge_domain_config, strict=settings.strict_config
        )
    except ConfigError as exc:
        _progress("")
        _print_problems(exc, directory, args.format)
        return 1
    _progress("")
    domains = _domains(config)
    if args.format == "json":
        _print_json(config, domains, directory)
    else:
        _print_text(config, domains)
    return 0


def _progress(text: str) -> None:
    """A status line on a terminal, overwritten by the next; nothing when stderr is piped."""
    if sys.stderr.isatty():
        print(f"\r\033[K{text}", end="", file=sys.stderr, flush=True)


def _print_problems(exc: ConfigError, directory: Path, fmt: str) -> None:
    if fmt == "json":
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
        return
    for problem in exc.problems:
        print(f"error: {problem}")
    print(f"{len(exc.problems)} error(s) in {directory}")


def _limit_text(limit: Limit) -> tuple[str, str | None]:
    """A rule's limit in a few words (a fixed window as ``N/unit``), and its name."""
    algorithm = algorithm_of(limit.kind)
    described = algorithm.describe(limit)
    counters = algorithm.name == COUNTERS.name
    rate = algorithm.reported(limit) if counters else None
    if described["kind"] not in BY_NAME:
        what = described["kind"]
    elif rate is not None and rate.unit is not None:
        what = f"{rate.requests_per_unit}/{rate.unit.name.lower()}"
    else:
        what = algorithm.text(described)
    return what, described.get("name") if counters else None


def _domains(config: Config) -> list[dict[str, Any]]:
    """Each domain, sorted by name, with its files and the limits of its rules."""
    domains: list[dict[str, Any]] = []
    for name in sorted(config.domains):
        limits: list[dict[str, Any]] = []
        for dom, rule in config.iter_limits():
            if dom != name:
                continue
            if rule.limit is None:
                continue
            what, label = _limit_text(rule.limit)
            limits.append(
                {
                    "key": rule.stats_key,
                    "limit": what,
                    "name": label,
                    "shadow_mode": rule.shadow_mode,
                    "quota_mode": rule.quota_mode,
                    "max_wait": rule.max_wait or None,
                }
            )
        found = config.domains[name]
        domains.append(
            {
                "name": name,
                "files": list(found.files),
                "allow_unconfigured": found.allow_unconfigured,
                "ignore_limits": found.ignore_limits,
                "limits": limits,
            }
        )
    return domains


def _print_json(config: Config, domains: list[dict[str, Any]], directory: Path) -> None:
    report = {
        "ok": True,
        "directory": str(directory),
        "notes": [str(note) for note in config.notes],
        "warnings": [str(warning) for warning in config.warnings],
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


def _print_text(config: Config, domains: list[dict[str, Any]]) -> None:
    for note in config.notes:
        print(f"note: {note}")
    for warning in config.warnings:
        print(f"warning: {warning}")
    for domain in domains:
        switches = [s for s in ("allow_unconfigured", "ignore_limits") if domain[s]]
        on = f" [{', '.join(switches)}]" if switches else ""
        print(f"domain {domain['name']} ({', '.join(domain['files'])}){on}")
        for entry in domain["limits"]:
            flags = [f for f in ("shadow_mode", "quota_mode") if entry[f]]
            if entry["max_wait"]:
                flags.insert(0, f"max_wait {entry['max_wait']:g}s")
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
