"""The command line as an operator meets it: --version, and one or two lines with exit 2 for
every operator mistake (bad flag, bad variable, port in use, missing config directory)."""

from __future__ import annotations

import json
import os
import pty
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

from helpers.server import ConfigDir, ServerFactory

CONFIG = (
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"
)
FREE_PORTS = ("--grpc-port", "0", "--http-port", "0", "--debug-port", "0")


def ferryman(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``python -m ferryman ARGS`` with none of the service's variables but those in ``env``."""
    full = {"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1"}
    if "PYTHONPATH" in os.environ:  # import the same ferryman as this test process
        full["PYTHONPATH"] = os.environ["PYTHONPATH"]
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "ferryman", *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A directory holding descriptors/ with one valid domain."""
    (tmp_path / "descriptors").mkdir()
    (tmp_path / "descriptors" / "d.yaml").write_text(CONFIG)
    return tmp_path


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port some other process listens on."""
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen()
        yield sock.getsockname()[1]


def assert_short_error(result: subprocess.CompletedProcess[str], *parts: str) -> None:
    """Exit 2, no traceback, at most two lines of message, and every part in it."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [ln for ln in result.stderr.splitlines() if not ln.startswith(("usage:", "   "))]
    assert 1 <= len(lines) <= 2, result.stderr
    for part in parts:
        assert part in result.stderr


def test_version_prints_the_package_version(tmp_path: Path) -> None:
    """`ferryman --version` prints the installed version and exits 0."""
    result = ferryman("--version", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[:2] == ["ferryman", version("ferryman")]


@pytest.mark.parametrize("flag", ["--grpc-port", "--http-port", "--debug-port"])
@pytest.mark.parametrize("value", ["abc", "70000", "-1"])
def test_a_bad_port_flag_is_a_usage_error(flag: str, value: str, workdir: Path) -> None:
    """A port flag that is not 0-65535 exits 2 naming the flag."""
    result = ferryman("serve", flag, value, cwd=workdir)
    assert_short_error(result, flag, "not a port number")


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("GRPC_PORT", "abc", "GRPC_PORT='abc' is not a port number"),
        ("PORT", "99999", "PORT='99999' is not a port number"),
        ("SHADOW_MODE", "maybe", "SHADOW_MODE='maybe' is not a boolean"),
        ("LOG_LEVEL", "loud", "LOG_LEVEL='loud' is not a log level"),
        ("LOG_FORMAT", "xml", "must be text or json"),
    ],
)
def test_a_bad_variable_is_a_usage_error(name: str, value: str, says: str, workdir: Path) -> None:
    """An environment variable with a bad value exits 2 in two lines that name it."""
    result = ferryman("serve", *FREE_PORTS, cwd=workdir, env={name: value})
    assert_short_error(result, says, "environment variable")


@pytest.mark.parametrize(
    ("env", "says"),
    [
        (
            {"REDIS_URL": "redis://cache:6379"},
            "REDIS_URL='redis://cache:6379' is a URL",
        ),
        (
            {"BACKEND_TYPE": "redis", "REDIS_URL": "cache:6379"},
            "set REDIS_SOCKET_TYPE=tcp",
        ),
        (
            {"REDIS_URL": "cache:6379", "REDIS_SOCKET_TYPE": "udp"},
            "REDIS_SOCKET_TYPE='udp' must be unix or tcp",
        ),
    ],
)
def test_redis_url_in_the_wrong_form_says_which_form(
    env: dict[str, str], says: str, workdir: Path
) -> None:
    """REDIS_URL given as a URL, or as host:port on a unix socket type, exits 2 with the fix."""
    result = ferryman("serve", *FREE_PORTS, cwd=workdir, env=env)
    assert_short_error(result, says)


@pytest.mark.parametrize(
    ("flag", "names"),
    [
        ("--grpc-port", "GRPC_PORT / --grpc-port"),
        ("--http-port", "PORT / --http-port"),
        ("--debug-port", "DEBUG_PORT / --debug-port"),
    ],
)
def test_a_port_in_use_is_one_line_and_exit_2(
    flag: str, names: str, busy_port: int, workdir: Path
) -> None:
    """A port another process holds: one line naming the port and its setting, exit 2,
    before any configuration is loaded."""
    ports = dict(zip(FREE_PORTS[::2], FREE_PORTS[1::2], strict=True))
    ports[flag] = str(busy_port)
    args = [x for pair in ports.items() for x in pair]
    result = ferryman("serve", *args, cwd=workdir)
    assert_short_error(result, f":{busy_port} ({names}): already in use")
    assert "config loaded" not in result.stderr


def test_debug_adds_the_traceback(busy_port: int, workdir: Path) -> None:
    """With --debug the same mistake also prints its traceback."""
    result = ferryman("--debug", "serve", "--grpc-port", str(busy_port), cwd=workdir)
    assert result.returncode == 2
    assert "Traceback" in result.stderr
    assert "already in use" in result.stderr


def test_serve_without_descriptors_here_names_the_default_and_the_fix(tmp_path: Path) -> None:
    """`ferryman serve` where there is no descriptors/ says where it looked and what to do."""
    result = ferryman("serve", *FREE_PORTS, cwd=tmp_path)
    assert_short_error(result, f"{tmp_path}/descriptors does not exist", "--config DIR")


def test_serve_with_a_config_path_that_is_a_file_exits_2(tmp_path: Path) -> None:
    """--config naming a file, not a directory, exits 2 naming it."""
    target = tmp_path / "limits.yaml"
    target.write_text(CONFIG)
    result = ferryman("serve", "--config", str(target), *FREE_PORTS, cwd=tmp_path)
    assert_short_error(result, f"{target} is not a directory", "--config")


def test_runtime_variables_are_named_when_their_directory_is_missing(tmp_path: Path) -> None:
    """With RUNTIME_ROOT set, a missing directory names the RUNTIME_* variables."""
    env = {"RUNTIME_ROOT": str(tmp_path / "nowhere")}
    result = ferryman("serve", *FREE_PORTS, cwd=tmp_path, env=env)
    assert_short_error(result, "does not exist", "RUNTIME_ROOT")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every directory")
def test_an_unreadable_config_directory_exits_2(tmp_path: Path) -> None:
    """A config directory this user may not read exits 2 saying so."""
    locked = tmp_path / "locked"
    locked.mkdir(mode=0)
    try:
        result = ferryman("serve", "--config", str(locked), *FREE_PORTS, cwd=tmp_path)
    finally:
        locked.chmod(0o700)
    assert_short_error(result, "cannot be read")


# --------------------------------------------------------------------------- help, formats


@pytest.mark.parametrize("command", ["serve", "check", "query", "completion"])
def test_every_command_has_help_with_an_example(command: str, tmp_path: Path) -> None:
    """`ferryman COMMAND --help` exits 0 and shows at least one example of the command."""
    result = ferryman(command, "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    examples = result.stdout.split("examples:\n", 1)[1]
    assert f"  ferryman {command} " in examples or f"(ferryman {command} " in examples


def test_check_format_json_lists_domains_and_limits(workdir: Path) -> None:
    """`check --format json` prints one JSON document with the domains and their limits."""
    result = ferryman("check", "--format", "json", "descriptors", cwd=workdir)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True
    [domain] = report["domains"]
    assert (domain["name"], domain["files"]) == ("d", ["descriptors/d.yaml"])
    assert domain["limits"] == [
        {
            "key": "d.k",
            "limit": "5/minute",
            "name": None,
            "shadow_mode": False,
            "quota_mode": False,
            "max_wait": None,
        }
    ]


def test_check_format_json_reports_errors_with_their_place(tmp_path: Path) -> None:
    """`check --format json` on a bad directory: each error with file, line and path, exit 1."""
    (tmp_path / "x.yaml").write_text("domain: x\ndescriptors:\n  - key: a\n    ratelimit: {}\n")
    result = ferryman("check", "--format", "json", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["ok"] is False
    [error] = report["errors"]
    assert (error["file"], error["line"], error["path"]) == (
        str(tmp_path / "x.yaml"),
        4,
        "descriptors[0].ratelimit",
    )
    assert "unknown key 'ratelimit'" in error["message"]


def test_query_format_json_gives_the_answer_and_exit_status(
    config_dir: ConfigDir, make_server: ServerFactory, tmp_path: Path
) -> None:
    """`query --format json` prints the overall code and each descriptor's limit and
    remaining as JSON, exit 0 while OK and 1 once over the limit."""
    config_dir.write("d.yaml", CONFIG)
    server = make_server()
    target = f"127.0.0.1:{server.service.grpc_port}"
    args = ("query", "--target", target, "--domain", "d", "--descriptor", "k=v", "--hits", "3")
    first = ferryman(*args, "--format", "json", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    answer = json.loads(first.stdout)
    assert answer["overall"] == "OK"
    [status] = answer["descriptors"]
    assert status["entries"] == [["k", "v"]]
    assert status["limit"] == {"requests_per_unit": 5, "unit": "minute", "name": None}
    assert status["remaining"] == 2
    second = ferryman(*args, "--format", "json", cwd=tmp_path)
    assert second.returncode == 1
    assert json.loads(second.stdout)["overall"] == "OVER_LIMIT"


# --------------------------------------------------------------------------- progress


def test_check_shows_progress_on_a_terminal_only(workdir: Path) -> None:
    """`check` writes its progress to stderr when it is a terminal, nothing when piped."""
    piped = ferryman("check", "descriptors", cwd=workdir)
    assert piped.returncode == 0
    assert piped.stderr == ""
    main, secondary = pty.openpty()
    env = {"PATH": os.environ.get("PATH", "")}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    try:
        on_tty = subprocess.run(
            [sys.executable, "-m", "ferryman", "check", "descriptors"],
            cwd=workdir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=secondary,
            text=True,
            timeout=60,
            check=False,
        )
        os.close(secondary)
        shown = b""
        while True:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # the terminal is closed once everything has been read
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(main)
    assert on_tty.returncode == 0
    assert b"validating 1 file(s) of descriptors" in shown
    assert on_tty.stdout == piped.stdout  # the result itself is the same


# --------------------------------------------------------------------------- completion


def complete(script: str, *words: str, cwd: Path | None = None) -> list[str]:
    """What the bash completion offers after ``ferryman WORDS`` (the last word is partial)."""
    line = " ".join(["ferryman", *words])
    program = (
        f"{script}\n"
        f"COMP_WORDS=(ferryman {' '.join(repr(w) for w in words)})\n"
        f"COMP_CWORD={len(words)}\n"
        f"COMP_LINE={line!r}\n"
        "_ferryman\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    result = subprocess.run(
        ["bash", "-c", program], cwd=cwd, capture_output=True, text=True, timeout=30, check=True
    )
    return result.stdout.split()


def test_bash_completion_offers_commands_options_and_values(workdir: Path) -> None:
    """`ferryman completion bash` completes commands, each command's options, choices and
    directories."""
    result = ferryman("completion", "bash", cwd=workdir)
    assert result.returncode == 0
    script = result.stdout
    commands = [
        "serve",
        "check",
        "query",
        "explain",
        "envoy",
        "replay",
        "simulate",
        "completion",
        "config",
    ]
    assert complete(script, "") == [*commands, "--version", "--help", "--debug"]
    assert complete(script, "se") == ["serve"]
    assert "--grpc-port" in complete(script, "serve", "--")
    assert complete(script, "serve", "--log-level", "") == ["debug", "info", "warn", "error"]
    assert complete(script, "query", "--format", "j") == ["json"]
    assert complete(script, "completion", "") == ["--help", "--debug", "bash", "zsh"]
    assert complete(script, "envoy", "") == ["--help", "--debug", "check", "generate"]
    assert complete(script, "check", "desc", cwd=workdir) == ["descriptors"]


def test_zsh_completion_wraps_the_same_function(tmp_path: Path) -> None:
    """`ferryman completion zsh` is a #compdef file that loads bash completion in zsh."""
    result = ferryman("completion", "zsh", cwd=tmp_path)
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[0] == "#compdef ferryman"
    assert "bashcompinit" in lines[1]
    assert "complete -F _ferryman ferryman" in lines
    if shutil.which("zsh"):
        syntax = subprocess.run(["zsh", "-n"], input=result.stdout, text=True, check=False)
        assert syntax.returncode == 0
