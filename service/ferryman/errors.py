"""Exceptions raised by ferryman.

Every exception derives from :class:`FerrymanError`::

    FerrymanError
    ├── ConfigError            a descriptor file or directory is invalid (carries every problem)
    ├── SettingsError          an environment variable or command-line flag is invalid
    ├── RequestError           a request is malformed (maps to gRPC INVALID_ARGUMENT)
    │   ├── NotFoundError          ...or names a domain or descriptor that is not configured
    │   └── HoldError              ...or releases/transfers more copies than it holds
    ├── BackendError           the counter store failed (maps to gRPC UNAVAILABLE)
    │   ├── BackendTimeoutError   ...or did not answer within its timeout
    │   └── LeaseLostError        ...or freed this server's holds after its lease lapsed
    ├── ServiceUnavailableError the client got no answer from the ferryman service
    │                          (raised only with fail_open=False; otherwise it degrades)
    └── RateLimitedError       the client interceptor refused an outgoing gRPC call: its
                               rate limit had no room within max_wait

The client raises RequestError (and NotFoundError) when the service answers
INVALID_ARGUMENT (or NOT_FOUND), as the service itself does.

Over-limit is an answer, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BackendError",
    "BackendTimeoutError",
    "ConfigError",
    "ConfigProblem",
    "FerrymanError",
    "HoldError",
    "LeaseLostError",
    "NotFoundError",
    "RateLimitedError",
    "RequestError",
    "ServiceUnavailableError",
    "SettingsError",
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


class RequestError(FerrymanError):
    """A request is malformed; ``field`` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


class NotFoundError(RequestError):
    """The request names a domain or descriptor the configuration does not have."""


class HoldError(RequestError):
    """A release or transfer asks for more copies than the caller holds; nothing changed."""


class BackendError(FerrymanError):
    """The backend that stores counters failed to answer."""


class BackendTimeoutError(BackendError):
    """The backend did not answer within its timeout."""


class LeaseLostError(BackendError):
    """This server's lease lapsed and its holds were freed; its sessions must end."""


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
