"""The decision log: one JSON line per decision (``DECISION_LOG``), and its reader.

A decision is one of two calls, as the engine's watchers are told them (a
:class:`~ferryman.engine.observe.Seen` or a :class:`~ferryman.engine.observe.Requested`),
and its line says which:

- ShouldRateLimit: ``{"t", "domain", "hits", "descriptors", "rules", "codes", "code"}``: the
  time the engine decided at, the request's domain and ``hits_addend``, each descriptor
  (its entries, and its own hits, sign and limit override when it has them), the rule each
  reached (its stats key, or null), each descriptor's answer and the request's. Read back
  as a :class:`Logged`.
- ferryman.v1 ``Request``: ``{"t", "api": "request", "domain", "entries", "copies",
  "min_copies", "max_wait_millis", "rule", "granted"}``: the time, what was asked, the
  node reached (its stats key, or null when none was and ``allow_unconfigured`` granted
  it) and the copies granted. Read back as a :class:`LoggedRequest`.

A line without ``api`` is a ShouldRateLimit one (so logs written before Request lines
existed read as they did); an ``api`` other than ``request`` is not a decision log line.

Lines are written by a thread, never by the event loop: a decision is put on a bounded
queue and, when the queue is full (the disk is slow or full), dropped and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import queue
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, NamedTuple

from ferryman.core.answers import DescriptorRequest
from ferryman.core.rules import Unit, UnitLimit
from ferryman.engine.observe import Requested, Seen
from ferryman.errors import FerrymanError
from ferryman.settings import Settings
from ferryman.stats import SERVICE, Stats

__all__ = ["DecisionLog", "Logged", "LoggedRequest", "decision_log", "decode", "encode", "read_log"]

log = logging.getLogger("ferryman")

#: The ``api`` of a ferryman.v1 Request line (a ShouldRateLimit line has none).
REQUEST = "request"
WRITTEN = f"{SERVICE}.decision_log.written"
DROPPED = f"{SERVICE}.decision_log.dropped"
#: Decisions waiting for the writer; past this they are dropped.
QUEUE = 10_000
#: Distinct requests a reader keeps decoded (a log of more decodes the rest line by line).
KEPT = 100_000
#: The writer flushes at least this often, so a line is in the file within a second.
FLUSH_SECONDS = 0.2


def _descriptor(desc: DescriptorRequest) -> dict[str, Any]:
    out: dict[str, Any] = {"entries": [list(pair) for pair in desc.entries]}
    if desc.hits is not None:
        out["hits"] = desc.hits
    if desc.negative:
        out["negative"] = True
    if desc.limit is not None:
        unit = None if desc.limit.unit is None else desc.limit.unit.name.lower()
        out["limit"] = {"requests_per_unit": desc.limit.requests_per_unit, "unit": unit}
    return out


def _encode_request(seen: Requested) -> str:
    return json.dumps(
        {
            "t": seen.now,
            "api": REQUEST,
            "domain": seen.domain,
            "entries": [list(pair) for pair in seen.entries],
            "copies": seen.copies,
            "min_copies": seen.min_copies,
            "max_wait_millis": seen.max_wait_millis,
            "rule": None if seen.rule is None else seen.rule.stats_key,
            "granted": seen.granted,
        },
        separators=(",", ":"),
    )


def encode(seen: Seen | Requested) -> str:
    """One decision as its line (without the newline)."""
    if isinstance(seen, Requested):
        return _encode_request(seen)
    statuses = seen.decision.statuses
    return json.dumps(
        {
            "t": seen.now,
            "domain": seen.domain,
            "hits": seen.hits_addend,
            "descriptors": [_descriptor(d) for d in seen.descriptors],
            "rules": [None if r is None else r.stats_key for r in seen.rules],
            "codes": [s.code.name for s in statuses],
            "code": seen.decision.code.name,
        },
        separators=(",", ":"),
    )


class Logged(NamedTuple):
    """One line of a decision log, read back (a tuple: one is made per line)."""

    t: float
    domain: str
    hits: int
    descriptors: tuple[DescriptorRequest, ...]
    codes: tuple[str, ...]
    code: str
    # What stands for the request (its domain, hits and descriptors as logged), so that
    # the engine keeps its matches for the next one like it; None: not known.
    key: str | None = None


class LoggedRequest(NamedTuple):
    """One ferryman.v1 ``Request`` line of a decision log, read back: what was asked, the
    node reached (its stats key; None: none) and the copies granted."""

    t: float
    domain: str
    entries: tuple[tuple[str, str], ...]
    copies: int
    min_copies: int
    max_wait_millis: int
    rule: str | None
    granted: int


def _read_request(raw: dict[str, Any]) -> LoggedRequest:
    rule = raw["rule"]
    return LoggedRequest(
        float(raw["t"]),
        str(raw["domain"]),
        tuple((str(k), str(v)) for k, v in raw["entries"]),
        int(raw["copies"]),
        int(raw["min_copies"]),
        int(raw["max_wait_millis"]),
        None if rule is None else str(rule),
        int(raw["granted"]),
    )


def _read_descriptor(item: dict[str, Any]) -> DescriptorRequest:
    entries = tuple((str(k), str(v)) for k, v in item["entries"])
    limit = None
    if "limit" in item:
        unit = item["limit"]["unit"]
        limit = UnitLimit(
            int(item["limit"]["requests_per_unit"]), None if unit is None else Unit[unit.upper()]
        )
    return DescriptorRequest(entries, limit, item.get("hits"), bool(item.get("negative", False)))


def decode(line: str) -> Logged | LoggedRequest:
    """A line as the request it logged and the answers given; ValueError when it is not a
    decision log line."""
    try:
        raw = json.loads(line)
        api = raw.get("api")
        if api == REQUEST:
            return _read_request(raw)
        if api is not None:
            raise ValueError(f"unknown api {api!r}")
        start, end = line.find(',"domain"'), line.find(',"rules"')
        return Logged(
            float(raw["t"]),
            str(raw["domain"]),
            int(raw.get("hits", 0)),
            tuple(_read_descriptor(d) for d in raw["descriptors"]),
            tuple(raw.get("codes", ())),
            str(raw.get("code", "")),
            line[start:end] if 0 < start < end else None,
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a decision log line: {exc!r}") from None


def read_log(path: Path) -> Iterator[Logged | LoggedRequest]:
    """Every decision of a log file, in order; a FerrymanError names the first bad line.
    A request seen before (the same domain, hits and descriptors) is not decoded again."""
    seen: dict[str, Logged] = {}
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield _known(line, seen)
            except ValueError as exc:
                raise FerrymanError(f"{path}:{number}: {exc}") from None


def _known(line: str, seen: dict[str, Logged]) -> Logged | LoggedRequest:
    """``line`` decoded; for a request decoded before only its time is read (the writer
    puts it first). The requests decoded are remembered, up to a bound."""
    start, end = line.find(',"domain"'), line.find(',"rules"')
    if not (line.startswith('{"t":') and 0 < start < end):
        return decode(line)
    key = line[start:end]
    found = seen.get(key)
    if found is None:
        decoded = decode(line)
        if not isinstance(decoded, Logged):
            return decoded
        found = decoded
        if len(seen) < KEPT:
            seen[key] = found
        return found
    t = float(line[5:start])
    at = line.find(',"codes":', end)
    until = line.find(',"code":', at)
    if at < 0 or until < 0:
        return decode(line)
    codes = tuple(line[at + 11 : until - 2].split('","'))
    code = line[until + 9 : line.rfind('"')]
    return Logged(t, found.domain, found.hits, found.descriptors, codes, code, found.key)


class DecisionLog:
    """A decision watcher that appends each decision (a sample of them) to ``path``,
    renaming the file to ``<path>.1`` once it passes ``max_bytes``."""

    def __init__(
        self,
        path: Path,
        stats: Stats,
        *,
        sample: float = 1.0,
        max_bytes: int = 0,
        size: int = QUEUE,
    ) -> None:
        self.path = path
        self.sample = sample
        self.max_bytes = max_bytes
        self._stats = stats
        self._queue: queue.Queue[Seen | Requested | None] = queue.Queue(size)
        self._thread: threading.Thread | None = None
        self._file: IO[str] | None = None
        self._size = 0
        self.written = 0
        self.dropped = 0
        self.rotations = 0
        self.last_error: str | None = None

    def decided(self, seen: Seen | Requested) -> None:
        """Queue ``seen``'s line (one decision of a ``sample``), or drop and count it when
        the queue is full."""
        if self.sample < 1.0 and random.random() >= self.sample:
            return
        try:
            self._queue.put_nowait(seen)
        except queue.Full:
            self._drop(1)

    # A Request is logged as a ShouldRateLimit decision is: sampled, queued, dropped when full.
    requested = decided

    def _drop(self, n: int) -> None:
        self.dropped += n
        self._stats.inc(DROPPED, n)

    async def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="decision-log", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        """Write what is queued, then close (the thread is joined off the event loop)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._queue.put(None)
        await asyncio.to_thread(thread.join, 10)

    def status(self) -> dict[str, object]:
        return {
            "path": str(self.path),
            "sample": self.sample,
            "max_bytes": self.max_bytes,
            "written": self.written,
            "dropped": self.dropped,
            "queued": self._queue.qsize(),
            "rotations": self.rotations,
            "last_error": self.last_error,
        }

    def _run(self) -> None:
        while True:
            batch: list[Seen | Requested] = []
            try:
                first = self._queue.get(timeout=FLUSH_SECONDS)
            except queue.Empty:
                continue
            done = first is None
            if first is not None:
                batch.append(first)
            while not done and len(batch) < 1000:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    done = True
                else:
                    batch.append(item)
            self._write(batch)
            if done:
                self._close()
                return

    def _write(self, batch: list[Seen | Requested]) -> None:
        if not batch:
            return
        text = "".join(encode(seen) + "\n" for seen in batch)
        try:
            out = self._open(len(text))
            out.write(text)
            out.flush()
        except OSError as exc:
            # A full or failing disk: these lines are lost, the next batch tries again.
            if self.last_error is None:
                log.error("decision log %s: %s (lines are dropped and counted)", self.path, exc)
            self.last_error = str(exc)
            self._close()
            self._drop(len(batch))
            return
        self._size += len(text)
        self.written += len(batch)
        self._stats.inc(WRITTEN, len(batch))

    def _open(self, adding: int) -> IO[str]:
        if self._file is None:
            self._file = self.path.open("a", encoding="utf-8")
            self._size = self._file.tell()
        if self.max_bytes and self._size and self._size + adding > self.max_bytes:
            self._close()
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            self.rotations += 1
            self._file = self.path.open("a", encoding="utf-8")
            self._size = 0
        return self._file

    def _close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None


def decision_log(settings: Settings, stats: Stats) -> DecisionLog | None:
    """The log ``DECISION_LOG`` asks for, or None."""
    if not settings.decision_log:
        return None
    return DecisionLog(
        Path(settings.decision_log),
        stats,
        sample=settings.decision_log_sample,
        max_bytes=settings.decision_log_max_bytes,
    )
