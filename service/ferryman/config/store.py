"""Config versions: every change to the set of documents is a numbered version (its
documents, who made it, when, and a one-line summary), kept in a bounded history.

Two stores keep them (``CONFIG_STORE``):

- :class:`FileStore` (``files``): the documents are the files of the config directory; a
  write replaces one file atomically (temporary file, fsync, rename) and the history is kept
  in a dot-directory inside it. A directory that cannot be written (a ConfigMap) makes the
  store read-only, and says why.
- :class:`RedisStore` (``redis``): documents and history in the backend's Redis under one
  hash tag; every replica follows the current version (pub/sub, and a poll as a backstop).

:class:`ConfigVersions` is the one place that edits: it validates the new set of documents
with the loader (the same errors as a file edit), commits it only on the version it was
based on, and puts it in force.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ferryman.config.loader import digest_sources, load_sources, read_directory
from ferryman.config.model import Config
from ferryman.config.reloader import ConfigHolder, describe_change
from ferryman.errors import (
    ConfigError,
    ConfigProblem,
    FerrymanError,
    NotFoundError,
    ReadOnlyError,
    RequestError,
    StaleVersionError,
)
from ferryman.stats import CONFIG_LOAD_SUCCESS, Stats

__all__ = [
    "HISTORY_DIR",
    "ConfigStore",
    "ConfigVersions",
    "FileStore",
    "RedisStore",
    "Snapshot",
    "Version",
    "check_name",
    "relative_documents",
    "unified_diff",
]

log = logging.getLogger("ferryman.config")

HISTORY_DIR = ".ferryman-history"
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
MAX_SUMMARY = 200


@dataclass(frozen=True)
class Version:
    """One entry of the history. ``kind``: ``api`` (a write), ``rollback``, ``files`` (a
    file edit, or the documents found at start), or ``reset`` (a counter reset: an event,
    which changes no document and keeps the version in force)."""

    number: int
    author: str
    time: float
    summary: str
    changed: tuple[str, ...] = ()
    kind: str = "api"
    event: Mapping[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "version": self.number,
            "author": self.author,
            "time": self.time,
            "summary": self.summary,
            "changed": list(self.changed),
            "kind": self.kind,
        }
        if self.event is not None:
            out["event"] = dict(self.event)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Version:
        return cls(
            int(data["version"]),
            str(data["author"]),
            float(data["time"]),
            str(data["summary"]),
            tuple(data.get("changed", ())),
            str(data.get("kind", "api")),
            data.get("event"),
        )


@dataclass(frozen=True)
class Snapshot:
    """A version and its documents (name -> YAML text)."""

    version: Version
    documents: Mapping[str, str] = field(default_factory=dict)


def check_name(name: str) -> str:
    """A document name: a relative ``.yaml``/``.yml`` path of plain parts (no dot files,
    no ``..``); RequestError naming the problem otherwise."""
    parts = name.split("/")
    if not name.endswith((".yaml", ".yml")) or not all(_NAME.fullmatch(p) for p in parts):
        raise RequestError(
            "name",
            f"{name!r} is not a document name: a relative path of letters, digits, '_', '-' "
            "and '.' ending in .yaml or .yml, no part starting with a dot",
        )
    return name


def unified_diff(
    before: Mapping[str, str], after: Mapping[str, str], a: str = "a", b: str = "b"
) -> str:
    """The documents' changes as one unified diff (``a/name`` and ``b/name`` headers)."""
    out: list[str] = []
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        out.extend(
            difflib.unified_diff(
                (old or "").splitlines(keepends=True),
                (new or "").splitlines(keepends=True),
                f"{a}/{name}" if old is not None else "/dev/null",
                f"{b}/{name}" if new is not None else "/dev/null",
            )
        )
    text = "".join(line if line.endswith("\n") else line + "\n" for line in out)
    return text


def changed_names(before: Mapping[str, str], after: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(n for n in sorted(set(before) | set(after)) if before.get(n) != after.get(n))


class ConfigStore(Protocol):
    """Where versions live."""

    kind: str
    # Why writes are refused (None: they are not).
    read_only: str | None

    def current(self) -> Snapshot:
        """The version in force here, with its documents."""
        ...

    async def history(self) -> list[Version]:
        """Every kept entry, newest first."""
        ...

    async def snapshot(self, number: int) -> Snapshot:
        """A kept version's documents; NotFoundError when it is not kept."""
        ...

    async def commit(self, documents: Mapping[str, str], base: int, entry: Version) -> Version:
        """Make ``documents`` version ``base + 1`` if ``base`` is still the latest;
        StaleVersionError otherwise."""
        ...

    async def record(self, entry: Version) -> None:
        """Add an event (a counter reset) to the history."""
        ...


def relative_documents(directory: Path, sources: list[tuple[str, str]]) -> dict[str, str]:
    """Documents by name (the path relative to ``directory``) from read_directory's pairs."""
    return {os.path.relpath(path, directory): text for path, text in sources}


class FileStore:
    """Versions of the config directory's files, with the history in a dot-directory."""

    kind = "files"

    def __init__(self, directory: Path, keep: int, ignore_dotfiles: bool = True) -> None:
        self.directory = directory
        self._keep = keep
        self._ignore_dotfiles = ignore_dotfiles
        self._history_dir = directory / HISTORY_DIR
        self._entries: list[Snapshot] = []  # oldest first; events carry no documents
        self._current: Snapshot = Snapshot(Version(0, "", 0.0, "no version yet", kind="files"))
        self.read_only = self._why_read_only()

    def _why_read_only(self) -> str | None:
        d = self.directory
        if (d / "..data").is_symlink():
            return (
                f"the config directory {d} is a Kubernetes ConfigMap volume: change the "
                "ConfigMap (or set CONFIG_STORE=redis)"
            )
        try:
            fd, probe = tempfile.mkstemp(prefix=".ferryman-probe-", dir=d)
        except OSError as exc:
            return f"the config directory {d} cannot be written ({exc.strerror or exc})"
        os.close(fd)
        os.unlink(probe)
        return None

    def load(self) -> None:
        """Read the kept history and the files (blocking: at start, in a thread)."""
        if self._history_dir.is_dir():
            for path in sorted(self._history_dir.glob("*.json")):
                try:
                    data = json.loads(path.read_text("utf-8"))
                    entry = Version.from_dict(data)
                    docs = data.get("documents")
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    log.warning("config history: skipping %s: %s", path, exc)
                    continue
                self._entries.append(Snapshot(entry, docs if docs is not None else {}))
            self._entries.sort(key=lambda s: (s.version.number, s.version.time))
            for snap in reversed(self._entries):
                if snap.version.kind != "reset":
                    self._current = snap
                    break
        self.sync_files()

    def sync_files(self) -> Version | None:
        """A new version when the files differ from the latest (blocking)."""
        try:
            docs = relative_documents(
                self.directory,
                read_directory(self.directory, ignore_dotfiles=self._ignore_dotfiles),
            )
        except ConfigError:
            return None
        before = self._current.documents
        if self._current.version.number and docs == before:
            return None
        changed = changed_names(before, docs)
        summary = (
            "the files found at start"
            if not self._current.version.number
            else "edited in the config directory: " + ", ".join(changed)
        )
        entry = Version(
            self._current.version.number + 1, "files", time.time(), summary, changed, "files"
        )
        self._add(Snapshot(entry, docs))
        return entry

    def current(self) -> Snapshot:
        return self._current

    async def history(self) -> list[Version]:
        return [s.version for s in reversed(self._entries)]

    async def snapshot(self, number: int) -> Snapshot:
        if number == self._current.version.number:
            return self._current
        for snap in self._entries:
            if snap.version.number == number and snap.version.kind != "reset":
                return snap
        raise NotFoundError(
            "version",
            f"version {number} is not kept (the history keeps the last {self._keep} entries)",
        )

    async def commit(self, documents: Mapping[str, str], base: int, entry: Version) -> Version:
        if self.read_only:
            raise ReadOnlyError(self.read_only)
        if base != self._current.version.number:
            raise StaleVersionError(self._current.version.number)
        await asyncio.to_thread(self._commit_now, dict(documents), entry)
        return entry

    def _commit_now(self, documents: dict[str, str], entry: Version) -> None:
        self._write_files(self._current.documents, documents)
        self._add(Snapshot(entry, documents))

    async def record(self, entry: Version) -> None:
        await asyncio.to_thread(self._add, Snapshot(entry))

    def _add(self, snap: Snapshot) -> None:
        self._entries.append(snap)
        if snap.version.kind != "reset":
            self._current = snap
        dropped = self._entries[: max(0, len(self._entries) - self._keep)]
        del self._entries[: len(dropped)]
        if self.read_only:
            return  # kept in memory only
        try:
            self._history_dir.mkdir(exist_ok=True)
            data = snap.version.as_dict()
            if snap.version.kind != "reset":
                data["documents"] = dict(snap.documents)
            name = f"{snap.version.number:08d}-{time.time_ns()}.json"
            _atomic_write(self._history_dir / name, json.dumps(data))
            kept = {f"{s.version.number:08d}-" for s in self._entries}
            for path in self._history_dir.glob("*.json"):
                if path.name[:9] not in kept:
                    path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("config history: cannot write in %s: %s", self._history_dir, exc)

    def _write_files(self, before: Mapping[str, str], after: Mapping[str, str]) -> None:
        for name in sorted(set(before) | set(after)):
            path = self.directory / name
            if name not in after:
                path.unlink(missing_ok=True)
            elif before.get(name) != after[name]:
                path.parent.mkdir(parents=True, exist_ok=True)
                _atomic_write(path, after[name])


def _atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new, never a part:
    a temporary (dot) file beside it, fsync, rename, fsync of the directory."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        try:
            mode = os.stat(path).st_mode & 0o777
        except FileNotFoundError:
            mode = 0o644
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class RedisStore:
    """Versions in Redis, under one hash tag (one Cluster slot): ``current`` (the latest
    number), ``v:<n>`` (a hash of version n's documents and metadata), ``history`` (a list
    of entries, newest first) and the channel ``changes``.

    ``connection`` is the backend's RedisConnection (typed loosely: the config part does not
    depend on the connections part's internals beyond ``run``, ``command`` and ``target``).
    """

    kind = "redis"
    read_only: str | None = None

    def __init__(self, connection: Any, keep: int, prefix: str = "") -> None:
        from ferryman.connections.redis import LuaScript

        self._conn = connection
        self._keep = keep
        self._tag = "{" + prefix + "ferryman_config}"
        self._commit = LuaScript.of(__package__ or "", "commit.lua")
        self._current: Snapshot = Snapshot(Version(0, "", 0.0, "no version yet", kind="files"))

    def key(self, name: str) -> str:
        return f"{self._tag}:{name}"

    @property
    def channel(self) -> str:
        return self.key("changes")

    def current(self) -> Snapshot:
        return self._current

    async def latest(self) -> int:
        """The latest version number in Redis (0: none yet)."""
        raw = await self._conn.command("GET", self.key("current"), key=self.key("current"))
        return int(raw) if raw else 0

    async def history(self) -> list[Version]:
        raw = await self._conn.command(
            "LRANGE", self.key("history"), 0, -1, key=self.key("history")
        )
        return [Version.from_dict(json.loads(_text(item))) for item in raw or []]

    async def snapshot(self, number: int) -> Snapshot:
        if number == self._current.version.number and number:
            return self._current
        key = self.key(f"v:{number}")
        raw = await self._conn.command("HGETALL", key, key=key)
        fields = _pairs(raw)
        if "meta" not in fields:
            raise NotFoundError(
                "version",
                f"version {number} is not kept (the history keeps the last {self._keep})",
            )
        docs = {k[2:]: v for k, v in fields.items() if k.startswith("d:")}
        return Snapshot(Version.from_dict(json.loads(fields["meta"])), docs)

    async def follow(self) -> Snapshot | None:
        """The latest version when it is not the one in force here (else None)."""
        latest = await self.latest()
        if latest == 0 or latest == self._current.version.number:
            return None
        snap = await self.snapshot(latest)
        self._current = snap
        return snap

    async def commit(self, documents: Mapping[str, str], base: int, entry: Version) -> Version:
        args: list[Any] = [base, entry.number, json.dumps(entry.as_dict()), self._keep]
        for name, text in sorted(documents.items()):
            args.extend((name, text))
        drop = entry.number - self._keep
        keys = [
            self.key("current"),
            self.key("history"),
            self.key(f"v:{entry.number}"),
            self.key(f"v:{drop}" if drop > 0 else "v:0"),
        ]
        reply = await self._conn.run(self._commit, keys, args)
        if int(reply[0]) != 1:
            raise StaleVersionError(int(reply[1]))
        self._current = Snapshot(entry, dict(documents))
        with contextlib.suppress(FerrymanError):
            await self._conn.command("PUBLISH", self.channel, entry.number, key=self.channel)
        return entry

    async def record(self, entry: Version) -> None:
        history = self.key("history")
        await self._conn.command("LPUSH", history, json.dumps(entry.as_dict()), key=history)
        await self._conn.command("LTRIM", history, 0, self._keep - 1, key=history)


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _pairs(raw: Any) -> dict[str, str]:
    if isinstance(raw, dict):
        return {_text(k): _text(v) for k, v in raw.items()}
    items = [_text(v) for v in raw or []]
    return dict(zip(items[::2], items[1::2], strict=True))


class ConfigVersions:
    """Edits through a store: validated by the loader, committed on the version they were
    based on, put in force, logged and counted."""

    def __init__(
        self,
        store: ConfigStore,
        holder: ConfigHolder,
        stats: Stats,
        *,
        merge_domains: bool = False,
        apply: Callable[[], Any] | None = None,
    ) -> None:
        self.store = store
        self._holder = holder
        self._stats = stats
        self._merge = merge_domains
        # Files: reload the directory now (the watcher would too, a little later).
        self._apply = apply
        self._lock = asyncio.Lock()

    @property
    def lock(self) -> asyncio.Lock:
        return self._lock

    def validate(self, documents: Mapping[str, str]) -> Config:
        """The Config of ``documents``; ConfigError with every problem (file: the name)."""
        return load_sources(sorted(documents.items()), merge_domains=self._merge)

    async def change(
        self,
        name: str,
        text: str | None,
        base: int,
        author: str,
        summary: str = "",
    ) -> Version:
        """Write (``text``) or delete (None) one document on version ``base``."""
        check_name(name)
        async with self._lock:
            current = self.store.current()
            if self.store.read_only:
                raise ReadOnlyError(self.store.read_only)
            if base != current.version.number:
                raise StaleVersionError(current.version.number)
            docs = dict(current.documents)
            if text is None:
                if name not in docs:
                    raise NotFoundError("name", f"no document {name!r}")
                del docs[name]
                what = f"deleted {name}"
            else:
                docs[name] = text
                what = f"{'changed' if name in current.documents else 'added'} {name}"
            return await self._commit(docs, current, author, summary or what, "api")

    async def rollback(self, number: int, author: str) -> Version:
        """A new version whose documents are version ``number``'s."""
        async with self._lock:
            current = self.store.current()
            if self.store.read_only:
                raise ReadOnlyError(self.store.read_only)
            old = await self.store.snapshot(number)
            summary = f"rollback to version {number}"
            return await self._commit(dict(old.documents), current, author, summary, "rollback")

    async def _commit(
        self, docs: dict[str, str], current: Snapshot, author: str, summary: str, kind: str
    ) -> Version:
        config = await asyncio.to_thread(self.validate, docs)
        changed = changed_names(current.documents, docs)
        entry = Version(
            current.version.number + 1,
            author,
            time.time(),
            " ".join(summary.split())[:MAX_SUMMARY],
            changed,
            kind,
        )
        version = await self.store.commit(docs, current.version.number, entry)
        self._stats.inc("ratelimit.service.config_api.writes")
        log.info(
            "config version %d written by %s: %s (%s)",
            version.number,
            author,
            version.summary,
            ", ".join(changed) or "no document changed",
            extra={"fields": {**version.as_dict(), "event": "config_write"}},
        )
        if self._apply is not None:
            await self._apply()
        else:
            self.put_in_force(config, version)
        return version

    def put_in_force(self, config: Config, version: Version) -> None:
        """Serve ``config`` (a version read from the store)."""
        change = describe_change(self._holder.config, config)
        self._holder.swap(config)
        self._holder.last_error = None
        self._stats.inc(CONFIG_LOAD_SUCCESS)
        log.info(
            "config version %d in force (%s, by %s): %s",
            version.number,
            version.kind,
            version.author,
            change,
            extra={"fields": {"version": version.number}},
        )

    async def event(self, author: str, summary: str, event: Mapping[str, Any]) -> Version:
        """Record an event (a counter reset) at the version in force."""
        current = self.store.current().version.number
        entry = Version(current, author, time.time(), summary, (), "reset", dict(event))
        await self.store.record(entry)
        log.info(
            "%s by %s", summary, author, extra={"fields": {**entry.as_dict(), "event": "reset"}}
        )
        return entry


def config_problem_dict(problem: ConfigProblem) -> dict[str, Any]:
    return {
        "file": problem.file,
        "line": problem.line,
        "column": problem.column,
        "path": problem.path,
        "message": problem.message,
        "text": str(problem),
    }


def digest(documents: Mapping[str, str]) -> str:
    return digest_sources(sorted(documents.items()))
