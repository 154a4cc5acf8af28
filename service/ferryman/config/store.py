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
import fcntl
import json
import logging
import os
import re
import stat
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ferryman.config.loader import digest_sources, load_sources, read_directory
from ferryman.config.model import Config
from ferryman.config.reloader import ConfigHolder, reject_config, swap_config
from ferryman.errors import (
    ConfigError,
    ConfigProblem,
    FerrymanError,
    NotFoundError,
    ReadOnlyError,
    RequestError,
    StaleVersionError,
    StoreError,
)
from ferryman.stats import Stats

if TYPE_CHECKING:
    from ferryman.access.signing import Signer
    from ferryman.connections.redis import RedisConnection

__all__ = [
    "HISTORY_DIR",
    "ConfigStore",
    "ConfigVersions",
    "FileStore",
    "Origin",
    "RedisStore",
    "Rejected",
    "Snapshot",
    "Version",
    "check_layout",
    "check_name",
    "diff_documents",
    "relative_documents",
    "unified_diff",
]

log = logging.getLogger("ferryman.config")

HISTORY_DIR = ".ferryman-history"
# The lock file in HISTORY_DIR that the processes writing one directory (workers) share.
LOCK_FILE = ".lock"
LOCK_POLL = 0.005
# A document longer than this (lines, either side) is not diffed: difflib's time grows with
# the square of the lines that differ.
MAX_DIFF_LINES = 5000
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
# A file name's length on common file systems (NAME_MAX, 255) less the staged file's dot,
# random part and ``.tmp``; and a bound on the whole path.
MAX_PART = 240
MAX_NAME = 1024
MAX_SUMMARY = 200


@dataclass(frozen=True)
class Origin:
    """Where a change came from: the caller's identity (its client certificate, or
    ``anonymous``) and its address."""

    identity: str = ""
    peer: str = ""


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
    origin: Origin = Origin()

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
        if self.origin != Origin():
            out["identity"], out["peer"] = self.origin.identity, self.origin.peer
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
            Origin(str(data.get("identity", "")), str(data.get("peer", ""))),
        )


@dataclass(frozen=True)
class Snapshot:
    """A version and its documents (name -> YAML text)."""

    version: Version
    documents: Mapping[str, str] = field(default_factory=dict)


def check_name(name: str) -> str:
    """A document name: a relative ``.yaml``/``.yml`` path of plain parts (no dot files,
    no ``..``), each short enough to be a file's name; RequestError naming the problem
    otherwise."""
    parts = name.split("/")
    if not name.endswith((".yaml", ".yml")) or not all(_NAME.fullmatch(p) for p in parts):
        raise RequestError(
            "name",
            f"{name[:MAX_NAME]!r} is not a document name: a relative path of letters, digits, "
            "'_', '-' and '.' ending in .yaml or .yml, no part starting with a dot",
        )
    if len(name) > MAX_NAME or max(map(len, parts)) > MAX_PART:
        raise RequestError(
            "name",
            f"{name[:80]!r}... is too long for a document name: at most {MAX_PART} "
            f"characters between slashes, {MAX_NAME} in all",
        )
    return name


def check_layout(documents: Mapping[str, str]) -> None:
    """RequestError when a document's name puts it inside another document (``web.yaml``
    and ``web.yaml/b.yaml``): the two cannot both be files."""
    for name in documents:
        parts = name.split("/")
        for i in range(1, len(parts)):
            outer = "/".join(parts[:i])
            if outer in documents:
                raise RequestError(
                    "name", f"{name!r} would be inside {outer!r}, which is a document"
                )


def diff_documents(
    before: Mapping[str, str],
    after: Mapping[str, str],
    a: str = "a",
    b: str = "b",
    max_lines: int = MAX_DIFF_LINES,
) -> tuple[str, list[str]]:
    """The documents' changes as one unified diff (``a/name`` and ``b/name`` headers), and
    the names of the documents left out of it because either side is longer than
    ``max_lines`` lines (a line in the diff says so). CPU-bound: call it in a thread."""
    out: list[str] = []
    capped: list[str] = []
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        old_lines = (old or "").splitlines(keepends=True)
        new_lines = (new or "").splitlines(keepends=True)
        if max(len(old_lines), len(new_lines)) > max_lines:
            capped.append(name)
            out.append(
                f"# {name}: not diffed, longer than {max_lines} lines "
                f"({len(old_lines)} -> {len(new_lines)} lines)\n"
            )
            continue
        out.extend(
            difflib.unified_diff(
                old_lines,
                new_lines,
                f"{a}/{name}" if old is not None else "/dev/null",
                f"{b}/{name}" if new is not None else "/dev/null",
            )
        )
    text = "".join(line if line.endswith("\n") else line + "\n" for line in out)
    return text, capped


def unified_diff(
    before: Mapping[str, str], after: Mapping[str, str], a: str = "a", b: str = "b"
) -> str:
    """The documents' changes as one unified diff (see :func:`diff_documents`)."""
    return diff_documents(before, after, a, b)[0]


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

    def exclusive(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Held around a check and a write: the one writer among the processes that share
        the store, with this process's view read again under it."""
        ...

    async def refresh(self) -> None:
        """Read again what other processes may have written (before answering a read)."""
        ...

    async def newer(self) -> Snapshot | None:
        """The latest version when the store decides what is in force and it is not the
        one in force here (else None)."""
        ...

    def adopt(self, snap: Snapshot) -> None:
        """``snap`` (from :meth:`newer`, validated) is in force here."""
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
    """Versions of the config directory's files, with the history in a dot-directory.

    The history directory is the truth: several processes (workers) may write one
    directory, so each check-and-write holds an exclusive ``flock`` on a lock file in it and
    reads the entries again under it; a process's view is read again before it answers."""

    kind = "files"

    def __init__(self, directory: Path, keep: int, ignore_dotfiles: bool = True) -> None:
        self.directory = directory
        self._keep = keep
        self._ignore_dotfiles = ignore_dotfiles
        self._history_dir = directory / HISTORY_DIR
        self._files: dict[str, Snapshot] = {}  # history file name -> its entry
        self._unreadable: set[str] = set()  # history files skipped (reported once)
        self._entries: list[Snapshot] = []  # oldest first; events carry no documents
        self._current: Snapshot = Snapshot(Version(0, "", 0.0, "no version yet", kind="files"))
        # One thread of this process reads or changes the view at a time.
        self._mutex = threading.Lock()
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

    # -- the lock shared by the processes writing the directory ----------------------------

    def _open_lock(self) -> int:
        try:
            self._history_dir.mkdir(exist_ok=True)
            return os.open(self._history_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreError(
                f"cannot open the lock file in {self._history_dir}: {exc.strerror or exc}"
            ) from None

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        if self.read_only:
            yield  # nothing is written: no other process to agree with
            return
        fd = await asyncio.to_thread(self._open_lock)
        try:
            while True:  # polled, so that a cancelled waiter leaves no thread holding it
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    await asyncio.sleep(LOCK_POLL)
            await asyncio.to_thread(self._reread)
            yield
        finally:
            os.close(fd)  # releases the lock

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The exclusive lock, waited for in this thread (start, and the watcher's edits)."""
        if self.read_only:
            yield
            return
        fd = self._open_lock()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    # -- the view -----------------------------------------------------------------------------

    def _reread(self) -> None:
        """Read the history directory again (only the entries not read yet)."""
        with self._mutex:
            try:
                names = sorted(n for n in os.listdir(self._history_dir) if n.endswith(".json"))
            except FileNotFoundError:
                names = []
            except OSError as exc:
                log.warning("config history: cannot read %s: %s", self._history_dir, exc)
                return
            files: dict[str, Snapshot] = {}
            for name in names:
                snap = self._files.get(name)
                if snap is None and name not in self._unreadable:
                    snap = self._read_entry(name)
                if snap is not None:
                    files[name] = snap
            self._files = files
            self._entries = sorted(files.values(), key=lambda s: (s.version.number, s.version.time))
            for snap in reversed(self._entries):
                if snap.version.kind != "reset":
                    self._current = snap
                    break

    def _read_entry(self, name: str) -> Snapshot | None:
        path = self._history_dir / name
        try:
            data = json.loads(path.read_text("utf-8"))
            entry = Version.from_dict(data)
            docs = data.get("documents")
        except FileNotFoundError:
            return None  # trimmed by another process meanwhile
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("config history: skipping %s: %s", path, exc)
            self._unreadable.add(name)
            return None
        return Snapshot(entry, docs if docs is not None else {})

    def load(self) -> None:
        """Read the kept history and the files (blocking: at start, in a thread)."""
        with self._locked():
            self._reread()
            self._sync_now()

    async def refresh(self) -> None:
        if not self.read_only:
            await asyncio.to_thread(self._reread)

    async def newer(self) -> Snapshot | None:
        return None  # the directory's watcher puts the files in force

    def adopt(self, snap: Snapshot) -> None:
        raise AssertionError("the files store never offers a newer version")

    def sync_files(self) -> Version | None:
        """A new version when the files differ from the latest (blocking)."""
        try:
            with self._locked():
                self._reread()
                return self._sync_now()
        except StoreError as exc:
            log.warning("config history: %s", exc)
            return None

    def _sync_now(self) -> Version | None:
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
        try:
            self._add(Snapshot(entry, docs))
        except StoreError as exc:
            log.warning("config history: %s", exc)
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
        """Under :meth:`exclusive`: write the files, then the history entry."""
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
        """Under :meth:`exclusive`."""
        await asyncio.to_thread(self._add, Snapshot(entry))

    def _add(self, snap: Snapshot) -> None:
        with self._mutex:
            if self.read_only:  # kept in memory only
                name = f"{snap.version.number:08d}-{time.time_ns()}.json"
            else:
                name = self._write_entry(snap)
            self._files[name] = snap
            self._entries.append(snap)
            if snap.version.kind != "reset":
                self._current = snap
            dropped = self._entries[: max(0, len(self._entries) - self._keep)]
            del self._entries[: len(dropped)]
            kept = {f"{s.version.number:08d}-" for s in self._entries}
            for old in [n for n in self._files if n[:9] not in kept]:
                del self._files[old]
                if not self.read_only:
                    with contextlib.suppress(OSError):
                        (self._history_dir / old).unlink()

    def _write_entry(self, snap: Snapshot) -> str:
        data = snap.version.as_dict()
        if snap.version.kind != "reset":
            data["documents"] = dict(snap.documents)
        name = f"{snap.version.number:08d}-{time.time_ns()}.json"
        try:
            self._history_dir.mkdir(exist_ok=True)
            _atomic_write(self._history_dir / name, json.dumps(data))
        except OSError as exc:
            raise StoreError(
                f"cannot write the history entry of version {snap.version.number} in "
                f"{self._history_dir}: {exc.strerror or exc}"
            ) from None
        return name

    def _path(self, name: str) -> Path:
        """Where document ``name`` is written: inside the directory, through no symbolic
        link and no file standing where a directory is needed; RequestError otherwise."""
        root = self.directory.resolve()
        parts = name.split("/")
        here = root
        for i, part in enumerate(parts[:-1]):
            here = here / part
            shown = "/".join(parts[: i + 1])
            try:
                mode = os.lstat(here).st_mode
            except FileNotFoundError:
                break  # made by the write
            except OSError as exc:
                raise StoreError(f"cannot read {here}: {exc.strerror or exc}") from None
            if stat.S_ISLNK(mode):
                raise RequestError(
                    "name",
                    f"{name!r}: {shown} is a symbolic link; documents are written only "
                    f"inside {self.directory}",
                )
            if not stat.S_ISDIR(mode):
                raise RequestError("name", f"{name!r}: {shown} is a file, not a directory")
        path = root.joinpath(*parts)
        if path.is_dir() and not path.is_symlink():
            raise RequestError("name", f"{name!r} is a directory")
        return path

    def _write_files(self, before: Mapping[str, str], after: Mapping[str, str]) -> None:
        """Every temporary file is written first, then all are renamed: a write that
        fails leaves every document as it was."""
        changes: list[tuple[str, str | None, Path]] = []
        staged: list[tuple[str, Path]] = []
        name, renaming = "", False
        try:
            for name in sorted(set(before) | set(after)):
                if before.get(name) != after.get(name):
                    changes.append((name, after.get(name), self._path(name)))
            for name, text, path in changes:
                if text is None:
                    continue
                path.parent.mkdir(parents=True, exist_ok=True)
                if not path.parent.resolve().is_relative_to(self.directory.resolve()):
                    raise RequestError("name", f"{name!r} is not inside {self.directory}")
                staged.append((_staged(path, text), path))
            renaming = True
            while staged:
                tmp, path = staged[0]
                name = os.path.relpath(path, self.directory.resolve())
                os.replace(tmp, path)
                staged.pop(0)
            for _, text, path in changes:
                if text is None:
                    path.unlink(missing_ok=True)
            for parent in {path.parent for _, _, path in changes}:
                _fsync_dir(parent)
        except OSError as exc:
            why = f"cannot write {name} in {self.directory}: {exc.strerror or exc}"
            raise StoreError(why if renaming else why + "; no document was changed") from None
        finally:
            for tmp, _ in staged:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)


def _staged(path: Path, text: str) -> str:
    """``text`` in a temporary (dot) file beside ``path``, with ``path``'s mode, synced."""
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
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def _fsync_dir(directory: Path) -> None:
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new, never a part:
    a temporary (dot) file beside it, fsync, rename, fsync of the directory."""
    tmp = _staged(path, text)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


class RedisStore:
    """Versions in Redis, under one hash tag (one Cluster slot): ``current`` (the latest
    number), ``v:<n>`` (a hash of version n's documents and metadata), ``history`` (a list
    of entries, newest first) and the channel ``changes``.

    The Lua script's compare-and-set makes the writers of every replica agree, so
    :meth:`exclusive` holds nothing; a replica's version in force moves only when
    :class:`ConfigVersions` has validated the latest (:meth:`newer`, :meth:`adopt`)."""

    kind = "redis"
    read_only: str | None = None

    def __init__(
        self,
        connection: RedisConnection,
        keep: int,
        prefix: str = "",
        signer: Signer | None = None,
    ) -> None:
        from ferryman.connections.redis import LuaScript

        # With a keyed signer, each version carries a signature of its entry and documents,
        # and a version without a valid one (a direct write to Redis) is never put in force.
        self._signer = signer if signer is not None and signer.keyed else None
        self.connection = connection
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

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        yield

    async def refresh(self) -> None:
        return None  # followed by ConfigVersions.follow

    async def latest(self) -> int:
        """The latest version number in Redis (0: none yet)."""
        key = self.key("current")
        raw = await self.connection.command("GET", key, key=key)
        try:
            return int(raw) if raw else 0
        except ValueError:
            raise StoreError(f"config store: {key} holds {raw!r}, not a version number") from None

    async def history(self) -> list[Version]:
        key = self.key("history")
        raw = await self.connection.command("LRANGE", key, 0, -1, key=key)
        out: list[Version] = []
        for item in raw or []:
            try:
                out.append(Version.from_dict(json.loads(_text(item))))
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("config store: skipping a malformed entry of %s: %s", key, exc)
        return out

    async def snapshot(self, number: int) -> Snapshot:
        if number == self._current.version.number and number:
            return self._current
        key = self.key(f"v:{number}")
        raw = await self.connection.command("HGETALL", key, key=key)
        fields = _pairs(raw)
        if "meta" not in fields:
            raise NotFoundError(
                "version",
                f"version {number} is not kept (the history keeps the last {self._keep})",
            )
        try:
            meta = json.loads(fields["meta"])
            version = Version.from_dict(meta)
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"config store: {key} holds a malformed entry: {exc}") from None
        docs = {k[2:]: v for k, v in fields.items() if k.startswith("d:")}
        if self._signer is not None:
            tag = meta.pop("sig", "")
            if not isinstance(tag, str) or not self._signer.check(_signed(meta, docs), tag):
                raise StoreError(
                    f"config store: version {number} ({key}) is not signed with this "
                    "service's SIGNING_KEY: it was not written through the config API; "
                    "it is not put in force"
                )
        return Snapshot(version, docs)

    async def newer(self) -> Snapshot | None:
        latest = await self.latest()
        if latest == 0 or latest == self._current.version.number:
            return None
        return await self.snapshot(latest)

    def adopt(self, snap: Snapshot) -> None:
        self._current = snap

    async def commit(self, documents: Mapping[str, str], base: int, entry: Version) -> Version:
        meta = entry.as_dict()
        if self._signer is not None:
            meta["sig"] = self._signer.tag(_signed(meta, documents))
        args: list[Any] = [base, entry.number, json.dumps(meta), self._keep]
        for name, text in sorted(documents.items()):
            args.extend((name, text))
        drop = entry.number - self._keep
        keys = [
            self.key("current"),
            self.key("history"),
            self.key(f"v:{entry.number}"),
            self.key(f"v:{drop}" if drop > 0 else "v:0"),
        ]
        reply = await self.connection.run(self._commit, keys, args)
        if int(reply[0]) != 1:
            raise StaleVersionError(int(reply[1]))
        self._current = Snapshot(entry, dict(documents))
        with contextlib.suppress(FerrymanError):
            await self.connection.command("PUBLISH", self.channel, entry.number, key=self.channel)
        return entry

    async def record(self, entry: Version) -> None:
        history = self.key("history")
        await self.connection.command("LPUSH", history, json.dumps(entry.as_dict()), key=history)
        await self.connection.command("LTRIM", history, 0, self._keep - 1, key=history)


def _signed(meta: Mapping[str, Any], documents: Mapping[str, str]) -> bytes:
    """What a version's signature covers: its entry and every document, canonically."""
    return json.dumps([meta, sorted(documents.items())], sort_keys=True).encode()


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _pairs(raw: Any) -> dict[str, str]:
    if isinstance(raw, dict):
        return {_text(k): _text(v) for k, v in raw.items()}
    items = [_text(v) for v in raw or []]
    return dict(zip(items[::2], items[1::2], strict=True))


@dataclass(frozen=True)
class Rejected:
    """The latest version of the store, which this replica refused to put in force."""

    snapshot: Snapshot
    error: str

    def as_dict(self) -> dict[str, Any]:
        v = self.snapshot.version
        return {"version": v.number, "author": v.author, "time": v.time, "error": self.error}


class ConfigVersions:
    """Edits through a store: validated by the loader, committed on the version they were
    based on, put in force, logged and counted. Every edit and event holds ``lock`` (one
    at a time in this process) and the store's :meth:`~ConfigStore.exclusive` (one at a
    time among the processes sharing the store)."""

    def __init__(
        self,
        store: ConfigStore,
        holder: ConfigHolder,
        stats: Stats,
        *,
        merge_domains: bool = False,
        strict: bool = False,
        apply: Callable[[], Any] | None = None,
    ) -> None:
        self.store = store
        self._holder = holder
        self._stats = stats
        self._merge = merge_domains
        self._strict = strict
        # Files: reload the directory now (the watcher would too, a little later).
        self._apply = apply
        self._lock = asyncio.Lock()
        # The store's latest version when this replica found it invalid (the Redis store).
        self.rejected: Rejected | None = None

    @property
    def lock(self) -> asyncio.Lock:
        return self._lock

    def validate(self, documents: Mapping[str, str]) -> Config:
        """The Config of ``documents``; ConfigError with every problem (file: the name)."""
        return load_sources(
            sorted(documents.items()), merge_domains=self._merge, strict=self._strict
        )

    def latest(self) -> int:
        """The latest version this replica knows: in force, or rejected after it."""
        number = self.store.current().version.number
        if self.rejected is not None:
            number = max(number, self.rejected.snapshot.version.number)
        return number

    def _head(self) -> Snapshot:
        """The latest version's documents: what a write changes."""
        current = self.store.current()
        rejected = self.rejected
        if rejected is not None and rejected.snapshot.version.number > current.version.number:
            return rejected.snapshot
        return current

    async def follow(self) -> Version | None:
        """Put the store's latest version in force if it is newer than the one here and
        valid (the Redis store; a no-op on files, whose watcher does it). An invalid one
        stays out of force, is reported once (``rejected``, logged, counted) and checked
        again at each call. Call with ``lock`` held."""
        snap = await self.store.newer()
        if snap is None:
            return None
        try:
            config = await asyncio.to_thread(self.validate, snap.documents)
        except ConfigError as exc:
            number = snap.version.number
            again = self.rejected is not None and self.rejected.snapshot.version.number == number
            self.rejected = Rejected(snap, str(exc))
            if not again:
                keeping = f"keeping version {self.store.current().version.number}"
                reject_config(self._holder, self._stats, exc, f"store version {number}, {keeping}")
            return None
        self.store.adopt(snap)
        self.rejected = None
        self.put_in_force(config, snap.version)
        return snap.version

    async def _on(self, base: int) -> Snapshot:
        """The version a write on ``base`` changes; StaleVersionError naming the latest
        (after catching up with the store) when ``base`` is not it."""
        if self.store.read_only:
            raise ReadOnlyError(self.store.read_only)
        head = self._head()
        if base != head.version.number:
            await self.follow()
            head = self._head()
        if base != head.version.number:
            raise StaleVersionError(head.version.number)
        return head

    async def change(
        self,
        name: str,
        text: str | None,
        base: int,
        author: str,
        summary: str = "",
        origin: Origin = Origin(),
    ) -> Version:
        """Write (``text``) or delete (None) one document on version ``base``."""
        return await self.apply({name: text}, base, author, summary, origin)

    async def apply(
        self,
        changes: Mapping[str, str | None],
        base: int,
        author: str,
        summary: str = "",
        origin: Origin = Origin(),
    ) -> Version:
        """Write (text) or delete (None) each named document on version ``base``, as one
        version."""
        if not changes:
            raise RequestError("documents", "name at least one document to write or delete")
        for name in changes:
            check_name(name)
        async with self._lock, self.store.exclusive():
            head = await self._on(base)
            docs = dict(head.documents)
            what: list[str] = []
            for name, text in sorted(changes.items()):
                if text is None:
                    if name not in docs:
                        raise NotFoundError("name", f"no document {name!r}")
                    del docs[name]
                    what.append(f"deleted {name}")
                else:
                    what.append(f"{'changed' if name in docs else 'added'} {name}")
                    docs[name] = text
            check_layout(docs)
            what_changed = summary or ", ".join(what)
            return await self._commit(docs, head, author, what_changed, "api", origin)

    async def rollback(self, number: int, author: str, origin: Origin = Origin()) -> Version:
        """A new version whose documents are version ``number``'s."""
        async with self._lock, self.store.exclusive():
            if self.store.read_only:
                raise ReadOnlyError(self.store.read_only)
            await self.follow()
            head = self._head()
            old = await self.store.snapshot(number)
            summary = f"rollback to version {number}"
            docs = dict(old.documents)
            return await self._commit(docs, head, author, summary, "rollback", origin)

    async def _commit(
        self,
        docs: dict[str, str],
        head: Snapshot,
        author: str,
        summary: str,
        kind: str,
        origin: Origin = Origin(),
    ) -> Version:
        config = await asyncio.to_thread(self.validate, docs)
        changed = changed_names(head.documents, docs)
        entry = Version(
            head.version.number + 1,
            author,
            time.time(),
            " ".join(summary.split())[:MAX_SUMMARY],
            changed,
            kind,
            origin=origin,
        )
        try:
            version = await self.store.commit(docs, head.version.number, entry)
        except StaleVersionError as exc:
            # Another replica wrote first: catch up, so the answer and the ETags after it
            # name the real latest.
            with contextlib.suppress(FerrymanError):
                await self.follow()
            raise StaleVersionError(max(exc.current, self.latest())) from None
        self.rejected = None
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
        change, fields = swap_config(self._holder, self._stats, config)
        log.info(
            "config version %d in force (%s, by %s): %s",
            version.number,
            version.kind,
            version.author,
            change,
            extra={"fields": {**fields, "store_version": version.number}},
        )

    async def event(
        self, author: str, summary: str, event: Mapping[str, Any], origin: Origin = Origin()
    ) -> Version:
        """Record an event (a counter reset) at the latest version."""
        async with self._lock, self.store.exclusive():
            entry = Version(
                self.latest(), author, time.time(), summary, (), "reset", dict(event), origin
            )
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
