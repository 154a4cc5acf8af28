"""The config API on the debug port (``/api/v1/...``): read, write and delete documents on
a version (ETag / If-Match), the history, diffs, rollback and counter resets, for bearer
tokens of ``ADMIN_TOKENS_FILE``. Without a token file it answers 404 (off).

A browser sends client certificates by itself, so a write must show it was not sent by
another site's page: a JSON body says ``Content-Type: application/json`` (a form cannot),
and a request whose ``Sec-Fetch-Site`` or ``Origin`` names another site is refused. PUT and
DELETE (with the If-Match they need) cannot be sent across sites without a CORS preflight,
which this server never grants."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from ferryman.access import http_caller
from ferryman.access.scopes import ALL, document_scopes, reaches, read_scopes, require_scopes
from ferryman.access.signing import Signer
from ferryman.algorithms.token_bucket.model import BucketStore
from ferryman.apis.config_off import OFF, PREFIX
from ferryman.apis.holds import HoldManager
from ferryman.backends.base import Backend
from ferryman.clock import Clock
from ferryman.config.loader import read_directory
from ferryman.config.reloader import ConfigHolder, Reloader
from ferryman.config.store import (
    ConfigStore,
    ConfigVersions,
    FileStore,
    Origin,
    RedisStore,
    Snapshot,
    Version,
    check_name,
    config_problem_dict,
    diff_documents,
    relative_documents,
)
from ferryman.edge.http import HttpRequest, HttpResponse
from ferryman.engine import RateLimitEngine
from ferryman.engine.reset import ResetResult, reset_counters, reset_quota_bucket
from ferryman.errors import (
    AuthenticationError,
    ConfigError,
    ConfigProblem,
    FerrymanError,
    NotFoundError,
    PermissionDeniedError,
    PreconditionRequiredError,
    RequestError,
    SettingsError,
    StaleVersionError,
    UnsupportedMediaTypeError,
    status_of,
)
from ferryman.logs import ThrottledLog
from ferryman.settings import Settings
from ferryman.stats import Stats
from ferryman.tasks import cancel, wait_event

if TYPE_CHECKING:
    from ferryman.connections.redis import RedisConnection

__all__ = ["ConfigApi", "TokenFile"]

log = logging.getLogger("ferryman.config_api")

ROLES = ("read", "write")
CERT = "cert:"  # a token file entry naming a client certificate's SAN
WRITES = "ratelimit.service.config_api.writes"
REFUSED = "ratelimit.service.config_api.refused"
RESETS = "ratelimit.service.config_api.counter_resets"
FOLLOW_ERRORS = "ratelimit.service.config_api.follow_errors"
# How often a replica on the Redis store checks the latest version (pub/sub wakes it sooner).
FOLLOW_INTERVAL = 1.0
# Problems listed in one answer (a hostile document can have one per line).
MAX_PROBLEMS = 100

#: Every route: (method, path) -> (its handler, the role it needs). Each handler says what
#: its call reaches (``Caller.may``) before it reads or changes a document.
ROUTES: dict[tuple[str, str], tuple[str, str]] = {
    ("GET", f"{PREFIX}/config"): ("_config", "read"),
    ("PUT", f"{PREFIX}/config"): ("_put_many", "write"),
    ("GET", f"{PREFIX}/config/*"): ("_get", "read"),
    ("PUT", f"{PREFIX}/config/*"): ("_put", "write"),
    ("DELETE", f"{PREFIX}/config/*"): ("_delete", "write"),
    ("POST", f"{PREFIX}/validate"): ("_validate", "read"),
    ("GET", f"{PREFIX}/history"): ("_history", "read"),
    ("GET", f"{PREFIX}/history/*"): ("_version", "read"),
    ("GET", f"{PREFIX}/diff"): ("_diff", "read"),
    ("POST", f"{PREFIX}/rollback"): ("_rollback", "write"),
    ("POST", f"{PREFIX}/counters/reset"): ("_reset", "write"),
}


@dataclass(frozen=True)
class Caller:
    user: str
    role: str
    # What the token reaches (access.scopes); and where the call came from, for the history.
    scopes: tuple[str, ...] = ("*",)
    origin: Origin = field(default_factory=Origin)

    def may(self, wanted: Iterable[str], role: str = "write") -> None:
        require_scopes(self.user, role, self.scopes, wanted)

    def reaches(self, wanted: Iterable[str]) -> bool:
        return reaches(self.scopes, wanted)


class TokenFile:
    """``token user role`` lines (``#`` comments), read again whenever the file changes. A
    ``cert:<SAN>`` in place of the token names a client certificate instead: under mutual
    TLS, a request without a token whose verified certificate carries that subject
    alternative name is that user (never usable as a bearer token)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._tokens: list[tuple[bytes, Caller]] = []
        self._certs: dict[str, Caller] = {}
        self.present = False

    def refresh(self) -> bool:
        """Read the file again if it changed (one ``stat``); whether it exists."""
        self._read()
        return self.present

    def _read(self) -> None:
        try:
            st = os.stat(self.path)
        except OSError:
            self._stamp, self._tokens, self._certs, self.present = None, [], {}, False
            return
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp:
            return
        tokens: list[tuple[bytes, Caller]] = []
        certs: dict[str, Caller] = {}
        try:
            text = self.path.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            log.error("ADMIN_TOKENS_FILE %s cannot be read: %s", self.path, exc)
            text = ""
        for number, line in enumerate(text.splitlines(), start=1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            if len(words) < 3 or words[2] not in ROLES:
                log.error(
                    "ADMIN_TOKENS_FILE %s:%d: expected 'token user role' (role read or "
                    "write); line ignored",
                    self.path,
                    number,
                )
                continue
            caller = Caller(words[1], words[2], tuple(words[3:]) or ("*",))
            if words[0].startswith(CERT):
                certs[words[0].removeprefix(CERT)] = caller
            else:
                tokens.append((words[0].encode(), caller))
        self._stamp, self._tokens, self._certs = stamp, tokens, certs
        self.present = True
        log.info(
            "ADMIN_TOKENS_FILE %s: %d token(s), %d certificate name(s)",
            self.path,
            len(tokens),
            len(certs),
        )

    def check(self, authorization: str, peercert: Mapping[str, Any] | None = None) -> Caller | None:
        """The caller of an ``Authorization: Bearer <token>`` header, compared with every
        token of the file in constant time; without the header, the caller of a verified
        client certificate (``peercert``, as ``getpeercert()`` gives it): the entry of the
        first of its subject alternative names that the file lists. None if not known. Uses
        the file as last read (:meth:`refresh`)."""
        if not authorization.strip():
            for _kind, value in (peercert or {}).get("subjectAltName", ()):
                caller = self._certs.get(str(value))
                if caller is not None:
                    return caller
            return None
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        given = token.strip().encode()
        found: Caller | None = None
        for known, caller in self._tokens:  # every one, so the time tells nothing
            if hmac.compare_digest(known, given):
                found = caller
        return found


def _json(status: int, data: object, headers: Mapping[str, str] | None = None) -> HttpResponse:
    body = (json.dumps(data, indent=2) + "\n").encode()
    return HttpResponse(status, body, "application/json", dict(headers or {}))


def _error(exc: FerrymanError) -> HttpResponse:
    data: dict[str, Any] = {"error": str(exc)}
    if isinstance(exc, ConfigError):
        data["error"] = f"the configuration is invalid: {len(exc.problems)} problem(s)"
        data["problems"] = [config_problem_dict(p) for p in exc.problems[:MAX_PROBLEMS]]
    if isinstance(exc, StaleVersionError):
        data["current"] = exc.current
    headers = {"WWW-Authenticate": "Bearer"} if type(exc) is AuthenticationError else {}
    return _json(status_of(exc).http, data, headers)


def _etag(number: int) -> dict[str, str]:
    return {"ETag": f'"{number}"'}


def _if_match(request: HttpRequest) -> int:
    raw = request.headers.get("if-match")
    if raw is None:
        raise PreconditionRequiredError(
            "If-Match", 'send If-Match: "<version>" (the ETag of the version you edited)'
        )
    text = raw.strip().removeprefix("W/").strip('"')
    try:
        return int(text)
    except ValueError:
        return -1  # matches no version: answered 412 with the current one


def _same_site(request: HttpRequest) -> None:
    """PermissionDeniedError when the browser says the request comes from another site's
    page (``Sec-Fetch-Site``, which a page cannot set; else ``Origin`` against ``Host``).
    Clients that are not browsers send neither."""
    fetch_site = request.headers.get("sec-fetch-site", "").strip().lower()
    if fetch_site:
        if fetch_site not in ("same-origin", "none"):
            raise PermissionDeniedError(
                f"a request from another site's page (Sec-Fetch-Site: {fetch_site}) is refused"
            )
        return
    origin = request.headers.get("origin")
    if origin is None:
        return
    host = request.headers.get("host", "").strip().lower()
    if origin.strip().lower() == "null" or urlsplit(origin.strip()).netloc.lower() != host:
        raise PermissionDeniedError(
            f"a request from another origin ({origin}) is refused: this API serves its own "
            "pages and clients that are not browsers"
        )


def _changes(body: Mapping[str, Any]) -> dict[str, str | None]:
    """``{"documents": {name: text|null}}``: each name checked, each value text or null."""
    documents = body.get("documents")
    if not isinstance(documents, dict) or not documents:
        raise RequestError("documents", "give an object of document name -> text (or null)")
    changes: dict[str, str | None] = {}
    for name, text in documents.items():
        check_name(name)
        if text is not None and not isinstance(text, str):
            raise RequestError(f"documents.{name}", "expected text or null")
        if text is not None and not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise RequestError(
                    f"documents.{name}", f"not UTF-8 text (a lone surrogate at {exc.start})"
                ) from None
        changes[name] = text
    return changes


def _redis_of(backend: Backend) -> RedisConnection:
    """The backend's Redis, where CONFIG_STORE=redis keeps the versions (redis-py is imported
    here: another backend does not load it)."""
    from ferryman.backends.redis import RedisBackend, RoutedBackend

    if not isinstance(backend, RedisBackend | RoutedBackend):
        raise SettingsError(
            "CONFIG_STORE=redis keeps the configuration in the backend's Redis: "
            f"set BACKEND_TYPE=redis (the backend is {backend.name})"
        )
    return backend.main_connection


class ConfigApi:
    """The config store, the edits through it, and the HTTP handlers."""

    def __init__(
        self,
        settings: Settings,
        holder: ConfigHolder,
        reloader: Reloader | None,
        stats: Stats,
        backend: Backend,
        engine: RateLimitEngine,
        clock: Clock,
        quota: BucketStore | None = None,
        holds: HoldManager | None = None,
    ) -> None:
        if reloader is None and (settings.admin_tokens_file or settings.config_store == "redis"):
            raise SettingsError(
                "the config API edits the config directory or Redis, but with "
                "CONFIG_TYPE=GRPC_XDS_SOTW the management server decides the configuration: "
                "unset ADMIN_TOKENS_FILE and CONFIG_STORE"
            )
        self._settings = settings
        self._holder = holder
        self._reloader = reloader
        self._stats = stats
        self._backend = backend
        self._engine = engine
        self._clock = clock
        self._quota = quota
        self._holds = holds  # a reset of held copies frees those no session holds
        # Refusals of callers without a known token: anyone reaching the port can send them.
        self._strangers = ThrottledLog(log)
        self.tokens = (
            TokenFile(Path(settings.admin_tokens_file)) if settings.admin_tokens_file else None
        )
        self.store: ConfigStore | None = None
        self.versions: ConfigVersions | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()
        if settings.config_store == "redis":
            connection = _redis_of(backend)
            signer = Signer.from_settings(settings)
            if not signer.keyed:
                log.warning(
                    "CONFIG_STORE=redis without SIGNING_KEY: a version written to Redis "
                    "directly would be put in force as if written through the config API"
                )
            self.store = RedisStore(
                connection,
                settings.config_history,
                settings.cache_key_prefix,
                signer,
            )
            self.versions = ConfigVersions(
                self.store,
                holder,
                stats,
                merge_domains=settings.merge_domain_config,
                strict=settings.strict_config,
            )

    @property
    def owns_config(self) -> bool:
        """True when the store, not the directory's watcher, decides what is in force."""
        return isinstance(self.store, RedisStore)

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        s = self._settings
        if isinstance(self.store, RedisStore):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(1.0, s.redis_timeout)):
                    await self._follow_once()
            self._tasks.append(asyncio.create_task(self._follow(), name="ferryman-config-follow"))
            self._tasks.append(asyncio.create_task(self._subscribe(), name="ferryman-config-sub"))
            return
        if self.tokens is None or self._reloader is None:
            return  # off: files alone (or xDS), no history kept
        store = FileStore(s.config_dir, s.config_history, s.ignore_dotfiles)
        await asyncio.to_thread(store.load)
        self.store = store
        self.versions = ConfigVersions(
            store,
            self._holder,
            self._stats,
            merge_domains=s.merge_domain_config,
            strict=s.strict_config,
            apply=self._reloader.reload,
        )
        if store.read_only:
            log.warning("config API is read-only: %s", store.read_only)
        loop = asyncio.get_running_loop()

        def on_swap() -> None:
            loop.call_soon(self._file_edit)

        self._holder.listeners.append(on_swap)

    def _file_edit(self) -> None:
        task = asyncio.create_task(self._sync_files(), name="ferryman-config-sync")
        self._tasks = [t for t in self._tasks if not t.done()]
        self._tasks.append(task)

    async def _sync_files(self) -> None:
        store, versions = self.store, self.versions
        if not isinstance(store, FileStore) or versions is None:
            return
        async with versions.lock:
            entry = await asyncio.to_thread(store.sync_files)
        if entry is not None:
            log.info("config version %d: %s", entry.number, entry.summary)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(Exception):
                await cancel(task)
        self._tasks.clear()

    # -- the Redis store: seed, follow ---------------------------------------------------------

    async def _follow_once(self) -> None:
        store, versions = self.store, self.versions
        assert isinstance(store, RedisStore) and versions is not None
        async with versions.lock:
            if await store.latest() == 0:
                await self._seed(store)
            await versions.follow()

    async def _seed(self, store: RedisStore) -> None:
        """Redis holds no version yet: this replica's directory becomes version 1."""
        directory = self._settings.config_dir
        try:
            sources = await asyncio.to_thread(
                read_directory, directory, ignore_dotfiles=self._settings.ignore_dotfiles
            )
        except ConfigError:
            sources = []
        docs = relative_documents(directory, sources)
        entry = Version(1, "seed", time.time(), f"seeded from {directory}", tuple(docs), "files")
        with contextlib.suppress(StaleVersionError):  # another replica seeded first
            await store.commit(docs, 0, entry)
            log.info("config store: Redis held no version; seeded version 1 from %s", directory)

    async def _follow(self) -> None:
        quiet_until = 0.0
        while True:
            await wait_event(self._wake, FOLLOW_INTERVAL)
            self._wake.clear()
            try:
                await self._follow_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis down, or an entry it holds that cannot be read
                self._stats.inc(FOLLOW_ERRORS)
                if time.monotonic() >= quiet_until:  # once a minute, not every second
                    log.warning("config store: cannot read the latest version: %s", exc)
                    quiet_until = time.monotonic() + 60

    async def _subscribe(self) -> None:
        """Wake the follower when any replica publishes a new version (a single Redis; a
        Sentinel or Cluster deployment relies on the poll)."""
        store = self.store
        assert isinstance(store, RedisStore)
        if not store.connection.can_subscribe:
            return
        while True:
            try:
                async for _ in store.connection.subscribe(store.channel):
                    self._wake.set()
            except FerrymanError as exc:
                log.debug("config store: %s", exc)
            await asyncio.sleep(FOLLOW_INTERVAL)

    # -- HTTP ----------------------------------------------------------------------------------

    def routes(self) -> dict[tuple[str, str], Any]:
        return {key: self._guard(getattr(self, name), role) for key, (name, role) in ROUTES.items()}

    def _guard(self, handler: Any, role: str) -> Any:
        async def guarded(request: HttpRequest) -> HttpResponse:
            tokens = self.tokens
            if tokens is None or not tokens.refresh() or self.versions is None:
                return HttpResponse(404, OFF)
            caller: Caller | None = None
            try:
                if request.method not in ("GET", "HEAD"):
                    _same_site(request)
                caller = tokens.check(request.headers.get("authorization", ""), request.peercert)
                if caller is None:
                    raise AuthenticationError("send Authorization: Bearer <a token of the file>")
                if role == "write" and caller.role != "write":
                    raise PermissionDeniedError(f"{caller.user}'s token may read, not write")
                who = http_caller(request.peercert, request.peer)
                caller = replace(caller, origin=Origin(who.identity, request.peer))
                response: HttpResponse = await handler(request, caller)
                return response
            except FerrymanError as exc:
                if isinstance(exc, ConfigError):
                    exc = self._seen_by(caller, exc)
                if role == "write":
                    self._stats.inc(REFUSED)
                    why = str(exc)[:1000]
                    what = f"config API {request.method} {request.path[:200]} refused: {why}"
                    if caller is None:
                        self._strangers.report(what)
                    else:
                        log.info("%s (%s)", what, caller.user)
                return _error(exc)

        return guarded

    def _reach(self, caller: Caller, changes: Mapping[str, str | None], role: str) -> None:
        """PermissionDeniedError unless ``caller`` reaches what each changed document
        defines now (in force, or in a version this replica refused) and after the change;
        ConfigError with file and line when a new text cannot be read strictly. Reads up
        to megabytes of YAML: call it in a thread."""
        store, versions = self._ready()
        befores = [store.current().documents]
        if versions.rejected is not None:
            befores.append(versions.rejected.snapshot.documents)
        for name in changes:
            for documents in befores:
                caller.may(document_scopes(documents.get(name), name), role)
        for name, text in changes.items():
            if text is not None:
                caller.may(read_scopes(name, text), role)

    def _seen_by(self, caller: Caller | None, exc: ConfigError) -> ConfigError:
        """``exc`` as ``caller`` may see it: a problem in a document its token may not read
        says only that there is one."""
        if caller is None or caller.reaches((ALL,)) or self.store is None:
            return exc
        documents = self.store.current().documents
        hidden = {
            f
            for f in {p.file for p in exc.problems} & set(documents)
            if not caller.reaches(document_scopes(documents[f], f))
        }
        shown: list[ConfigProblem] = []
        for p in exc.problems:
            if p.file in hidden:
                p = ConfigProblem(
                    "", None, None, "", "a problem in a document this token may not read"
                )
            shown.append(p)
        return ConfigError(shown)

    def _name(self, request: HttpRequest, prefix: str) -> str:
        return unquote(request.path[len(prefix) :])

    def _ready(self) -> tuple[ConfigStore, ConfigVersions]:
        assert self.store is not None and self.versions is not None
        return self.store, self.versions

    async def _fresh(self) -> tuple[ConfigStore, ConfigVersions]:
        """The store, its view read again (another worker may have written)."""
        store, versions = self._ready()
        await store.refresh()
        return store, versions

    async def _config(self, request: HttpRequest, caller: Caller) -> HttpResponse:
        store, versions = await self._fresh()
        snap = store.current()
        rejected = versions.rejected
        version = snap.version.as_dict()
        shown = dict(snap.documents)
        rejected_data = None if rejected is None else rejected.as_dict()
        if not caller.reaches((ALL,)):  # only what the token reads: no names, no problems
            shown = await asyncio.to_thread(
                lambda: {n: t for n, t in shown.items() if caller.reaches(document_scopes(t, n))}
            )
            version["changed"] = [n for n in snap.version.changed if n in shown]
            if len(version["changed"]) < len(snap.version.changed):
                version["summary"] = "changes documents this token may not read"
            if rejected_data is not None:
                rejected_data["error"] = "the latest version is invalid"
        data = {
            **version,
            "store": store.kind,
            "read_only": store.read_only,
            "rejected": rejected_data,
            "documents": [{"name": n, "size": len(t.encode())} for n, t in sorted(shown.items())],
            "you": {"user": caller.user, "role": caller.role},
        }
        return _json(200, data, _etag(snap.version.number))

    async def _get(self, request: HttpRequest, caller: Caller) -> HttpResponse:
        store, _ = await self._fresh()
        name = check_name(self._name(request, f"{PREFIX}/config/"))
        snap = store.current()
        if name not in snap.documents:
            raise NotFoundError("name", f"no document {name!r} in version {snap.version.number}")
        caller.may(document_scopes(snap.documents[name]), "read")
        return HttpResponse(
            200,
            snap.documents[name].encode(),
            "application/yaml; charset=utf-8",
            _etag(snap.version.number),
        )

    @staticmethod
    def _text(request: HttpRequest) -> str:
        try:
            return request.body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RequestError("body", f"not UTF-8 text (byte {exc.start})") from None

    async def _put(self, request: HttpRequest, caller: Caller) -> HttpResponse:
        _, versions = self._ready()
        name = check_name(self._name(request, f"{PREFIX}/config/"))
        base = _if_match(request)
        summary = parse_qs(request.query).get("summary", [""])[0]
        text = self._text(request)
        await asyncio.to_thread(self._reach, caller, {name: text}, "write")
        version = await versions.change(name, text, base, caller.user, summary, caller.origin)
        return _json(200, version.as_dict(), _etag(version.number))

    async def _put_many(self, request: HttpRequest, caller: Caller) -> HttpResponse:
        """``{"documents": {name: text|null}}`` with If-Match: every named document
        written (or deleted, null) as one version."""
        _, versions = self._ready()
        base = _if_match(request)
        changes = _changes(self._body(request))
        await asyncio.to_thread(self._reach, caller, changes, "write")
        summary = parse_qs(request.query).get("summary", [""])[0]
        version = await versions.apply(changes, base, caller.user, summary, caller.origin)
        return _json(200, version.as_dict(), _etag(version.number))

    async def _delete(self, request: HttpRequest, caller: Caller) -> HttpResponse:
        _, versions = self._ready()
        name = check_name(self._name(request, f"{PREFIX}/config/"))
        base = _if_match(request)
        summary = parse_qs(request.query).get("summary", [""])[0]
        await asyncio.to_thread(self._reach, caller, {name: None}, "write")
        version = await versions.change(name, None, base, caller.user, summary, caller.origin)
        return _json(200, version.as_dict(), _etag(version.number))

    async def _validate(self, request: HttpRequest, caller: Caller) -> HttpResponse:
        """``{"documents": {name: text|null}}`` over the current version: the problems the
        write would meet, and the diff, changing nothing (the console and ``apply``)."""
        store, versions = await self._fresh()
        changes = _changes(self._body(request))
        snap = store.current()
        docs = dict(snap.documents)
        for name, text in changes.items():
            if text is None:
                docs.pop(name, None)
            else:
                docs[name] = text
        unread: ConfigError | None = None
        try:
            await asyncio.to_thread(self._reach, caller, changes, "read")
        except ConfigError as exc:  # the texts given cannot be read: the loader is not asked
            unread = exc

        def check() -> tuple[list[dict[str, Any]], str, list[str]]:
            found = unread
            if found is None:
                try:
                    versions.validate(docs)
                except ConfigError as exc:
                    found = self._seen_by(caller, exc)
            problems = [config_problem_dict(p) for p in (found.problems if found else ())]
            return (problems[:MAX_PROBLEMS], *diff_documents(snap.documents, docs))

        problems, diff, capped = await asyncio.to_thread(check)
        data = {
            "version": snap.version.number,
            "valid": not problems,
            "problems": problems,
            "diff": diff,
            "diff_capped": capped,
        }
        return _json(200, data, _etag(snap.version.number))

    async def _history(self, request: HttpRequest, caller: Caller) -> HttpResponse:
        caller.may({ALL}, "read")
        store, _ = await self._fresh()
        entries = await store.history()
        return _json(
            200,
            {"current": store.current().version.number, "history": [e.as_dict() for e in entries]},
        )

    async def _snapshot(self, text: str, what: str) -> Snapshot:
        store, _ = self._ready()
        try:
            number = int(text)
        except ValueError:
            raise RequestError(what, f"{text!r} is not a version number") from None
        return await store.snapshot(number)

    async def _version(self, request: HttpRequest, caller: Caller) -> HttpResponse:
        caller.may({ALL}, "read")
        await self._fresh()
        snap = await self._snapshot(self._name(request, f"{PREFIX}/history/"), "version")
        data = {**snap.version.as_dict(), "documents": dict(snap.documents)}
        return _json(200, data)

    async def _diff(self, request: HttpRequest, caller: Caller) -> HttpResponse:
        caller.may({ALL}, "read")
        params = parse_qs(request.query)
        store, _ = await self._fresh()
        current = str(store.current().version.number)
        a = await self._snapshot(params.get("from", [current])[0], "from")
        b = await self._snapshot(params.get("to", [current])[0], "to")
        diff, capped = await asyncio.to_thread(
            diff_documents, a.documents, b.documents, f"v{a.version.number}", f"v{b.version.number}"
        )
        headers = {"X-Diff-Capped": ", ".join(capped)} if capped else {}
        return HttpResponse(200, diff.encode(), "text/x-diff; charset=utf-8", headers)

    @staticmethod
    def _body(request: HttpRequest) -> dict[str, Any]:
        kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if kind != "application/json":
            raise UnsupportedMediaTypeError(
                "Content-Type", f"send the body as application/json (not {kind or 'none'!r})"
            )
        try:
            body = json.loads(request.body or b"{}")
        except (ValueError, UnicodeDecodeError) as exc:
            raise RequestError("body", f"not JSON: {exc}") from None
        except RecursionError:
            raise RequestError("body", "JSON nested too deeply") from None
        if not isinstance(body, dict):
            raise RequestError("body", "expected a JSON object")
        return body

    async def _rollback(self, request: HttpRequest, caller: Caller) -> HttpResponse:
        _, versions = self._ready()
        number = self._body(request).get("version")
        if not isinstance(number, int) or isinstance(number, bool):
            raise RequestError("version", "give the version to roll back to, a number")
        caller.may({ALL})
        version = await versions.rollback(number, caller.user, caller.origin)
        return _json(200, version.as_dict(), _etag(version.number))

    async def _reset(self, request: HttpRequest, caller: Caller) -> HttpResponse:
        """``{"domain": D, "descriptor": [...]}`` (a descriptor's state) or ``{"namespace":
        N, "bucket": B}`` (a quota service bucket)."""
        _, versions = self._ready()
        body = self._body(request)
        caller.may({str(body.get("namespace") if "namespace" in body else body.get("domain"))})
        if "namespace" in body or "bucket" in body:
            result, what, event = await self._reset_bucket(body)
        else:
            result, what, event = await self._reset_descriptor(body)
        self._stats.inc(RESETS)
        event = {**event, **result.as_dict()}
        entry = await versions.event(caller.user, f"counter reset: {what}", event, caller.origin)
        return _json(200, {**result.as_dict(), "history": entry.as_dict()})

    async def _reset_bucket(self, body: dict[str, Any]) -> tuple[ResetResult, str, dict[str, Any]]:
        namespace, bucket = body.get("namespace"), body.get("bucket")
        if not isinstance(namespace, str):
            raise RequestError("namespace", "give the quota namespace, a string")
        if not isinstance(bucket, str):
            raise RequestError("bucket", "give the bucket name, a string")
        if self._quota is None:
            raise NotFoundError("namespace", "this server has no quota service buckets")
        result = await reset_quota_bucket(self._quota, self._holder.config, namespace, bucket)
        event = {"namespace": namespace, "bucket": bucket}
        return result, f"quota {namespace}/{bucket}", event

    async def _reset_descriptor(
        self, body: dict[str, Any]
    ) -> tuple[ResetResult, str, dict[str, Any]]:
        domain = body.get("domain")
        raw = body.get("descriptor")
        if not isinstance(domain, str):
            raise RequestError("domain", "give the domain, a string")
        if not isinstance(raw, list) or not raw:
            raise RequestError("descriptor", 'give a list of {"key": .., "value": ..}')
        entries: list[tuple[str, str]] = []
        for i, item in enumerate(raw):
            if not isinstance(item, dict) or not isinstance(item.get("key"), str):
                raise RequestError(f"descriptor[{i}]", 'expected {"key": .., "value": ..}')
            if not isinstance(item.get("value"), str):
                raise RequestError(f"descriptor[{i}].value", "expected a string")
            entries.append((item["key"], item["value"]))
        shown = ",".join(f"{k}={v}" for k, v in entries)
        event = {"domain": domain, "descriptor": [list(e) for e in entries]}
        holds = self._holds
        if holds is not None and holds.reaches_copies(domain, entries):
            # Held copies are not counters: what a reset frees is what no session holds.
            freed = await holds.free_stranded(domain, entries)
            result = ResetResult("copies", domain, shown, freed > 0)
            return result, f"{domain} {shown}", {**event, "freed": freed}
        engine = self._engine
        result = await reset_counters(
            self._backend.store,
            self._holder.config,
            domain,
            entries,
            engine.options,
            self._clock.now(),
            engine.local_cache,
        )
        return result, f"{domain} {shown}", event
