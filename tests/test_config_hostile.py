"""Hostile configuration files: each is rejected with its file and reason, in bounded time
and memory, while the last good configuration stays in force."""

from __future__ import annotations

import os
import threading
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from ferryman.config.loader import load_directory
from ferryman.core.nodes import MAX_ALIAS_NODES, MAX_DEPTH, MAX_FILE_BYTES
from ferryman.errors import ConfigError

from helpers.server import ConfigDir, ServerFactory, codes, wait_for

GOOD = """
domain: app
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
"""


def invalid_yaml(d: Path) -> Path:
    path = d / "bad.yaml"
    path.write_text("domain: x\ndescriptors: [unclosed\n")
    return path


def alias_bomb(d: Path) -> Path:
    """Nine levels of nine aliases: a billion leaves once expanded."""
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    path = d / "bomb.yaml"
    path.write_text("\n".join(lines) + "\ndomain: bomb\ndescriptors: *a9\n")
    return path


def descriptor_bomb(d: Path) -> Path:
    """Aliases of descriptor lists, each level three times the one below: the reader would
    walk 3^12 descriptors."""
    lines = ["domain: bomb", "l0: &l0 [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]"]
    for i in range(1, 13):
        below = f"*l{i - 1}"
        items = ", ".join(f"{{key: {k}, descriptors: {below}}}" for k in "abc")
        lines.append(f"l{i}: &l{i} [{items}]")
    path = d / "bomb.yaml"
    path.write_text("\n".join(lines) + "\ndescriptors: *l12\n")
    return path


def fifty_megabytes(d: Path) -> Path:
    path = d / "huge.yaml"
    line = b"  - {key: k, value: v, rate_limit: {unit: second, requests_per_unit: 1}}\n"
    with path.open("wb") as f:
        f.write(b"domain: huge\ndescriptors:\n")
        chunk = line * (1 << 14)
        while f.tell() < 50 << 20:
            f.write(chunk)
    return path


def deep_nesting(d: Path) -> Path:
    path = d / "deep.yaml"
    path.write_text("domain: deep\ndescriptors: " + "[" * 10_000 + "]" * 10_000 + "\n")
    return path


def deep_block_nesting(d: Path) -> Path:
    path = d / "deep.yaml"
    lines = ["domain: deep", "descriptors:"]
    for i in range(200):
        pad = "  " * i
        lines += [f"{pad}  - key: k{i}", f"{pad}    descriptors:"]
    path.write_text("\n".join(lines) + "\n")
    return path


def binary(d: Path) -> Path:
    path = d / "blob.yaml"
    path.write_bytes(bytes(range(256)) * 64)
    return path


def symlink_loop(d: Path) -> Path:
    path = d / "loop.yaml"
    os.symlink("loop.yaml", path)
    return path


def vanished(d: Path) -> Path:
    """A file listed in the directory but gone when opened (a dangling link is exactly the
    state a file removed between the listing and the read leaves)."""
    path = d / "gone.yaml"
    os.symlink("removed-meanwhile.yaml", path)
    return path


def fifo(d: Path) -> Path:
    """A named pipe: opening it for reading would wait for a writer forever."""
    path = d / "pipe.yaml"
    os.mkfifo(path)
    return path


# (maker, part of the reason)
HOSTILE: list[tuple[Callable[[Path], Path], str]] = [
    (invalid_yaml, "YAML syntax error"),
    (alias_bomb, f"expand the file by more than {MAX_ALIAS_NODES} nodes"),
    (descriptor_bomb, f"expand the file by more than {MAX_ALIAS_NODES} nodes"),
    (fifty_megabytes, f"larger than {MAX_FILE_BYTES} bytes"),
    (deep_nesting, f"nested deeper than {MAX_DEPTH} levels"),
    (deep_block_nesting, f"nested deeper than {MAX_DEPTH} levels"),
    (binary, "not UTF-8 text"),
    (symlink_loop, "Too many levels of symbolic links"),
    (vanished, "No such file or directory"),
    (fifo, "not a regular file"),
]
IDS = [maker.__name__ for maker, _ in HOSTILE]


@pytest.mark.parametrize(("maker", "reason"), HOSTILE, ids=IDS)
def test_a_hostile_file_is_rejected_quickly_with_its_name_and_reason(
    tmp_path: Path, maker: Callable[[Path], Path], reason: str
) -> None:
    """Loading fails with a ConfigError naming the file and the reason, within a second
    and a few megabytes of memory."""
    path = maker(tmp_path)
    tracemalloc.start()
    start = time.monotonic()
    try:
        with pytest.raises(ConfigError) as info:
            load_directory(tmp_path)
        took = time.monotonic() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    (problem,) = info.value.problems
    assert problem.file == str(path)
    assert reason in problem.message
    assert took < 2.0, f"{took:.2f}s"
    assert peak < 8 << 20, f"peak {peak} bytes"


@pytest.mark.parametrize(("maker", "reason"), HOSTILE, ids=IDS)
def test_a_hostile_file_keeps_the_last_good_config_in_force(
    config_dir: ConfigDir,
    make_server: ServerFactory,
    tmp_path: Path,
    maker: Callable[[Path], Path],
    reason: str,
) -> None:
    """Dropped into a served directory, each file is rejected, counted and shown on /status;
    the limits in force do not change; removing it clears the error."""
    config_dir.write("app.yaml", GOOD)
    server = make_server()
    assert codes(server.ask("app", [("user", "a")], [("user", "a")])) == ["OK", "OVER_LIMIT"]
    # Made aside and renamed in, so that no reload sees it half written.
    (tmp_path / "staging").mkdir()
    staged = maker(tmp_path / "staging")
    path = config_dir.path / staged.name
    os.rename(staged, path)
    wait_for("the rejection", lambda: server.stat("ratelimit.service.config_load_error") >= 1)
    error = server.service.holder.last_error or ""
    assert str(path) in error and reason in error
    assert codes(server.ask("app", [("user", "a")])) == ["OVER_LIMIT"]
    assert server.service.holder.version == 1
    path.unlink()
    wait_for("the error cleared", lambda: server.service.holder.last_error is None)


def test_files_removed_while_the_directory_is_read_never_unload_the_config(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """Files appearing and vanishing during reloads: every reload is all-or-nothing, so the
    service always has the good configuration, and ends with it."""
    config_dir.write("app.yaml", GOOD)
    server = make_server()
    stop = threading.Event()

    def churn() -> None:
        i = 0
        while not stop.is_set():
            path = config_dir.path / f"tmp{i % 5}.yaml"
            path.write_text(f"domain: t{i % 5}\ndescriptors: []\n")
            path.unlink()
            i += 1

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    try:
        deadline, n = time.monotonic() + 2, 0
        while time.monotonic() < deadline:
            n += 1
            response = server.ask("app", [("user", f"u{n}")], [("user", f"u{n}")])
            assert codes(response) == ["OK", "OVER_LIMIT"]
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join(5)
    wait_for(
        "the final reload",
        lambda: (
            sorted(server.service.holder.config.domains) == ["app"]  # type: ignore[union-attr]
            and server.service.holder.last_error is None
        ),
    )
