"""How a setting is declared: one :class:`Setting` per environment variable, carrying its
kind (type, bounds, choices), default, help and ``serve`` flag.

A setting stored on :class:`~ferryman.settings.Settings` is declared on its dataclass field
(``port: int = LISTEN.setting("PORT", 8080, Port(), "...")``), the way the reference tags
its struct fields; a variable that only feeds another field, or that ferryman accepts and
ignores, is declared with :meth:`Topic.variable` or :meth:`Topic.accepted`. The parser, the
command line and the settings table all read these declarations.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ferryman.settings.kinds import Duration, SettingKind

__all__ = ["METADATA", "Flag", "Setting", "Topic"]

T = TypeVar("T")

#: The key of a dataclass field's metadata that holds its Setting.
METADATA = "setting"


@dataclass(frozen=True)
class Flag:
    """A ``ferryman serve`` option that overrides the setting.

    ``kind`` replaces the setting's kind where the flag takes other values (``--backend``
    takes URLs); ``repeat`` collects every occurrence into a tuple."""

    name: str
    help: str = ""
    metavar: str | None = None
    kind: SettingKind | None = None
    repeat: bool = False

    @property
    def dest(self) -> str:
        """The attribute argparse gives the flag's value."""
        return self.name.removeprefix("--").replace("-", "_")


@dataclass(frozen=True)
class Setting:
    """One environment variable: how it is read, what it means, and its flag."""

    env: str
    kind: SettingKind
    help: str
    topic: Topic
    default: Any = None
    flag: Flag | None = None
    #: What the table shows as the default, where the value itself says little.
    shown_default: str = ""
    #: Why ferryman accepts the variable but lets it change nothing (the reference's only).
    ignored: str = ""
    #: Who reads the variable, when it is not Settings.from_env.
    read_by: str = ""

    def read(self, env: Mapping[str, str]) -> Any:
        """The variable's value in ``env``, or its default; raises SettingsError."""
        raw = env.get(self.env)
        if raw is None or (raw == "" and self.kind.blank_is_default):
            return self.default
        return self.kind.parse(self.env, raw)

    def shown(self) -> str:
        """The default as an operator would write it, in Markdown."""
        value = self.default
        if self.shown_default:
            return self.shown_default
        if value is None or value == "" or value == ():
            return "(empty)"
        if isinstance(value, bool):
            return "`true`" if value else "`false`"
        if isinstance(self.kind, Duration) and isinstance(value, float):
            return f"`{_duration(value)}`"
        return f"`{value}`"


def _duration(seconds: float) -> str:
    if seconds == 0:
        return "0"
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


@dataclass(frozen=True)
class Topic:
    """A group of settings: a section of the settings table."""

    title: str
    about: str = ""

    def setting(
        self,
        env: str,
        default: T,
        kind: SettingKind,
        help: str,
        *,
        flag: Flag | None = None,
        env_default: object = dataclasses.MISSING,
        shown_default: str = "",
    ) -> T:
        """A dataclass field read from ``env`` (which is empty for a field only a flag sets).

        ``env_default`` is the value when the variable is unset, where it differs from the
        field's own default (which a Settings built in code keeps)."""
        unset = default if env_default is dataclasses.MISSING else env_default
        declared = Setting(env, kind, help, self, unset, flag, shown_default)
        return dataclasses.field(default=default, metadata={METADATA: declared})

    def factory(
        self, factory: Callable[[], T], kind: SettingKind, help: str, *, flag: Flag, shown: str
    ) -> T:
        """A dataclass field with a computed default, set only by its flag."""
        declared = Setting("", kind, help, self, None, flag, shown)
        return dataclasses.field(default_factory=factory, metadata={METADATA: declared})

    def variable(
        self, env: str, default: object, kind: SettingKind, help: str, *, read_by: str = ""
    ) -> Setting:
        """A variable that is no field of its own: it feeds others, or another part of
        ferryman reads it (``read_by``)."""
        return Setting(env, kind, help, self, default, read_by=read_by)

    def accepted(self, env: str, kind: SettingKind, why: str, *, default: object = None) -> Setting:
        """One of the reference's variables that changes nothing here (``why``); a value
        that cannot be valid for ``kind`` is still refused."""
        return Setting(env, kind, "", self, default, ignored=why)
