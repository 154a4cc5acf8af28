"""One frozen Settings object, read from the reference service's environment variables.

Each setting is declared once, on its field of :class:`Settings` (``settings/model.py``):
its variable, kind (type, bounds, choices), default, help and ``serve`` flag. The parser
(``Settings.from_env``), ``ferryman serve``'s flags and the settings page of the docs
(``python -m ferryman.settings --markdown``) are made from those declarations.
"""

from __future__ import annotations

from ferryman.settings.kinds import split_address
from ferryman.settings.model import (
    ACCEPTED_IGNORED,
    EVENT_LOOPS,
    Settings,
    default_config_dir,
)
from ferryman.settings.read import check_redis_url

__all__ = [
    "ACCEPTED_IGNORED",
    "EVENT_LOOPS",
    "Settings",
    "check_redis_url",
    "default_config_dir",
    "split_address",
]
