"""`ferryman serve` as a child process whose start may wait (for Redis, for xDS): started
without waiting, its stderr collected line by line, its ports read from the start line."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

from helpers.server import wait_for

SERVING = re.compile(r"ferryman serving: grpc :(\d+), http :(\d+), debug :(\d+)")


class ServeProcess:
    """``python -m ferryman serve`` on free ports (the debug port ``debug_port`` if given)
    with ``env`` added to a minimal environment (FERRYMAN_SHUTDOWN_DRAIN=0 unless ``env``
    gives it); ``defaults`` adds USE_STATSD=false and LOG_LEVEL=info to it (without them,
    the service's own defaults hold). ``program`` is what Python runs (a script that takes
    ``serve``'s arguments in its place)."""

    def __init__(
        self,
        cwd: Path,
        env: dict[str, str],
        *args: str,
        debug_port: int = 0,
        defaults: bool = True,
        program: tuple[str, ...] = ("-m", "ferryman", "serve"),
    ) -> None:
        full = {"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1"}
        # No drain on SIGTERM (5 s by default) unless a test asks for one in ``env``: a
        # test that does not test draining would wait it out at every stop.
        full["FERRYMAN_SHUTDOWN_DRAIN"] = "0"
        if defaults:
            full.update(USE_STATSD="false", LOG_LEVEL="info")
        if "PYTHONPATH" in os.environ:
            full["PYTHONPATH"] = os.environ["PYTHONPATH"]
        full.update(env)
        ports = ["--grpc-port", "0", "--http-port", "0", "--debug-port", str(debug_port)]
        self.proc = subprocess.Popen(
            [sys.executable, *program, *args, *ports],
            cwd=cwd,
            env=full,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.grpc_port = self.http_port = 0
        self.debug_port = debug_port
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def serving(self) -> bool:
        """Whether the start line has been logged (fails if the process has exited)."""
        match = SERVING.search(self.text)
        if match:
            self.grpc_port, self.http_port, self.debug_port = map(int, match.groups())
            return True
        if self.proc.poll() is not None:
            self._reader.join(5)
            raise AssertionError("ferryman serve exited:\n" + self.text)
        return False

    def wait_serving(self, timeout: float = 30) -> None:
        wait_for("ferryman serving", self.serving, timeout=timeout)

    def status(self) -> dict[str, Any]:
        """The debug port's /status."""
        url = f"http://127.0.0.1:{self.debug_port}/status"
        with urllib.request.urlopen(url, timeout=10) as reply:
            loaded: dict[str, Any] = json.loads(reply.read())
        return loaded

    def wait_exit(self, timeout: float = 30) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(10)
        return code

    def stop(self) -> int:
        """SIGTERM, then the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait_exit()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
