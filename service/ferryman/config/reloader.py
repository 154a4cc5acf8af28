"""Keep the served configuration in step with its directory, without ever serving a bad one.

A watchdog observer thread reports file events (edits, new and deleted files, renames over
a file, a ConfigMap ``..data`` symlink swap, a swap of the runtime root symlink); the event
loop coalesces them, reads and validates the directory in a worker thread, and swaps the
Config in one assignment. A load that fails keeps the last good Config and is counted.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from ferryman.config.loader import digest_sources, load_sources, read_directory
from ferryman.config.model import Config
from ferryman.core.rules import Domain, Level
from ferryman.errors import ConfigError
from ferryman.stats import CONFIG_LOAD_ERROR, CONFIG_LOAD_SUCCESS, Stats
from ferryman.tasks import cancel, wait_event

__all__ = ["ConfigHolder", "Reloader", "describe_change", "reject_config", "swap_config"]

log = logging.getLogger("ferryman.config")


@dataclass
class ConfigHolder:
    """The configuration in force, and what happened at the last load."""

    config: Config | None = None
    loaded_at: float = 0.0
    version: int = 0
    last_error: str | None = None
    last_error_at: float = 0.0
    history: list[str] = field(default_factory=list)
    # Called after each swap (the config store records a file edit as a version).
    listeners: list[Callable[[], None]] = field(default_factory=list)

    def swap(self, config: Config) -> None:
        self.config = config
        self.loaded_at = time.time()
        self.version += 1
        for listener in self.listeners:
            listener()


def _level_signature(level: Level) -> tuple[object, ...]:
    """Everything a level decides with, in config order (not where it was written)."""
    return tuple(
        (
            rule.key,
            rule.value,
            rule.limit,
            rule.shadow_mode,
            rule.quota_mode,
            rule.detailed_metric,
            rule.value_to_metric,
            rule.share_threshold,
            repr(sorted(rule.metadata.items())),
            _level_signature(rule.children),
        )
        for rule in level.rules
    )


def _domain_signature(domain: Domain) -> tuple[object, ...]:
    return (domain.allow_unconfigured, domain.ignore_limits, _level_signature(domain.root))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def change_fields(old: Config | None, new: Config) -> dict[str, object]:
    """The structured form of describe_change, for JSON log lines."""
    before = {} if old is None else old.domains
    after = new.domains
    return {
        "domains": sorted(after),
        "added": sorted(set(after) - set(before)),
        "removed": sorted(set(before) - set(after)),
        "changed": sorted(
            name
            for name in set(after) & set(before)
            if _domain_signature(after[name]) != _domain_signature(before[name])
        ),
        "limits": len(new.iter_limits()),
    }


def describe_change(old: Config | None, new: Config) -> str:
    """One line: the size of ``new`` and which domains were added, removed or changed."""
    fields = change_fields(old, new)
    domains = fields["domains"]
    assert isinstance(domains, list)
    parts = [f"{_count(len(domains), 'domain')}, {_count(len(new.iter_limits()), 'limit')}"]
    if new.resources or (old is not None and old.resources):
        parts[0] += f", {_count(len(new.resources), 'capacity resource')}"
    for label in ("added", "removed", "changed"):
        names = fields[label]
        assert isinstance(names, list)
        if names:
            parts.append(f"{label}: {', '.join(names)}")
    if not (fields["added"] or fields["removed"] or fields["changed"]):
        parts.append("no domain changed")
    if old is not None and old.resources != new.resources:
        parts.append("capacity resources changed")
    return "; ".join(parts)


def swap_config(
    holder: ConfigHolder, stats: Stats, config: Config
) -> tuple[str, dict[str, object]]:
    """Put ``config`` in force and count the load; returns the one-line change and the
    fields of the log line that reports it (each source logs its own line)."""
    change = describe_change(holder.config, config)
    fields = change_fields(holder.config, config)
    for warning in config.warnings:
        log.warning("config warning: %s", warning)
    holder.swap(config)
    holder.last_error = None
    stats.inc(CONFIG_LOAD_SUCCESS)
    return change, {"version": holder.version, **fields}


def reject_config(holder: ConfigHolder, stats: Stats, exc: ConfigError, keeping: str) -> None:
    """Report a configuration that was not put in force (``keeping``: what stays), count
    it, and record it for /status."""
    log.error(
        "config rejected, %s: %d problem(s): %s",
        keeping,
        len(exc.problems),
        "; ".join(str(p) for p in exc.problems),
        extra={
            "fields": {
                "version": holder.version,
                "problems": [str(p) for p in exc.problems],
            }
        },
    )
    stats.inc(CONFIG_LOAD_ERROR)
    holder.last_error = str(exc)
    holder.last_error_at = time.time()


class _Handler(FileSystemEventHandler):
    def __init__(self, reloader: Reloader) -> None:
        self._reloader = reloader

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in ("opened", "closed_no_write"):
            return
        self._reloader.notify()


class Reloader:
    """Loads ``directory`` now and again whenever something in it changes."""

    def __init__(
        self,
        directory: Path,
        holder: ConfigHolder,
        stats: Stats,
        *,
        ignore_dotfiles: bool = True,
        merge_domains: bool = False,
        strict: bool = False,
        watch_root: Path | None = None,
        debounce: float = 0.05,
        poll_interval: float = 5.0,
    ) -> None:
        self.directory = directory
        self.holder = holder
        self._stats = stats
        self._ignore_dotfiles = ignore_dotfiles
        self._merge = merge_domains
        self._strict = strict
        self._watch_root = watch_root
        self._debounce = debounce
        self._poll_interval = poll_interval
        self._loop: asyncio.AbstractEventLoop | None = None
        self._observer: Any = None
        self._watched: str | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._attempted: str | None = None
        self._read_failure: str | None = None

    def load(self, *, keep_serving: bool = False, missing_ok: bool = False) -> Config | None:
        """Load synchronously (startup). A missing directory raises ConfigError unless
        ``missing_ok``; invalid files raise it unless ``keep_serving``, in which case the
        error is logged and counted, nothing is in force, and the watch loads the files as
        soon as they are good (the reference's behaviour)."""
        present = self.directory.is_dir()
        try:
            config = self._read()
        except ConfigError as exc:
            if (present and not keep_serving) or (not present and not missing_ok):
                raise
            self._reject(exc, "no configuration loaded, waiting for a good one")
            return None
        assert config is not None
        change, fields = swap_config(self.holder, self._stats, config)
        log.info(
            "config loaded (version %d) from %s: %s",
            self.holder.version,
            self.directory,
            change,
            extra={"fields": fields},
        )
        return config

    def _reject(self, exc: ConfigError, keeping: str) -> None:
        reject_config(self.holder, self._stats, exc, keeping)

    def _read(self, skip_unchanged: bool = False) -> Config | None:
        try:
            sources = read_directory(self.directory, ignore_dotfiles=self._ignore_dotfiles)
        except ConfigError as exc:
            # Files that cannot be read have no digest: forget the last attempt, so that
            # the next readable state is loaded even if it is the one in force (which clears
            # the error), and report the same failure once, not at every poll.
            self._attempted = None
            if skip_unchanged and str(exc) == self._read_failure:
                return None
            self._read_failure = str(exc)
            raise
        self._read_failure = None
        digest = digest_sources(sources)
        if skip_unchanged and digest == self._attempted:
            return None
        self._attempted = digest
        return load_sources(sources, merge_domains=self._merge, strict=self._strict)

    def notify(self) -> None:
        """Called from the observer thread on any file event."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake.set)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._observer = Observer()
        self._observer.daemon = True
        self._rewatch()
        if self._watch_root is not None and self._watch_root.parent.is_dir():
            self._observer.schedule(_Handler(self), str(self._watch_root.parent), recursive=False)
        self._observer.start()
        self._task = asyncio.create_task(self._run(), name="ferryman-reloader")

    def _rewatch(self) -> None:
        """(Re)point the recursive watch at the directory's current real path."""
        if self._observer is None:
            return
        real = os.path.realpath(self.directory)
        if real == self._watched or not os.path.isdir(real):
            return
        if self._watched is not None:
            self._observer.unschedule_all()
            if self._watch_root is not None and self._watch_root.parent.is_dir():
                self._observer.schedule(
                    _Handler(self), str(self._watch_root.parent), recursive=False
                )
        self._observer.schedule(_Handler(self), real, recursive=True)
        self._watched = real

    async def _run(self) -> None:
        while True:
            await wait_event(self._wake, self._poll_interval)
            # Let a burst of events (a ConfigMap swap is several, an editor's save may be a
            # truncate then a write) settle into one load: wait for a quiet period, bounded.
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10 * self._debounce
            while True:
                self._wake.clear()
                await asyncio.sleep(self._debounce)
                if not self._wake.is_set() or loop.time() >= deadline:
                    break
            try:
                await self.reload()
            except Exception as exc:
                # A bug, not a bad file: keep watching, keep the config in force, and say so.
                log.exception(
                    "config reload failed unexpectedly; keeping version %d", self.holder.version
                )
                self.holder.last_error = f"reload failed: {type(exc).__name__}: {exc}"
                self.holder.last_error_at = time.time()

    async def reload(self) -> bool:
        """Reload if the files changed; returns True when a new config was swapped in."""
        try:
            config = await asyncio.to_thread(self._read, True)
        except ConfigError as exc:
            self._rewatch()
            keeping = (
                f"keeping version {self.holder.version}"
                if self.holder.config is not None
                else "still no configuration loaded"
            )
            self._reject(exc, keeping)
            return False
        self._rewatch()
        if config is None:
            return False
        change, fields = swap_config(self.holder, self._stats, config)
        log.info(
            "config reloaded (version %d): %s",
            self.holder.version,
            change,
            extra={"fields": fields},
        )
        return True

    async def stop(self) -> None:
        await cancel(self._task)
        self._task = None
        if self._observer is not None:
            self._observer.stop()
            await asyncio.to_thread(self._observer.join, 2.0)
            self._observer = None
