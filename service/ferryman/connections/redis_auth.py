"""Redis credentials read from a file and kept current, so that a password or an ACL user
can change without a restart (REDIS_AUTH_FILE and its siblings).

The file holds one line, as REDIS_AUTH does: a password, or ``user:password`` (split at the
first colon; a final newline is ignored). redis-py asks a connection's credential provider
each time it connects, so new connections authenticate with whatever the file says then,
while connections already authenticated go on (Redis keeps them across a password change).

The file is read:

- at start, strictly: one that cannot be read, is empty or holds more than one line stops
  the start with SettingsError naming the variable and the file;
- at each connect and each health probe: a ``stat`` (which follows symlinks, so a
  Kubernetes Secret volume's ``..data`` swap is seen) and a new read when the file's inode,
  times or size changed;
- after Redis refused the credentials (WRONGPASS, NOAUTH), whatever the ``stat`` says, at
  most every ``RECHECK_AFTER_REFUSAL`` seconds.

A file that cannot be read later (gone, unreadable, empty, half written) keeps the last
credentials: each failed read is counted, and logged at most every ``LOG_EVERY`` seconds
(or at once when the reason changes).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from redis.credentials import CredentialProvider

from ferryman.connections.redis_target import split_auth
from ferryman.errors import SettingsError

__all__ = ["FileCredentials", "PasswordOf"]

log = logging.getLogger("ferryman.redis")

# A refused connect reads the file again, but not more often than this.
RECHECK_AFTER_REFUSAL = 0.1
# A file that stays unreadable is logged again after this long.
LOG_EVERY = 60.0

Stamp = tuple[int, int, int, int]
Credentials = tuple[str] | tuple[str, str]


def _stamp(path: str) -> Stamp:
    st = os.stat(path)  # follows symlinks: a Secret volume swaps its `..data` link
    return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)


def _parse(raw: bytes) -> tuple[str | None, str]:
    """The user (None: not named) and password of a file's bytes; ValueError saying why
    there are none."""
    text = raw.decode("utf-8")
    if text.endswith("\n"):
        text = text[:-1].removesuffix("\r")
    if not text:
        raise ValueError("is empty")
    if "\n" in text or "\r" in text:
        raise ValueError("holds more than one line (a password, or user:password)")
    user, password = split_auth(text)
    if not password:
        raise ValueError(f"names user {user!r} but no password after the colon")
    return user or None, password


class FileCredentials(CredentialProvider):
    """The user and password in ``path`` (the setting ``variable``), kept current.

    ``username`` (REDIS_USERNAME) is the user when the file names none."""

    def __init__(self, path: str, variable: str, username: str | None = None) -> None:
        self.path = path
        self.variable = variable
        self._username = username or None
        self.reloads = 0  # times the file gave new credentials
        self.read_failures = 0  # reads that failed, the last credentials kept
        self.last_error = ""
        self._logged: tuple[str, float] = ("", float("-inf"))
        self._rechecked_at = float("-inf")
        try:
            self._stamp = _stamp(path)
            self._pair = _parse(Path(path).read_bytes())
        except OSError as exc:
            raise SettingsError(f"{variable}={path!r}: {_reason(exc)}") from None
        except ValueError as exc:
            raise SettingsError(f"{variable}={path!r} {_reason(exc)}") from None

    @property
    def user(self) -> str | None:
        """The user the next connection authenticates as (None: the default user)."""
        return self._pair[0] or self._username

    def get_credentials(self) -> Credentials:
        self.refresh()
        password = self._pair[1]
        user = self.user
        return (user, password) if user else (password,)

    async def get_credentials_async(self) -> Credentials:
        return self.get_credentials()

    def refresh(self, force: bool = False) -> bool:
        """Read the file again if it changed (``force``: whether or not it seems to);
        whether the credentials changed. A file that cannot be read keeps the last ones."""
        try:
            stamp = _stamp(self.path)
            if stamp == self._stamp and not force:
                return False
            pair = _parse(Path(self.path).read_bytes())
        except (OSError, ValueError) as exc:
            self._unreadable(exc)
            return False
        self._stamp = stamp
        self.last_error = ""
        self._logged = ("", float("-inf"))
        if pair == self._pair:
            return False
        self._pair = pair
        self.reloads += 1
        log.warning(
            "redis credentials read again from %s=%s (user %s): new connections use them",
            self.variable,
            self.path,
            self.user or "default",
        )
        return True

    def refused(self) -> bool:
        """Redis refused these credentials: read the file again (at most every
        RECHECK_AFTER_REFUSAL seconds); whether they changed."""
        now = time.monotonic()
        if now - self._rechecked_at < RECHECK_AFTER_REFUSAL:
            return False
        self._rechecked_at = now
        return self.refresh(force=True)

    def _unreadable(self, exc: OSError | ValueError) -> None:
        self.read_failures += 1
        reason = _reason(exc)
        self.last_error = reason
        now = time.monotonic()
        last, at = self._logged
        if reason == last and now - at < LOG_EVERY:
            return
        self._logged = (reason, now)
        log.warning(
            "%s=%s cannot be read (%s): keeping the last redis credentials (%d failed reads)",
            self.variable,
            self.path,
            reason,
            self.read_failures,
        )

    def describe(self) -> dict[str, object]:
        """For /status: the file, the user (never the password), reloads and failures."""
        return {
            "file": self.path,
            "variable": self.variable,
            "user": self.user or "default",
            "reloads": self.reloads,
            "read_failures": self.read_failures,
            "last_error": self.last_error or None,
        }


def _reason(exc: OSError | ValueError) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    if isinstance(exc, UnicodeDecodeError):
        return "is not UTF-8 text"
    return str(exc)


class PasswordOf(CredentialProvider):
    """Only the password of other credentials: the Sentinels' when they share the servers'
    (no REDIS_SENTINEL_AUTH of their own)."""

    def __init__(self, source: FileCredentials) -> None:
        self.source = source

    def get_credentials(self) -> Credentials:
        return (self.source.get_credentials()[-1],)

    async def get_credentials_async(self) -> Credentials:
        return self.get_credentials()
