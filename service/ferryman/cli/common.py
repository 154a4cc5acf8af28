"""What several commands share: argument types and reading a descriptor directory."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ferryman.config.loader import load_sources, read_directory
from ferryman.errors import RequestError, SettingsError
from ferryman.settings import Settings

if TYPE_CHECKING:
    from ferryman.config.model import Config
    from ferryman.core.answers import EngineOptions

    Subcommands = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = [
    "RAW",
    "descriptor_arg",
    "load_config",
    "port",
    "require_directory",
]

# Help whose description and examples keep their line breaks.
RAW = argparse.RawDescriptionHelpFormatter


def port(text: str) -> int:
    """An argument type: a port number, 0 for any free port."""
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0-65535; 0: any free)")
    return int(text)


def descriptor_arg(text: str) -> list[tuple[str, str]]:
    """An argument type: one descriptor's entries, ``k=v[,k=v...]``."""
    from ferryman.engine.explain import parse_descriptor

    try:
        return parse_descriptor(text)
    except RequestError as exc:
        raise argparse.ArgumentTypeError(str(exc).partition(": ")[2]) from None


def require_directory(directory: Path, origin: str) -> None:
    """Raise SettingsError unless ``directory`` is a directory this process can read."""
    shown = str(directory)
    if not directory.is_absolute():
        shown += f" (in {Path.cwd()})"
    if not directory.exists():
        raise SettingsError(f"config directory {shown} does not exist; check {origin}")
    if not directory.is_dir():
        raise SettingsError(f"config directory {shown} is not a directory; check {origin}")
    try:
        os.listdir(directory)
    except OSError as exc:
        raise SettingsError(
            f"config directory {shown} cannot be read ({exc.strerror}): "
            "give this user read access to it"
        ) from None


def load_config(directory: Path | None) -> tuple[Config, EngineOptions]:
    """The configuration in ``directory`` (default descriptors/ here) and the engine's
    options, both as ``serve`` would read them from the environment."""
    from ferryman.server.app import engine_options

    settings = Settings.from_env()
    directory = directory if directory is not None else Path("descriptors")
    require_directory(directory, "the path given to --config")
    config = load_sources(
        read_directory(directory, ignore_dotfiles=settings.ignore_dotfiles),
        merge_domains=settings.merge_domain_config,
        strict=settings.strict_config,
    )
    return config, engine_options(settings)
