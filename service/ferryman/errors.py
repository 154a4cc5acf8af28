"""Exceptions raised by ferryman.

Every exception derives from :class:`FerrymanError`::

    FerrymanError
    ├── ConfigError            a descriptor file or directory is invalid (carries every problem)
    ├── SettingsError          an environment variable or command-line flag is invalid
    ├── EnvoyFileError         an Envoy or Istio file given to `ferryman envoy` cannot be read
    ├── RequestError           a request is malformed (maps to gRPC INVALID_ARGUMENT)
    │   ├── PreconditionRequiredError ...or is a config write without If-Match
    │   ├── UnsupportedMediaTypeError ...or sends a body in a content type not accepted
    │   ├── NotFoundError          ...or names a domain or descriptor that is not configured
    │   ├── HoldError              ...or releases/transfers more copies than it holds
    │   └── SessionError           ...or names no session open on this server
    ├── BackendError           the counter store failed (maps to gRPC UNAVAILABLE)
    │   ├── BackendTimeoutError   ...or did not answer within its timeout
    │   └── LeaseLostError        ...or freed this server's holds after its lease lapsed
    ├── StaleVersionError      a config write was based on a version no longer the latest
    ├── ReadOnlyError          the config store refuses writes (a ConfigMap, say), and why
    ├── StoreError             the config store cannot write (a disk error) or holds a
    │                          malformed entry
    ├── AuthenticationError    a config API call has no valid bearer token
    │   └── PermissionDeniedError ...or its token may read but not write
    │       └── AccessDeniedError  ...or the access policy does not allow the caller this
    ├── TooManyStreamsError    the server serves as many streams of a kind as it allows
    │   └── CapExceededError   ...or one caller has as many of a thing open as it may
    ├── ServiceUnavailableError the client got no answer from the ferryman service
    │                          (raised only with fail_open=False; otherwise it degrades)
    └── RateLimitedError       the client interceptor refused an outgoing gRPC call: its
                               rate limit had no room within max_wait

``STATUSES`` is the one table from these errors to what the service answers: a gRPC status,
an HTTP status, and the suffix of the call's error counter. The client raises RequestError
(and NotFoundError) when the service answers INVALID_ARGUMENT (or NOT_FOUND).

Over-limit is an answer, never an exception.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = [
    "STATUSES",
    "AccessDeniedError",
    "AuthenticationError",
    "BackendError",
    "BackendTimeoutError",
    "CapExceededError",
    "ConfigError",
    "ConfigProblem",
    "EnvoyFileError",
    "ErrorStatus",
    "FerrymanError",
    "HoldError",
    "LeaseLostError",
    "NotFoundError",
    "PermissionDeniedError",
    "PreconditionRequiredError",
    "RateLimitedError",
    "ReadOnlyError",
    "RequestError",
    "ServiceUnavailableError",
    "SessionError",
    "SettingsError",
    "StaleVersionError",
    "StoreError",
    "TooManyStreamsError",
    "UnsupportedMediaTypeError",
    "status_of",
]


class FerrymanError(Exception):
    """Root of every error ferryman raises on purpose."""


@dataclass(frozen=True)
class ConfigProblem:
    """One problem in one descriptor file: where it is and what is wrong."""

    file: str
    line: int | None
    column: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        if self.path:
            return f"{where}: {self.path}: {self.message}"
        return f"{where}: {self.message}"


class ConfigError(FerrymanError):
    """A configuration could not be loaded; ``problems`` lists every error found."""

    def __init__(self, problems: list[ConfigProblem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class SettingsError(FerrymanError):
    """A setting (environment variable or flag) has an invalid value."""


class EnvoyFileError(FerrymanError):
    """An Envoy or Istio file cannot be read: ``where`` is the YAML path of the problem."""

    def __init__(self, file: str, where: str, message: str) -> None:
        self.file = file
        self.where = where
        super().__init__(f"{file}: {where}: {message}" if where else f"{file}: {message}")


class RequestError(FerrymanError):
    """A request is malformed; ``field`` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


class NotFoundError(RequestError):
    """The request names a domain or descriptor the configuration does not have."""


class HoldError(RequestError):
    """A release or transfer asks for more copies than the caller holds; nothing changed."""


class SessionError(RequestError):
    """A call names no session, or one that is not open on this server."""


class PreconditionRequiredError(RequestError):
    """A config write names no version to write on (If-Match)."""


class UnsupportedMediaTypeError(RequestError):
    """A request body's Content-Type is not one the endpoint accepts."""


class StaleVersionError(FerrymanError):
    """A config write was based on a version that is no longer the latest; nothing changed."""

    def __init__(self, current: int) -> None:
        self.current = current
        super().__init__(
            f"the config changed: version {current} is the latest; read it and write again"
        )


class ReadOnlyError(FerrymanError):
    """The config store refuses writes; the message says why."""


class StoreError(FerrymanError):
    """The config store failed: a file could not be written, or Redis holds an entry that
    cannot be read. Nothing was changed unless the message says otherwise."""


class AuthenticationError(FerrymanError):
    """A config API call without a valid bearer token."""


class PermissionDeniedError(AuthenticationError):
    """A config API call whose token may not do what it asks (a read token writing)."""


class AccessDeniedError(PermissionDeniedError):
    """The access policy does not allow the caller ``permission`` on ``scope``."""

    def __init__(self, permission: str, scope: str, identity: str) -> None:
        self.permission = permission
        self.scope = scope
        self.identity = identity
        super().__init__(f"{identity} may not {permission} on {scope!r} (access policy)")


class BackendError(FerrymanError):
    """The backend that stores counters failed to answer."""


class BackendTimeoutError(BackendError):
    """The backend did not answer within its timeout."""


class LeaseLostError(BackendError):
    """This server's lease lapsed and its holds were freed; its sessions must end."""


class TooManyStreamsError(FerrymanError):
    """The server already serves as many streams of this kind as it allows; try later."""


class CapExceededError(TooManyStreamsError):
    """One caller already has ``most`` of ``what`` (sessions, streams, buckets) open."""

    def __init__(self, what: str, most: int) -> None:
        self.what = what
        self.most = most
        super().__init__(f"{what}: this caller already has {most} open, the most it may")


class ServiceUnavailableError(FerrymanError):
    """The client got no usable answer from the ferryman service at ``target``.

    ``code`` is the gRPC status name (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``, ...). Raised
    only by a client with ``fail_open=False``; a fail-open client degrades instead.
    """

    def __init__(self, target: str, code: str, details: str) -> None:
        self.target = target
        self.code = code
        self.details = details
        super().__init__(f"ferryman at {target}: {code}: {details}")


class RateLimitedError(FerrymanError):
    """The client interceptor refused an outgoing call: its limit had no room in time.

    ``retry_after`` is the service's estimate of when one more hit could be granted
    (None when none could as things stand); ``waited`` is the time spent retrying.
    """

    def __init__(
        self,
        method: str,
        domain: str,
        descriptor: tuple[tuple[str, str], ...],
        waited: float,
        retry_after: float | None,
    ) -> None:
        self.method = method
        self.domain = domain
        self.descriptor = descriptor
        self.waited = waited
        self.retry_after = retry_after
        shown = ",".join(f"{k}={v}" for k, v in descriptor)
        hint = f"; retry in {retry_after:.3f}s" if retry_after is not None else ""
        super().__init__(
            f"{method}: rate limited by {domain} ({shown}) after waiting {waited:.3f}s{hint}"
        )


@dataclass(frozen=True, slots=True)
class ErrorStatus:
    """How the service answers an error: ``grpc`` is a grpc.StatusCode name, ``http`` the
    HTTP status, ``counter`` the suffix of the call's error counter (the reference's
    ``redis_error`` / ``service_error``)."""

    grpc: str
    http: int
    counter: str


_CLIENT = "service_error"
_BACKEND = "redis_error"

#: Every error class -> its answer. A class not listed takes its nearest listed base.
STATUSES: Mapping[type[FerrymanError], ErrorStatus] = MappingProxyType(
    {
        FerrymanError: ErrorStatus("INTERNAL", 500, _CLIENT),
        ConfigError: ErrorStatus("FAILED_PRECONDITION", 400, _CLIENT),
        SettingsError: ErrorStatus("INVALID_ARGUMENT", 400, _CLIENT),
        EnvoyFileError: ErrorStatus("INVALID_ARGUMENT", 400, _CLIENT),
        RequestError: ErrorStatus("INVALID_ARGUMENT", 400, _CLIENT),
        NotFoundError: ErrorStatus("NOT_FOUND", 404, _CLIENT),
        HoldError: ErrorStatus("INVALID_ARGUMENT", 400, _CLIENT),
        SessionError: ErrorStatus("FAILED_PRECONDITION", 409, _CLIENT),
        PreconditionRequiredError: ErrorStatus("FAILED_PRECONDITION", 428, _CLIENT),
        StaleVersionError: ErrorStatus("ABORTED", 412, _CLIENT),
        UnsupportedMediaTypeError: ErrorStatus("INVALID_ARGUMENT", 415, _CLIENT),
        ReadOnlyError: ErrorStatus("FAILED_PRECONDITION", 409, _CLIENT),
        StoreError: ErrorStatus("INTERNAL", 500, _CLIENT),
        AuthenticationError: ErrorStatus("UNAUTHENTICATED", 401, _CLIENT),
        PermissionDeniedError: ErrorStatus("PERMISSION_DENIED", 403, _CLIENT),
        BackendError: ErrorStatus("UNAVAILABLE", 500, _BACKEND),
        BackendTimeoutError: ErrorStatus("UNAVAILABLE", 500, _BACKEND),
        LeaseLostError: ErrorStatus("UNAVAILABLE", 500, _BACKEND),
        TooManyStreamsError: ErrorStatus("RESOURCE_EXHAUSTED", 429, _CLIENT),
        AccessDeniedError: ErrorStatus("PERMISSION_DENIED", 403, _CLIENT),
        CapExceededError: ErrorStatus("RESOURCE_EXHAUSTED", 429, _CLIENT),
        ServiceUnavailableError: ErrorStatus("UNAVAILABLE", 503, _CLIENT),
        RateLimitedError: ErrorStatus("RESOURCE_EXHAUSTED", 429, _CLIENT),
    }
)


def status_of(error: FerrymanError) -> ErrorStatus:
    """The answer to ``error``: its class's entry, or its nearest listed base's."""
    for cls in type(error).__mro__:
        status = STATUSES.get(cls)
        if status is not None:
            return status
    raise AssertionError(f"{type(error).__name__} is not a FerrymanError")  # pragma: no cover
