"""What a setting's value may be: each kind parses a raw string, says what is wrong with a
bad one, and describes itself for the settings table and the command line.

A kind raises :class:`Invalid` with the end of a sentence (``"is not an integer"``); the
caller puts the variable's or the flag's name in front, so that one kind serves both.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ferryman.connections.redis_target import address
from ferryman.durations import parse_duration
from ferryman.errors import SettingsError
from ferryman.logs import parse_level

__all__ = [
    "Address",
    "Boolean",
    "Choice",
    "Duration",
    "HttpPath",
    "Integer",
    "Invalid",
    "Items",
    "LogLevel",
    "Number",
    "Pairs",
    "PathText",
    "Port",
    "Servers",
    "SettingKind",
    "Text",
    "split_address",
]

_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


class Invalid(Exception):
    """A raw value a kind refuses; the message continues ``NAME='raw' ``."""


def _address_problem(address: str) -> str:
    """What is wrong with ``address`` as host:port (empty when nothing)."""
    host, sep, port = address.strip().rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        return "is not host:port (e.g. :9090, 0.0.0.0:9090)"
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        return ": put an IPv6 host in brackets, [::1]:9090"
    return ""


def split_address(address: str, name: str = "address") -> tuple[str, int]:
    """``host:port``, ``:port`` or ``[v6]:port`` -> (host, port); an empty host means every
    interface and port 0 a free one. Raises SettingsError naming ``name``."""
    problem = _address_problem(address)
    if problem:
        raise SettingsError(_sentence(f"{name}={address!r}", Invalid(problem)))
    host, _, port = address.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def _sentence(subject: str, problem: Invalid) -> str:
    text = str(problem)
    return subject + text if text.startswith(":") else f"{subject} {text}"


class SettingKind:
    """The base of every kind: text in, a value out, or Invalid."""

    #: Whether an empty value reads as the default (as an unset one does) or as itself.
    blank_is_default = True

    def check(self, raw: str) -> Any:
        raise NotImplementedError

    def describe(self) -> str:
        """The accepted values, in Markdown, for the settings table."""
        raise NotImplementedError

    def choices(self) -> tuple[str, ...] | None:
        """The values a command-line flag may take, when they are a closed list."""
        return None

    def parse(self, name: str, raw: str) -> Any:
        """``raw`` as a value; raises SettingsError naming ``name`` (a variable)."""
        try:
            return self.check(raw)
        except Invalid as exc:
            raise SettingsError(_sentence(f"{name}={raw!r}", exc)) from None

    def argument(self) -> Callable[[str], Any]:
        """An argparse ``type``: the same check, reported as a usage error."""

        def convert(raw: str) -> Any:
            try:
                return self.check(raw)
            except Invalid as exc:
                raise argparse.ArgumentTypeError(_sentence(repr(raw), exc)) from None
            except SettingsError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from None

        convert.__name__ = type(self).__name__.lower()
        return convert


@dataclass(frozen=True)
class Text(SettingKind):
    """Any text, folded to one case when the value is a name."""

    fold: Literal["", "lower", "upper"] = ""
    blank_is_default: bool = False

    def check(self, raw: str) -> str:
        if self.fold == "lower":
            return raw.lower()
        return raw.upper() if self.fold == "upper" else raw

    def describe(self) -> str:
        return "text"


@dataclass(frozen=True)
class PathText(SettingKind):
    """A file system path."""

    def check(self, raw: str) -> Path:
        return Path(raw)

    def describe(self) -> str:
        return "path"


@dataclass(frozen=True)
class Boolean(SettingKind):
    """Go's ``strconv.ParseBool`` spellings, as the reference reads them."""

    def check(self, raw: str) -> bool:
        if raw in _TRUE:
            return True
        if raw in _FALSE:
            return False
        raise Invalid("is not a boolean (use true or false)")

    def describe(self) -> str:
        return "`true` or `false`"


@dataclass(frozen=True)
class Integer(SettingKind):
    """A whole number, at least ``minimum``."""

    minimum: int = 0

    def check(self, raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise Invalid("is not an integer") from None
        if value < self.minimum:
            raise Invalid(f"must be at least {self.minimum}")
        return value

    def describe(self) -> str:
        return f"integer, at least {self.minimum}"


@dataclass(frozen=True)
class Port(SettingKind):
    """A TCP port; 0 asks the system for a free one."""

    def check(self, raw: str) -> int:
        if not raw.strip().isdigit() or int(raw) > 65535:
            raise Invalid("is not a port number (0-65535; 0 picks a free one)")
        return int(raw)

    def describe(self) -> str:
        return "port, 0-65535 (0: a free one)"


@dataclass(frozen=True)
class Number(SettingKind):
    """A number between ``low`` and ``high``."""

    low: float = 0.0
    high: float = 1.0

    def check(self, raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise Invalid("is not a number") from None
        if not self.low <= value <= self.high:
            raise Invalid(f"must be between {self.low:g} and {self.high:g}")
        return value

    def describe(self) -> str:
        return f"number from {self.low:g} to {self.high:g}"


def _shown(seconds: float) -> str:
    if seconds == 0:
        return "0"
    return f"{seconds * 1000:g}ms" if seconds < 1 else f"{seconds:g}s"


@dataclass(frozen=True)
class Duration(SettingKind):
    """A Go-style duration (``10s``, ``500ms``, ``1m``) or a number of seconds, at least
    ``minimum`` (more than it when ``above``)."""

    minimum: float = 0.0
    above: bool = False

    def check(self, raw: str) -> float:
        try:
            value = parse_duration(raw)
        except ValueError:
            raise Invalid("is not a duration (e.g. 10s, 500ms)") from None
        if value < 0:
            raise Invalid("must not be negative")
        if self.above and value <= self.minimum:
            raise Invalid(f"must be more than {_shown(self.minimum)}")
        if value < self.minimum:
            raise Invalid(f"must be at least {_shown(self.minimum)}")
        return value

    def describe(self) -> str:
        if self.above:
            return f"duration, more than {_shown(self.minimum)}"
        return f"duration, at least {_shown(self.minimum)}" if self.minimum else "duration"


@dataclass(frozen=True)
class Choice(SettingKind):
    """One of a closed list of names (surrounding blanks and case do not matter); each
    name may carry a few words that the error and the table show."""

    options: tuple[tuple[str, str], ...]
    fold: Literal["lower", "upper"] = "lower"
    blank_is_default: bool = True

    def check(self, raw: str) -> str:
        value = raw.strip()
        value = value.lower() if self.fold == "lower" else value.upper()
        if value not in self.choices():
            raise Invalid(f"must be {self._listed()}")
        return value

    def choices(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.options)

    def _listed(self) -> str:
        names = [f"{name} ({words})" if words else name for name, words in self.options]
        return ", ".join(names[:-1]) + " or " + names[-1]

    def describe(self) -> str:
        return ", ".join(
            f"`{name}` ({words})" if words else f"`{name}`" for name, words in self.options
        )


@dataclass(frozen=True)
class LogLevel(SettingKind):
    """The reference's level names."""

    def check(self, raw: str) -> str:
        try:
            parse_level(raw)
        except SettingsError:
            raise Invalid("is not a log level (use debug, info, warn or error)") from None
        return raw.strip().lower()

    def choices(self) -> tuple[str, ...]:
        return ("debug", "info", "warn", "error")

    def describe(self) -> str:
        return "`debug`, `info`, `warn`, `error`"


@dataclass(frozen=True)
class Address(SettingKind):
    """``host:port``, ``:port`` or ``[v6]:port``; empty allowed when ``optional``."""

    optional: bool = False
    blank_is_default = False

    def check(self, raw: str) -> str:
        value = raw.strip() if self.optional else raw
        if value or not self.optional:
            problem = _address_problem(value)
            if problem:
                raise Invalid(problem)
        return value

    def describe(self) -> str:
        return "`host:port`" + (" or empty" if self.optional else "")


@dataclass(frozen=True)
class HttpPath(SettingKind):
    """The path part of a URL."""

    blank_is_default = False

    def check(self, raw: str) -> str:
        if not raw.startswith("/"):
            raise Invalid("must start with '/'")
        return raw

    def describe(self) -> str:
        return "URL path starting with `/`"


@dataclass(frozen=True)
class Items(SettingKind):
    """A comma-separated list; blanks around and between items do not count."""

    def check(self, raw: str) -> tuple[str, ...]:
        return tuple(item.strip() for item in raw.split(",") if item.strip())

    def describe(self) -> str:
        return "comma-separated list"


@dataclass(frozen=True)
class Pairs(SettingKind):
    """``key<sep>value`` pairs separated by commas, in order."""

    sep: str = ":"

    def check(self, raw: str) -> tuple[tuple[str, str], ...]:
        pairs: list[tuple[str, str]] = []
        for item in raw.split(","):
            if not item.strip():
                continue
            key, sep, value = item.partition(self.sep)
            if not sep or not key.strip():
                raise Invalid(f": give key{self.sep}value pairs separated by commas")
            pairs.append((key.strip(), value.strip()))
        return tuple(pairs)

    def describe(self) -> str:
        return f"`key{self.sep}value` pairs, comma-separated"


@dataclass(frozen=True)
class Servers(SettingKind):
    """``host:port[,host:port...]`` as (host, port) pairs."""

    def parse(self, name: str, raw: str) -> tuple[tuple[str, int], ...]:
        return tuple(address(item, name) for item in raw.split(",") if item.strip())

    def check(self, raw: str) -> tuple[tuple[str, int], ...]:
        return self.parse("servers", raw)

    def describe(self) -> str:
        return "`host:port`, comma-separated"
