"""Descriptor configuration: models, loader and reloader."""

from ferryman.config.loader import load_directory, load_sources, read_directory
from ferryman.config.model import Config
from ferryman.core.rules import Domain, Level, Rule, Unit, UnitLimit

__all__ = [
    "Config",
    "Domain",
    "Level",
    "Rule",
    "Unit",
    "UnitLimit",
    "load_directory",
    "load_sources",
    "read_directory",
]
