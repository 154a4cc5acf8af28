"""Each setting is declared once: the parser reads exactly the declared variables, every
variable read anywhere in the package is declared, every ``serve`` flag overrides its
variable, and the committed settings page is the one the declarations generate."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from ferryman.cli import serve as serve_cli
from ferryman.errors import SettingsError
from ferryman.settings import ACCEPTED_IGNORED, Settings
from ferryman.settings.declare import Setting
from ferryman.settings.kinds import (
    Address,
    Boolean,
    Choice,
    Integer,
    LogLevel,
    Port,
    SettingKind,
    Text,
)
from ferryman.settings.model import VARIABLES, declared, every_setting
from ferryman.settings.table import COMMAND, markdown

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "operators" / "settings.md"
PACKAGE = ROOT / "service" / "ferryman"
# Fields computed from several variables rather than read from one.
DERIVED = {
    "runtime_root",
    "redis_startup_wait",
    "statsd_explicit",
    "dog_statsd_mogrifier_env",
    "ignored",
}


def test_the_committed_page_is_the_generated_one() -> None:
    """docs/operators/settings.md is what the declarations generate today."""
    assert PAGE.read_text() == markdown(), f"the settings page is stale: run {COMMAND}"


def test_the_command_in_the_page_header_prints_the_page() -> None:
    """The command the page names prints exactly the generated page."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "service")}
    result = subprocess.run(
        [sys.executable, "-m", "ferryman.settings", "--markdown"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert result.stdout == markdown()
    assert COMMAND in result.stdout


def test_the_page_names_every_variable_and_flag_once() -> None:
    """Each declared variable is named in the first cell of one row, and each flag appears."""
    page = markdown()
    assert page.startswith("# Settings\n")
    first_cells = [line.split(" | ")[0] for line in page.splitlines() if line.startswith("| ")]
    for name in VARIABLES:
        assert sum(f"`{name}`" in cell for cell in first_cells) == 1, name
    for _, setting in declared():
        if setting.flag is not None:
            assert f"`{setting.flag.name}" in page


def test_every_variable_is_declared_once_and_every_field_is_declared_or_derived() -> None:
    """No variable has two declarations; a field without one is among the derived few."""
    names = [s.env for s in every_setting() if s.env]
    assert len(names) == len(set(names))
    undeclared = {f.name for f in dataclasses.fields(Settings)} - {n for n, _ in declared()}
    assert undeclared == DERIVED


class Recording(Mapping[str, str]):
    """An environment that notes every name looked up in it."""

    def __init__(self, values: dict[str, str]) -> None:
        self.known = values
        self.asked: set[str] = set()

    def __getitem__(self, name: str) -> str:
        self.asked.add(name)
        return self.known[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.known)

    def __len__(self) -> int:
        return len(self.known)


def test_from_env_reads_every_declared_variable_and_no_other() -> None:
    """Settings.from_env looks up each declared variable and nothing undeclared (those that
    another part reads, and the mogrifier families, excepted)."""
    env = Recording({})
    Settings.from_env(env)
    expected = {s.env for s in every_setting() if s.env and not s.read_by and "<" not in s.env}
    assert env.asked - expected == set(), "read but not declared"
    assert expected - env.asked == set(), "declared but not read"


def _is_environment(node: ast.expr) -> bool:
    """``os.environ``, ``environ``, or a mapping named ``env`` (the package's convention)."""
    if isinstance(node, ast.Attribute):
        return node.attr == "environ"
    return isinstance(node, ast.Name) and node.id in ("env", "environ")


def _read_keys(tree: ast.AST) -> Iterator[ast.expr]:
    """The key of every environment read: ``.get(K)``, ``[K]``, ``K in``, ``getenv(K)``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            if isinstance(func, ast.Attribute) and (
                func.attr == "getenv"
                or (func.attr in ("get", "pop", "setdefault") and _is_environment(func.value))
            ):
                yield node.args[0]
        elif isinstance(node, ast.Subscript) and _is_environment(node.value):
            yield node.slice
        elif (
            isinstance(node, ast.Compare)
            and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
            and any(_is_environment(c) for c in node.comparators)
        ):
            yield node.left


def _modules() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if "_proto" not in path.parts:
            yield path, ast.parse(path.read_text(), str(path))


def _constants() -> dict[str, str]:
    """Module-level ``NAME = "TEXT"`` assignments of the package, by name."""
    found: dict[str, str] = {}
    for _, module in _modules():
        for node in module.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                for target in node.targets:
                    if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                        found[target.id] = node.value.value
    return found


def _environment_reads() -> Iterator[tuple[Path, str | None, list[str]]]:
    """Each read as (module, the name when it is fixed, the fixed parts of a built name)."""
    constants = _constants()
    for path, module in _modules():
        for key in _read_keys(module):
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                yield path, key.value, []
            elif isinstance(key, ast.Name) and key.id in constants:
                yield path, constants[key.id], []
            else:
                parts = [
                    n.value
                    for n in ast.walk(key)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value
                ]
                yield path, None, parts


def test_every_variable_read_in_the_package_is_declared() -> None:
    """Every fixed name read from the environment in service/ferryman is declared; a name
    built at run time is read by the settings package from a declaration, or is one of a
    declared family (``DOG_STATSD_MOGRIFIER_<NAME>_PATTERN``)."""
    reads = list(_environment_reads())
    fixed = {name for _, name, _ in reads if name is not None}
    # The scan finds reads outside the settings package too (it can fail).
    assert {"GRPC_PORT", "DEBUG_PORT", "FERRYMAN_WORKER"} <= fixed
    assert sorted(fixed - set(VARIABLES)) == []
    settings_package = PACKAGE / "settings"
    for path, name, parts in reads:
        if name is not None:
            continue
        if parts:
            family = [n for n in VARIABLES if all(part in n for part in parts)]
            assert family, f"{path}: a variable built from {parts} is not declared"
        else:
            assert settings_package in path.parents, f"{path}: a variable read by no name"


def _sample(kind: SettingKind) -> tuple[str, str, object]:
    """A value for the variable, another for the flag, and what the flag's gives."""
    if isinstance(kind, Port):
        return "9001", "9002", 9002
    if isinstance(kind, Integer):
        return "2", "3", 3
    if isinstance(kind, Choice | LogLevel):
        first, last = kind.choices()[0], kind.choices()[-1]
        return first, last, last
    if isinstance(kind, Address):
        return "a:1", "b:2", "b:2"
    if isinstance(kind, Text):
        return "redis", "redis://flag:1", "redis://flag:1"
    raise AssertionError(f"add a sample for {type(kind).__name__} flags")


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve_cli.add_parser(parser.add_subparsers(), [])
    return parser.parse_args(["serve", *argv])


def _flagged() -> list[tuple[str, Setting]]:
    return [(n, s) for n, s in declared() if s.flag is not None and s.env]


@pytest.mark.parametrize(("name", "setting"), _flagged(), ids=[n for n, _ in _flagged()])
def test_every_flag_overrides_its_variable(
    name: str, setting: Setting, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``serve --FLAG`` wins over the variable it names; without it the variable holds."""
    assert setting.flag is not None
    for variable in VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    kind = setting.flag.kind or setting.kind
    if isinstance(kind, Boolean):
        monkeypatch.setenv(setting.env, "false")
        assert getattr(serve_cli._settings(_parse(setting.flag.name)), name) is True
        assert getattr(serve_cli._settings(_parse()), name) is False
        return
    from_env, from_flag, expected = _sample(kind)
    monkeypatch.setenv(setting.env, from_env)
    settings = serve_cli._settings(_parse(setting.flag.name, from_flag))
    if setting.flag.repeat:
        expected = (from_flag,)
    assert getattr(settings, name) == expected
    assert getattr(serve_cli._settings(_parse()), name) == setting.read(os.environ)


def test_config_flag_replaces_the_runtime_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--config DIR`` (a flag with no variable) wins over RUNTIME_ROOT and clears it."""
    monkeypatch.setenv("RUNTIME_ROOT", "/srv/elsewhere")
    settings = serve_cli._settings(_parse("--config", str(tmp_path)))
    assert (settings.config_dir, settings.runtime_root) == (tmp_path, None)
    assert serve_cli._settings(_parse()).runtime_root == Path("/srv/elsewhere")


def test_a_bad_flag_value_is_refused_as_its_variable_would_be() -> None:
    """A flag value checked by its setting's kind is a usage error with the same reason."""
    with pytest.raises(SystemExit):
        _parse("--workers", "0")
    with pytest.raises(SettingsError, match="WORKERS='0' must be at least 1"):
        Settings.from_env({"WORKERS": "0"})


def test_accepted_variables_are_only_the_ignored_ones() -> None:
    """Variables ferryman honours (the server TLS files, the Redis health check) are not
    reported as ignored; an ignored variable's impossible value is still refused."""
    honoured = {
        "GRPC_SERVER_USE_TLS": "true",
        "GRPC_SERVER_TLS_CERT": "c.pem",
        "GRPC_SERVER_TLS_KEY": "k.pem",
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION": "true",
    }
    settings = Settings.from_env(honoured)
    assert settings.ignored == ()
    assert settings.health_requires_backend
    assert not set(honoured) & set(ACCEPTED_IGNORED)
    with pytest.raises(SettingsError, match="MEMCACHE_MAX_IDLE_CONNS='many'"):
        Settings.from_env({"MEMCACHE_MAX_IDLE_CONNS": "many"})
