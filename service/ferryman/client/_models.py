"""The client's values: descriptors in, frozen results out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from ferryman.core.answers import Code
from ferryman.errors import RequestError

__all__ = [
    "AllowResult",
    "ClientStats",
    "Code",
    "DescriptorLike",
    "DescriptorStatus",
    "Entries",
    "HoldGroup",
    "MultiHold",
    "RateContext",
    "RateLimit",
    "RateLimitResult",
    "RateResult",
    "ReserveContext",
    "Resource",
    "normalize_descriptor",
]

#: A descriptor: a mapping (its order is kept) or a sequence of (key, value) pairs.
DescriptorLike = Mapping[str, str] | Sequence[tuple[str, str]]

#: A descriptor as the client sends it.
Entries = tuple[tuple[str, str], ...]


def normalize_descriptor(descriptor: DescriptorLike, field: str = "descriptor") -> Entries:
    """The (key, value) pairs of ``descriptor``, in order; RequestError when it is malformed."""
    if isinstance(descriptor, str | bytes):
        raise TypeError(f"{field}: expected a mapping or (key, value) pairs, got {descriptor!r}")
    pairs = descriptor.items() if isinstance(descriptor, Mapping) else descriptor
    entries: list[tuple[str, str]] = []
    for i, pair in enumerate(pairs):
        if isinstance(pair, str | bytes) or len(pair) != 2:
            raise TypeError(f"{field}[{i}]: expected a (key, value) pair, got {pair!r}")
        key, value = pair
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"{field}[{i}]: key and value must be str, got {pair!r}")
        if not key:
            raise RequestError(f"{field}[{i}].key", "must not be empty")
        entries.append((key, value))
    if not entries:
        raise RequestError(field, "must have at least one entry")
    return tuple(entries)


@dataclass(frozen=True)
class RateLimit:
    """A limit the service applied: ``requests_per_unit`` per ``unit`` ("second", "day"...)."""

    requests_per_unit: int
    unit: str
    name: str = ""


@dataclass(frozen=True)
class DescriptorStatus:
    """The service's answer for one descriptor.

    ``limit`` is None when no limit applies; ``reset`` is the number of seconds until the
    current window resets (None when the service did not say).
    """

    code: Code
    limit: RateLimit | None
    remaining: int
    reset: float | None


@dataclass(frozen=True)
class RateLimitResult:
    """The answer to ``should_rate_limit``.

    ``code`` is what the caller should act on: OK when ``degraded`` (the service could not
    answer; every status is then OK without a limit) or ``overridden`` (the kill switch
    turned OVER_LIMIT into OK; ``statuses`` still hold what the service said).
    ``headers`` are the response headers the service asks to add (``RateLimit-*``...),
    ``request_headers`` those for the upstream request. ``fallback``: the service was out of
    reach and the client's fallback limiter answered (OVER_LIMIT when it refused).
    """

    code: Code
    statuses: tuple[DescriptorStatus, ...]
    headers: tuple[tuple[str, str], ...] = ()
    request_headers: tuple[tuple[str, str], ...] = ()
    degraded: bool = False
    overridden: bool = False
    fallback: bool = False

    @property
    def ok(self) -> bool:
        """Whether the caller may go ahead."""
        return self.code is Code.OK


@dataclass(frozen=True)
class RateContext:
    """What the service said about a burst-tier or token-bucket node
    (``ferryman.v1.RateResponse``).

    Limits are None when unbounded; durations are in seconds, ``retry_after`` None when no
    hit could be granted as things stand. Token-bucket nodes: ``wait`` is how long the
    service asked the caller to wait before using the hits (None: no wait), and
    ``tokens_remaining`` the whole tokens left in the bucket.
    """

    granted: int
    hard_limit: int | None
    global_limit: int | None
    active_tier_index: int
    active_tier_limit: int
    active_tier_hits: int
    active_tier_window: float | None
    tenant_hits_last_second: int
    global_hits_last_second: int
    burst: bool
    limited_by_hard_limit: bool
    limited_by_global_limit: bool
    retry_after: float | None
    wait: float | None = None
    tokens_remaining: int = 0


@dataclass(frozen=True)
class RateResult:
    """The answer to ``request_rate``.

    ``success`` says whether the caller may go ahead with ``copies`` hits (0 on failure).
    ``waited`` is the time the call took in seconds (backoff sleeps and calls to the service
    included), ``attempts`` the number of calls made. ``degraded``: the service could not
    answer, ``min_copies`` were granted locally. ``overridden``: the service refused and the
    kill switch granted ``min_copies`` anyway. ``context`` is the service's last answer
    (None when degraded before any answer). ``fallback``: the service was out of reach and
    the client's fallback limiter answered.
    """

    success: bool
    copies: int
    waited: float
    attempts: int
    degraded: bool = False
    overridden: bool = False
    context: RateContext | None = None
    fallback: bool = False


@dataclass(frozen=True)
class HoldGroup:
    """A group the tenant belonged to at reserve time: its limit and copies held in it."""

    name: str
    limit: int
    held: int


@dataclass(frozen=True)
class ReserveContext:
    """What the service said about a copy-limited node (``ferryman.v1.ReserveResponse``).

    ``granted`` copies were taken by this reservation (0 on rejection). ``limit`` and
    ``global_limit`` are the tenant's and the node's limits (None when unbounded);
    ``tenant_held`` and ``global_held`` count the copies held after the call, and
    ``groups`` the tenant's groups with their limits and counts.
    """

    granted: int
    limit: int | None
    global_limit: int | None
    tenant_held: int
    global_held: int
    groups: tuple[HoldGroup, ...]


@dataclass(frozen=True)
class Resource:
    """One resource of a multi-resource hold: a node named by domain and descriptor.

    Copy-limited (held, released on exit) unless ``rate_limited`` (burst-tier hits, spent
    for good); at most one resource of a multi-resource hold may be rate-limited.
    """

    domain: str
    descriptor: DescriptorLike
    rate_limited: bool = False


H = TypeVar("H")


@dataclass(frozen=True)
class MultiHold(Generic[H]):
    """What a multi-resource hold got: the same number of ``copies`` of every resource.

    ``holds`` are the holds of the copy-limited resources, in the order given, each trimmed
    to ``copies``; ``rate`` is the answer for the rate-limited resource (None without one).
    On failure ``success`` is False, ``copies`` 0, ``holds`` empty (whatever was held is
    already released) and ``failed`` names the resource that could not be had.
    ``degraded`` / ``overridden``: some part was granted locally / by the kill switch.
    ``waited`` is the time the whole acquisition took, in seconds.
    """

    success: bool
    copies: int
    holds: tuple[H, ...]
    rate: RateResult | None
    waited: float
    degraded: bool = False
    overridden: bool = False
    failed: Resource | None = None


@dataclass(frozen=True)
class ClientStats:
    """What a client has done since it was created.

    ``calls``: requests sent to the service (retries included). Outcomes handed to the
    caller: ``granted`` (by the service), ``rejected`` (after any retries), ``degraded``
    (granted locally, the service having failed), ``overridden`` (rejections granted by
    the kill switch), ``errors`` (exceptions raised for the service's answer or failure).
    ``retries``: rejections followed by a backoff sleep and another attempt.
    ``sessions``: Session streams opened for holds; ``sessions_lost``: those that ended
    while the client was still using them (their holds are lost).
    ``fallback``: answers the local fallback limiter gave while the service was out of reach,
    ``fallback_rejected`` the refusals among them. ``short_circuited``: calls answered at
    once, without being sent, because the circuit breaker was open; ``breaker_opened``: how
    often it opened; ``breaker_open``: whether it is open now.
    """

    calls: int = 0
    granted: int = 0
    rejected: int = 0
    retries: int = 0
    degraded: int = 0
    overridden: int = 0
    errors: int = 0
    sessions: int = 0
    sessions_lost: int = 0
    fallback: int = 0
    fallback_rejected: int = 0
    short_circuited: int = 0
    breaker_opened: int = 0
    breaker_open: bool = False


@dataclass(frozen=True)
class AllowResult:
    """The answer of ``allow`` (the quota service's Allow), after any wait it asked for.

    ``status`` is the ``quotaservice.AllowResponse.Status`` name (``"OK"``,
    ``"REJECTED_TIMEOUT"``, ...); ``granted`` is whether the tokens may be used now;
    ``waited`` the seconds ``allow`` slept before returning (the service's ``wait_millis``);
    ``degraded``: granted locally because the service failed (``fail_open``);
    ``overridden``: a rejection granted by the kill switch; ``fallback``: the service was out
    of reach and the client's fallback limiter answered (``REJECTED_TIMEOUT`` when it refused).
    """

    status: str
    tokens: int
    waited: float = 0.0
    degraded: bool = False
    overridden: bool = False
    fallback: bool = False

    @property
    def granted(self) -> bool:
        return self.status == "OK" or self.degraded or self.overridden
