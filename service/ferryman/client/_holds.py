"""What ``Hold`` and ``AsyncHold`` share: a read-only view of a hold's state."""

from __future__ import annotations

from ferryman.client._core import HoldState
from ferryman.client._models import Entries, ReserveContext

__all__ = ["HoldView"]


class HoldView:
    """The attributes of a hold of copies, as ``hold_copy`` and ``seize_copy`` give it."""

    def __init__(self, state: HoldState) -> None:
        self._state = state

    @property
    def success(self) -> bool:
        """Whether copies were granted (by the service, in degraded mode or by the kill switch)."""
        return self._state.success

    @property
    def copies(self) -> int:
        """Copies the caller has now: granted, less what was released or transferred since."""
        return self._state.copies

    @property
    def groups(self) -> tuple[str, ...]:
        """The tenant's groups at reserve time, whose pools the copies came from."""
        return self._state.groups

    @property
    def waited(self) -> float:
        """Seconds the reservation (or seize) took, backoff sleeps included."""
        return self._state.waited

    @property
    def attempts(self) -> int:
        """Calls made to reserve (or seize); 0 when granted without asking the service."""
        return self._state.attempts

    @property
    def degraded(self) -> bool:
        """The service could not answer: the copies were granted locally, none is held."""
        return self._state.degraded

    @property
    def overridden(self) -> bool:
        """The service refused and the kill switch granted ``min_copies``; none is held."""
        return self._state.overridden

    @property
    def lost(self) -> bool:
        """The session holding the copies ended (server restarted or lost its lease).

        The service has released them; the caller still has ``copies`` to finish with, and
        releasing them is a local no-op.
        """
        return self._state.lost

    @property
    def held(self) -> bool:
        """Whether the service holds the copies for this client (not degraded, overridden,
        rejected, lost or fully released)."""
        state = self._state
        return state.session is not None and state.copies > 0 and not state.lost

    @property
    def context(self) -> ReserveContext | None:
        """The service's last reserve answer: limits and counts (None when not asked, or
        for a seized hold)."""
        return self._state.context

    @property
    def domain(self) -> str:
        """The node's domain ("" for a seize granted in degraded mode)."""
        return self._state.domain

    @property
    def descriptor(self) -> Entries:
        """The node's descriptor as (key, value) pairs (empty for a degraded seize)."""
        return self._state.entries

    def __repr__(self) -> str:
        state = self._state
        flags = [
            name
            for name, on in (
                ("degraded", state.degraded),
                ("overridden", state.overridden),
                ("lost", state.lost),
            )
            if on
        ]
        shown = ",".join(f"{k}={v}" for k, v in state.entries)
        extra = f" {' '.join(flags)}" if flags else ""
        return (
            f"<{type(self).__name__} {state.domain} {shown} success={state.success} "
            f"copies={state.copies}{extra}>"
        )
