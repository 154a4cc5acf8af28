"""Envoy and Istio configuration, read with envoy-data-plane (the ``ferryman[envoy]`` extra):
what Envoy's ``rate_limits`` send, checked against and explained on the descriptor trees,
and generated from them. Importing this package imports nothing of the extra."""

from __future__ import annotations

from ferryman.errors import SettingsError

__all__ = ["needs_envoy_data_plane"]


def needs_envoy_data_plane(what: str = "ferryman envoy") -> None:
    """Raise SettingsError, naming ``what`` needs it, unless envoy-data-plane is installed."""
    try:
        import envoy_data_plane  # noqa: F401
    except ImportError:
        raise SettingsError(
            f"{what} needs the envoy-data-plane package: pip install ferryman[envoy]"
        ) from None
