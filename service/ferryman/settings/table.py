"""The settings page of the docs, in Markdown, generated from the declarations.

``python -m ferryman.settings --markdown > docs/operators/settings.md`` writes it; a test
regenerates it and fails when the committed page differs.
"""

from __future__ import annotations

from collections.abc import Iterator

from ferryman.settings.declare import Setting, Topic
from ferryman.settings.model import TOPICS, every_setting

__all__ = ["COMMAND", "markdown"]

COMMAND = "python -m ferryman.settings --markdown > docs/operators/settings.md"

_HEADER = f"""# Settings

Generated from the declarations in `service/ferryman/settings/model.py` by running
`{COMMAND}`
from the repository root: edit the declarations, not this page (a test fails when the page
is stale).

Ferryman reads these environment variables once, at start. The names, meanings and defaults
are those of envoyproxy/ratelimit, so that a deployment written for it runs ferryman
unchanged. An invalid value stops the start with the variable named. A `ferryman serve` flag
overrides its variable.

A duration is written as Go writes them (`500ms`, `10s`, `1m`, `1h30m`) or as a number of
seconds; a boolean as `true`, `false`, `1`, `0`, `t` or `f` (any case of `true` and
`false`). An empty number, boolean, duration or choice reads as its default; most text
variables take an empty value as it is (an empty `HOST` means every interface).
"""


def markdown() -> str:
    """The whole page."""
    parts = [_HEADER]
    for topic in TOPICS:
        rows = [s for s in every_setting() if s.topic is topic]
        parts.append("\n".join(_section(topic, rows)) + "\n")
    return "\n".join(parts)


def _section(topic: Topic, rows: list[Setting]) -> Iterator[str]:
    yield f"## {topic.title}"
    yield ""
    if topic.about:
        yield topic.about
        yield ""
    if all(row.ignored for row in rows):
        yield from _ignored(rows)
        return
    yield "| variable | default | values | `serve` flag | what it does |"
    yield "|---|---|---|---|---|"
    for row in rows:
        help = row.help + (f" (read by {row.read_by})" if row.read_by else "")
        values = _cell(row.kind.describe())
        yield _row(_name(row), _default(row), values, _flag(row), _cell(help))


def _ignored(rows: list[Setting]) -> Iterator[str]:
    """One row per reason, naming every variable it covers."""
    yield "| variables | values | why they change nothing in ferryman |"
    yield "|---|---|---|"
    reasons = dict.fromkeys(row.ignored for row in rows)
    for reason in reasons:
        alike = [row for row in rows if row.ignored == reason]
        values = dict.fromkeys(row.kind.describe() for row in alike)
        names = ", ".join(_name(row) for row in alike)
        yield _row(names, _cell("; ".join(values)), _cell(reason))


def _row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _name(setting: Setting) -> str:
    return f"`{setting.env}`" if setting.env else "(flag only)"


def _flag(setting: Setting) -> str:
    flag = setting.flag
    if flag is None:
        return ""
    shown = f"`{flag.name} {flag.metavar}`" if flag.metavar else f"`{flag.name}`"
    return shown + (", repeatable" if flag.repeat else "")


def _default(setting: Setting) -> str:
    return _cell(setting.shown())
