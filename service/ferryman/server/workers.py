"""``ferryman serve --workers N``: N processes serving the same ports, supervised.

Each worker is a whole ``ferryman serve`` (its own config watch, backend connection and
servers) that binds every port with SO_REUSEPORT, so the kernel spreads connections over
them. The supervisor restarts a worker that dies, and on SIGTERM or SIGINT passes it on
to every worker and waits for them to drain and stop (a second signal is passed on too:
it ends the workers' drain). Counters must be shared between workers, so
the memory backend is refused.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from types import FrameType

from ferryman.errors import SettingsError
from ferryman.settings import Settings

__all__ = ["WORKER_ENV", "Supervisor", "free_port"]

log = logging.getLogger("ferryman.workers")

#: Set in a worker's environment (its index): the process serves instead of supervising.
WORKER_ENV = "FERRYMAN_WORKER"

# A worker that exits this soon after it started failed to start: the supervisor stops.
_START_WINDOW = 3.0


def _die_with_parent(parent: int) -> None:
    """In a worker, before it runs: SIGTERM when the supervisor (``parent``) dies, however
    it dies (Linux; elsewhere a killed supervisor leaves its workers to be stopped by hand).
    A supervisor that died before the request was made never sends it: the worker then
    ends here."""
    name = ctypes.util.find_library("c")
    if name is None:
        return
    pr_set_pdeathsig = 1
    ctypes.CDLL(name, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent:
        os._exit(1)


def free_port(host: str) -> int:
    """A port free now on ``host``, for ports given as 0: every worker must share one."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host or "", 0))
        return int(sock.getsockname()[1])


def check(settings: Settings) -> None:
    """Raise SettingsError when ``settings`` cannot run in several processes."""
    if settings.backend == "memory":
        raise SettingsError(
            f"WORKERS={settings.workers} (--workers) needs a backend the workers share: the "
            "memory backend keeps counters per process. Use Redis (--backend redis://HOST:PORT "
            "or BACKEND_TYPE=redis), or run one worker."
        )


@dataclass
class _Worker:
    index: int
    process: subprocess.Popen[bytes]
    started: float = field(default_factory=time.monotonic)


class Supervisor:
    """Runs ``argv`` (a ``ferryman serve`` command line) as ``n`` workers until signalled."""

    def __init__(self, argv: Sequence[str], n: int, grace: float) -> None:
        """``grace``: how long a worker may take to stop (its drain and grace period)."""
        self._argv = list(argv)
        self._n = n
        self._grace = grace
        self._stopping = False
        self._workers: dict[int, _Worker] = {}
        # The workers told to stop: a further signal is passed on to them.
        self._told: list[subprocess.Popen[bytes]] = []

    def _spawn(self, index: int) -> None:
        env = {**os.environ, WORKER_ENV: str(index)}
        process = subprocess.Popen(
            [sys.executable, "-m", "ferryman", *self._argv],
            env=env,
            preexec_fn=partial(_die_with_parent, os.getpid()) if sys.platform == "linux" else None,
        )
        self._workers[index] = _Worker(index, process)
        log.info("worker %d started (pid %d)", index, process.pid)

    def _signalled(self, signum: int, frame: FrameType | None) -> None:
        if self._stopping:
            for process in self._told:
                if process.poll() is None:
                    process.send_signal(signum)
        self._stopping = True

    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers.values()]

    def run(self) -> int:
        """Serve until SIGTERM or SIGINT; the exit status (0 after a clean stop)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._signalled)
        for index in range(self._n):
            self._spawn(index)
        log.info("serving with %d workers", self._n)
        try:
            while not self._stopping:
                for worker in list(self._workers.values()):
                    code = worker.process.poll()
                    if code is None or self._stopping:
                        continue
                    if time.monotonic() - worker.started < _START_WINDOW and code in (1, 2):
                        log.error("worker %d could not start (exit %d)", worker.index, code)
                        self._stop_all()
                        return code
                    log.warning(
                        "worker %d (pid %d) exited with %d; starting it again",
                        worker.index,
                        worker.process.pid,
                        code,
                    )
                    self._spawn(worker.index)
                time.sleep(0.1)
        finally:
            self._stop_all()
        return 0

    def _stop_all(self) -> None:
        """SIGTERM every worker, wait for them to drain, kill what is left."""
        live = [w.process for w in self._workers.values() if w.process.poll() is None]
        for process in live:
            process.send_signal(signal.SIGTERM)
        self._told = live
        deadline = time.monotonic() + self._grace + 5.0
        for process in live:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker pid %d did not stop in time; killing it", process.pid)
                process.kill()
                process.wait()
