"""Values that pass through hands that must not change them: signed with an HMAC.

A transfer id is one: a session hands it to another, which seizes the copies it names. A
config store entry in Redis is another: a replica puts a version in force only if the
replica that wrote it signed it, so a direct write to Redis is not taken for an API write.
The key is SIGNING_KEY (or the file SIGNING_KEY_FILE names); every replica that shares a
backend needs the same key. Without one transfer ids are still checked against corruption
(and the copy store keeps what each transfer holds, so a changed id finds nothing to
seize), but config store entries are not checked: anyone who can write to Redis could sign.
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
        """The key of SIGNING_KEY, else of SIGNING_KEY_FILE (SettingsError naming it when
        it cannot be read), else the empty key."""
        if settings.signing_key:
            return cls(settings.signing_key.encode())
        path = settings.signing_key_file
        if path:
            try:
                key = Path(path).read_bytes().strip()
            except OSError as exc:
                raise SettingsError(f"SIGNING_KEY_FILE={path!r}: {exc.strerror}") from None
            if not key:
                raise SettingsError(f"SIGNING_KEY_FILE={path!r} is empty")
            return cls(key)
        return cls(b"")

    @property
    def keyed(self) -> bool:
        """Whether a secret key was given (without one, a signature proves no origin)."""
        return bool(self._key)

    def tag(self, payload: bytes) -> str:
        """The signature of ``payload``, as text."""
        return _b64(self._tag(payload))

    def check(self, payload: bytes, tag: str) -> bool:
        return hmac.compare_digest(self.tag(payload), tag)

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
