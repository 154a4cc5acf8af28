"""Values a caller carries between calls and must not change: signed with an HMAC.

A transfer id is one: a session hands it to another, which seizes the copies it names. The
key is TRANSFER_KEY (or the file TRANSFER_KEY_FILE names); every replica that shares a
backend needs the same key. Without one the ids are still checked against corruption, and
the copy store keeps what each transfer holds, so a changed id finds nothing to seize.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from pathlib import Path

from ferryman.errors import SettingsError
from ferryman.settings import Settings

__all__ = ["Signer"]

_TAG_BYTES = 16


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Signer:
    """Signs a payload into a token and opens a token whose signature holds."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    @classmethod
    def from_settings(cls, settings: Settings) -> Signer:
        """The key of TRANSFER_KEY, else of TRANSFER_KEY_FILE (SettingsError naming it when
        it cannot be read), else the empty key."""
        if settings.transfer_key:
            return cls(settings.transfer_key.encode())
        if settings.transfer_key_file:
            try:
                key = Path(settings.transfer_key_file).read_bytes().strip()
            except OSError as exc:
                raise SettingsError(
                    f"TRANSFER_KEY_FILE={settings.transfer_key_file!r}: {exc.strerror}"
                ) from None
            if not key:
                raise SettingsError(f"TRANSFER_KEY_FILE={settings.transfer_key_file!r} is empty")
            return cls(key)
        return cls(b"")

    def _tag(self, payload: bytes) -> bytes:
        return hmac.new(self._key, payload, hashlib.sha256).digest()[:_TAG_BYTES]

    def sign(self, payload: bytes) -> str:
        return f"{_b64(payload)}.{_b64(self._tag(payload))}"

    def open(self, token: str) -> bytes | None:
        """The payload of ``token``, or None when it is not one this key signed."""
        body, _, tag = token.partition(".")
        try:
            payload, mac = _unb64(body), _unb64(tag)
        except (ValueError, binascii.Error):
            return None
        return payload if hmac.compare_digest(mac, self._tag(payload)) else None
