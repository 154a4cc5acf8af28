"""Hot reload: each way a config directory changes takes effect, bad files never do."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

from ferryman.config.reloader import ConfigHolder, Reloader
from ferryman.stats import Stats

from helpers.configmap import configmap_volume
from helpers.server import ConfigDir, Server, ServerFactory, codes

# The reloader also polls every 5 s; a change seen within this bound came from the watch.
WATCH_DEADLINE = 2.0


def rule(limit: int, key: str = "user") -> str:
    return (
        f"domain: app\ndescriptors:\n  - key: {key}\n"
        f"    rate_limit: {{unit: day, requests_per_unit: {limit}}}\n"
    )


def wait_for(predicate: Callable[[], bool], deadline: float = WATCH_DEADLINE) -> float:
    start = time.monotonic()
    while time.monotonic() - start < deadline:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.01)
    raise AssertionError(f"condition not met within {deadline} s")


def limit_now(server: Server, key: str = "user") -> int | None:
    response = server.ask("app", [(key, "probe")])
    status = response.statuses[0]
    return status.current_limit.requests_per_unit if status.HasField("current_limit") else None


def test_editing_a_file_in_place_reloads(config_dir: ConfigDir, make_server: ServerFactory) -> None:
    """Rewriting a file's content changes the limit in force."""
    config_dir.write("app.yaml", rule(3))
    server = make_server()
    assert limit_now(server) == 3
    config_dir.write("app.yaml", rule(7))
    wait_for(lambda: limit_now(server) == 7)
    assert server.stat("ratelimit.service.config_load_success") == 2


def test_new_and_deleted_files_reload(config_dir: ConfigDir, make_server: ServerFactory) -> None:
    """A new file adds its domain; deleting it removes the domain again."""
    config_dir.write("app.yaml", rule(3))
    server = make_server()
    extra = config_dir.write("other.yaml", rule(1, key="k").replace("domain: app", "domain: other"))

    def other_limited() -> bool:
        return server.ask("other", [("k", "v")]).statuses[0].HasField("current_limit")

    wait_for(other_limited)
    extra.unlink()
    wait_for(lambda: not other_limited())


def test_atomic_rename_over_a_file_reloads(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """Writing a temp file and renaming it over the config (as editors do) reloads."""
    target = config_dir.write("app.yaml", rule(3))
    server = make_server()
    tmp = config_dir.path / ".app.yaml.swp"
    tmp.write_text(rule(11))
    os.replace(tmp, target)
    wait_for(lambda: limit_now(server) == 11)


def test_configmap_data_symlink_swap_reloads_once(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """A ConfigMap update (..data swapped to a new timestamped dir) reloads, not double-loads."""
    configmap_volume(config_dir.path, {"app.yaml": rule(3)}, "2026_11_21_01")
    server = make_server()
    assert limit_now(server) == 3
    configmap_volume(config_dir.path, {"app.yaml": rule(13)}, "2026_11_21_02")
    wait_for(lambda: limit_now(server) == 13)
    assert server.stat("ratelimit.service.config_load_error") == 0


def test_runtime_root_symlink_swap_reloads(tmp_path: Path, make_server: ServerFactory) -> None:
    """RUNTIME_WATCH_ROOT: swapping the runtime root symlink to a new tree reloads."""
    for version, limit in (("v1", 3), ("v2", 17)):
        (tmp_path / version / "config").mkdir(parents=True)
        (tmp_path / version / "config" / "app.yaml").write_text(rule(limit))
    root = tmp_path / "current"
    root.symlink_to("v1")
    server = make_server(config_dir=root / "config", runtime_root=root, watch_root=True)
    assert limit_now(server) == 3
    (tmp_path / "next").symlink_to("v2")
    os.replace(tmp_path / "next", root)
    wait_for(lambda: limit_now(server) == 17)


def test_bad_file_keeps_last_good_config_and_is_counted(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """An invalid edit is rejected and counted; the old limits stay; a fix then loads."""
    config_dir.write("app.yaml", rule(3))
    server = make_server()
    config_dir.write("app.yaml", rule(3).replace("rate_limit", "ratelimit"))
    wait_for(lambda: server.stat("ratelimit.service.config_load_error") == 1)
    assert limit_now(server) == 3
    last_error = server.service.holder.last_error or ""
    assert "app.yaml:4" in last_error
    assert "ratelimit" in last_error
    config_dir.write("app.yaml", rule(5))
    wait_for(lambda: limit_now(server) == 5)
    assert server.service.holder.last_error is None


def test_bad_file_in_a_second_file_rejects_the_whole_reload(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """Loading is all-or-nothing: a good edit next to a bad new file does not apply."""
    config_dir.write("app.yaml", rule(3))
    server = make_server()
    config_dir.write("broken.yaml", "domain: [unclosed\n")
    config_dir.write("app.yaml", rule(9))
    wait_for(lambda: server.stat("ratelimit.service.config_load_error") >= 1)
    time.sleep(0.2)
    assert limit_now(server) == 3


def test_dotfiles_are_ignored(config_dir: ConfigDir, make_server: ServerFactory) -> None:
    """A hidden file, even an invalid one, neither loads nor fails a reload."""
    config_dir.write("app.yaml", rule(3))
    server = make_server()
    config_dir.write(".scratch.yaml", "not: [valid")
    config_dir.write("app.yaml", rule(4))
    wait_for(lambda: limit_now(server) == 4)
    assert server.stat("ratelimit.service.config_load_error") == 0


def test_counters_survive_a_reload_that_changes_the_numbers(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """A limit's identity is its key path: raising 3/day to 5/day keeps the hits counted."""
    config_dir.write("app.yaml", rule(3))
    server = make_server()
    server.ask("app", [("user", "alice")], hits=3)
    assert codes(server.ask("app", [("user", "alice")])) == ["OVER_LIMIT"]
    config_dir.write("app.yaml", rule(5))
    wait_for(lambda: limit_now(server) == 5)
    # 3 + 1 (the rejected hit, counted as the reference does) = 4 used; one left.
    response = server.ask("app", [("user", "alice")])
    assert codes(response) == ["OK"]
    assert response.statuses[0].limit_remaining == 0


def test_a_stop_that_comes_as_a_change_arrives_ends_the_watch(tmp_path: Path) -> None:
    """A change and the stop that reach the watch loop together end it: the change does not
    swallow the cancellation (as asyncio.wait_for can on Python 3.11), so stop() returns."""

    async def change_then_stop() -> None:
        directory = tmp_path / "config"
        directory.mkdir(exist_ok=True)
        (directory / "d.yaml").write_text(rule(5))
        reloader = Reloader(directory, ConfigHolder(), Stats(), poll_interval=60)
        reloader.load()
        await reloader.start()
        await asyncio.sleep(0.05)  # the loop waits for a change
        reloader.notify()
        await asyncio.sleep(0)  # the change wakes the loop's wait; the stop comes next
        async with asyncio.timeout(5):
            await reloader.stop()

    for _ in range(3):
        asyncio.run(change_then_stop())
