"""``ferryman config``: the config API from a terminal (get, apply, delete, history, diff,
rollback, reset-counter) against a server's debug port."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from ferryman.errors import FerrymanError

if TYPE_CHECKING:
    from ferryman.cli.common import Subcommands

__all__ = ["add_parser", "run"]

DEFAULT_TARGET = "http://127.0.0.1:6070"


class ApiError(FerrymanError):
    """The config API answered an error status."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        try:
            self.data: dict[str, Any] = json.loads(body)
            text = str(self.data.get("error", ""))
            problems = self.data.get("problems") or []
            text += "".join(f"\n  {p['text']}" for p in problems)
        except ValueError:
            self.data = {}
            text = body.decode("utf-8", "replace").strip()
        super().__init__(f"HTTP {status}: {text}")


def add_parser(sub: Subcommands, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    config = sub.add_parser(
        "config",
        help="read and change the configuration through a server's config API",
        description="Talk to the config API on a server's debug port, with a bearer token "
        "of its ADMIN_TOKENS_FILE.",
        parents=parents,
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--target", default=DEFAULT_TARGET, help=f"(default {DEFAULT_TARGET})")
    common.add_argument(
        "--token-file", type=Path, required=True, help="a file holding the bearer token"
    )
    actions = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    get = actions.add_parser("get", help="print a document (or list them)", parents=[common])
    get.add_argument("name", nargs="?")
    apply = actions.add_parser(
        "apply", help="write documents: diff and validation first", parents=[common]
    )
    apply.add_argument("files", nargs="+", type=Path, metavar="FILE")
    apply.add_argument("--yes", action="store_true", help="write without asking")
    apply.add_argument("--name", help="the document name (one FILE; default: its file name)")
    apply.add_argument("--summary", default="", help="one line for the history")
    delete = actions.add_parser("delete", help="delete a document", parents=[common])
    delete.add_argument("name")
    delete.add_argument("--yes", action="store_true", help="delete without asking")
    actions.add_parser("history", help="the versions, newest first", parents=[common])
    diff = actions.add_parser("diff", help="a unified diff of two versions", parents=[common])
    diff.add_argument("a", type=int)
    diff.add_argument("b", type=int)
    rollback = actions.add_parser(
        "rollback", help="a new version equal to an older one", parents=[common]
    )
    rollback.add_argument("version", type=int)
    reset = actions.add_parser(
        "reset-counter",
        help="clear a descriptor's counters (--domain, --descriptor) or fill a quota bucket "
        "again (--namespace, --bucket)",
        parents=[common],
    )
    reset.add_argument("--domain")
    reset.add_argument("--descriptor", help="k=v[,k=v...]")
    reset.add_argument("--namespace", help="a quota service namespace")
    reset.add_argument("--bucket", help="a quota service bucket name")
    return config


def _reset_request(args: argparse.Namespace) -> dict[str, Any]:
    """The reset's body: a descriptor of a domain, or a quota bucket (not both)."""
    descriptor = args.domain is not None or args.descriptor is not None
    bucket = args.namespace is not None or args.bucket is not None
    if descriptor == bucket or (descriptor and not (args.domain and args.descriptor)):
        raise FerrymanError(
            "reset-counter: give --domain and --descriptor, or --namespace and --bucket"
        )
    if bucket:
        if not (args.namespace and args.bucket):
            raise FerrymanError("reset-counter: give both --namespace and --bucket")
        return {"namespace": args.namespace, "bucket": args.bucket}
    entries = []
    for part in args.descriptor.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise FerrymanError(f"--descriptor: {part!r} is not key=value")
        entries.append({"key": key, "value": value})
    return {"domain": args.domain, "descriptor": entries}


class _Client:
    def __init__(self, target: str, token_file: Path) -> None:
        self.target = target.rstrip("/")
        self.token = token_file.read_text("utf-8").strip()

    def call(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(
            self.target + path,
            data=body,
            method=method,
            headers={"Authorization": f"Bearer {self.token}", **(headers or {})},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, exc.read()) from None

    def json(self, method: str, path: str, data: object | None = None) -> Any:
        body = None if data is None else json.dumps(data).encode()
        return json.loads(self.call(method, path, body, {"Content-Type": "application/json"})[2])


def _confirm(args: argparse.Namespace, question: str) -> bool:
    if args.yes:
        return True
    if not sys.stdin.isatty():
        print("not written: add --yes to write (or run on a terminal to be asked)")
        return False
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def _apply(client: _Client, args: argparse.Namespace) -> int:
    if args.name and len(args.files) != 1:
        raise FerrymanError("--name goes with one FILE")
    docs = {(args.name or f.name): f.read_text("utf-8") for f in args.files}
    for _ in range(3):
        check = client.json("POST", "/api/v1/validate", {"documents": docs})
        base = int(check["version"])
        print(check["diff"] or f"no change to version {base}", end="")
        if not check["valid"]:
            print(f"\ninvalid: {len(check['problems'])} problem(s):")
            for p in check["problems"]:
                print(f"  {p['text']}")
            return 1
        print(f"valid (on version {base})")
        if not check["diff"]:
            return 0
        if not _confirm(args, f"write {len(docs)} document(s) on version {base}?"):
            return 1
        try:
            # Every document in one version: the set that was validated is the set in force.
            query = "?" + urlencode({"summary": args.summary}) if args.summary else ""
            _, _, body = client.call(
                "PUT",
                f"/api/v1/config{query}",
                json.dumps({"documents": docs}).encode(),
                {"If-Match": f'"{base}"', "Content-Type": "application/json"},
            )
            print(f"wrote {', '.join(docs)}: version {int(json.loads(body)['version'])}")
            return 0
        except ApiError as exc:
            if exc.status != 412:
                raise
            print(f"the config changed meanwhile ({exc}); reading it again:")
            if args.yes:
                return 1  # never write over a change nobody has seen
    return 1


def run(args: argparse.Namespace) -> int:
    """Run one ``ferryman config`` action; 0 ok, 1 refused or invalid, 2 an error."""
    client = _Client(args.target, args.token_file)
    action = args.config_command
    try:
        if action == "get":
            if args.name is None:
                data = client.json("GET", "/api/v1/config")
                print(f"version {data['version']} by {data['author']}: {data['summary']}")
                for d in data["documents"]:
                    print(f"  {d['name']} ({d['size']} bytes)")
                return 0
            _, headers, body = client.call("GET", f"/api/v1/config/{quote(args.name)}")
            sys.stdout.write(body.decode("utf-8"))
            print(f"# version {headers.get('ETag', '?')}", file=sys.stderr)
            return 0
        if action == "apply":
            return _apply(client, args)
        if action == "delete":
            current = client.json("GET", "/api/v1/config")
            if not _confirm(args, f"delete {args.name} from version {current['version']}?"):
                return 1
            _, _, body = client.call(
                "DELETE",
                f"/api/v1/config/{quote(args.name)}",
                headers={"If-Match": f'"{current["version"]}"'},
            )
            print(f"deleted {args.name}: version {json.loads(body)['version']}")
            return 0
        if action == "history":
            data = client.json("GET", "/api/v1/history")
            for e in data["history"]:
                changed = f" [{', '.join(e['changed'])}]" if e["changed"] else ""
                who = f"{e['version']:>5}  {e['kind']:<8} {e['author']:<12}"
                print(f"{who} {e['summary']}{changed}")
            return 0
        if action == "diff":
            _, _, body = client.call("GET", f"/api/v1/diff?from={args.a}&to={args.b}")
            sys.stdout.write(body.decode("utf-8"))
            return 0
        if action == "rollback":
            data = client.json("POST", "/api/v1/rollback", {"version": args.version})
            print(f"version {data['version']}: {data['summary']}")
            return 0
        if action == "reset-counter":
            data = client.json("POST", "/api/v1/counters/reset", _reset_request(args))
            held = "cleared" if data["held"] else "nothing was counted"
            print(f"{data['kind']} {data['rule']} ({data['key']}): {held}")
            return 0
    except ApiError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except urllib.error.URLError as exc:
        raise FerrymanError(f"{args.target}: {exc.reason}") from None
    raise AssertionError(action)
