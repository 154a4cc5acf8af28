"""Counter stores: the Backend protocol and its implementations."""

from ferryman.backends.base import Backend, CounterOp, CounterResult
from ferryman.backends.memory import MemoryBackend

__all__ = ["Backend", "CounterOp", "CounterResult", "MemoryBackend"]
