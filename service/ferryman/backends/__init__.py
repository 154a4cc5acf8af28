"""Backends: where the state of every algorithm lives (this process, or Redis)."""

from ferryman.backends.base import Backend
from ferryman.backends.memory import MemoryBackend

__all__ = ["Backend", "MemoryBackend"]
