"""The rule kinds are plug-ins: each is one package under ``algorithms/``, registered once,
and named by at most two modules outside its package (the registry and one more); no
function of the package is longer than 60 lines."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import ferryman.algorithms as registry
from ferryman.algorithms import ALGORITHMS
from ferryman.core.algorithm import Algorithm

PACKAGE = Path(__file__).resolve().parents[1] / "service" / "ferryman"
ALGORITHMS_DIR = PACKAGE / "algorithms"
LONGEST = 60


def _sources() -> dict[Path, str]:
    return {
        path: path.read_text(encoding="utf-8")
        for path in PACKAGE.rglob("*.py")
        if "_proto" not in path.relative_to(PACKAGE).parts
    }


def package_of(algorithm: Algorithm) -> Path:
    """The folder of the package that defines ``algorithm``."""
    module = type(algorithm).__module__
    assert module.startswith("ferryman.algorithms."), module
    return ALGORITHMS_DIR / module.split(".")[2]


def names_of(algorithm: Algorithm) -> list[re.Pattern[str]]:
    """What names a kind from outside its package: its registered object's name, its
    package's face (the package, its spec and its limiter) imported, or a class that face
    defines. Its model and stores are not its face: another protocol may share them (the
    quota service shares the token bucket's)."""
    folder = package_of(algorithm)
    dotted = f"ferryman.algorithms.{folder.name}"
    classes = {name for name, value in vars(registry).items() if value is algorithm}
    for face in ("__init__.py", "spec.py", "limiter.py"):
        path = folder / face
        if path.exists():
            tree = ast.parse(path.read_text(encoding="utf-8"))
            classes |= {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    classes.discard("COUNTERS")  # the registry's role for a kind, not the kind's own name
    patterns = [re.compile(rf"\b{re.escape(dotted)}(\.spec|\.limiter)?\b(?!\.)")]
    patterns += [re.compile(rf"\b{re.escape(name)}\b") for name in sorted(classes)]
    return patterns


def naming_modules(algorithm: Algorithm, sources: dict[Path, str]) -> list[str]:
    folder = package_of(algorithm)
    patterns = names_of(algorithm)
    return sorted(
        str(path.relative_to(PACKAGE))
        for path, text in sources.items()
        if folder not in path.parents and any(p.search(text) for p in patterns)
    )


def test_the_checker_sees_a_kind_named_outside_its_package() -> None:
    """The checker itself: the registry names every kind, and a module that imports a
    kind's spec is found."""
    sources = _sources()
    for algorithm in ALGORITHMS:
        assert "algorithms/__init__.py" in naming_modules(algorithm, sources)
    planted = {PACKAGE / "engine" / "x.py": "from ferryman.algorithms.burst.spec import read\n"}
    burst = next(a for a in ALGORITHMS if package_of(a).name == "burst")
    assert naming_modules(burst, planted) == ["engine/x.py"]
    fixed = next(a for a in ALGORITHMS if package_of(a).name == "fixed_window")
    model = {PACKAGE / "x.py": "from ferryman.algorithms.fixed_window.model import CounterOp\n"}
    assert naming_modules(fixed, model) == []


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda a: a.name)
def test_a_kind_is_named_by_the_registry_and_one_more_module_at_most(
    algorithm: Algorithm,
) -> None:
    """Outside its package a kind is named by the registry and at most one other module
    (the API that speaks of it by name), so that adding a kind is its package plus one
    registry line."""
    outside = naming_modules(algorithm, _sources())
    assert len(outside) <= 2, outside


def test_every_kind_is_one_package_with_its_algorithm() -> None:
    """Each registered kind lives in its own package under algorithms/, with a spec and a
    limiter, and kinds do not share a package."""
    folders = [package_of(a) for a in ALGORITHMS]
    assert len(set(folders)) == len(folders)
    for folder in folders:
        assert (folder / "spec.py").exists() and (folder / "limiter.py").exists(), folder


def long_functions(sources: dict[Path, str]) -> list[str]:
    """Every function longer than LONGEST lines, as ``path:name (lines)``."""
    out = []
    for path, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > LONGEST:
                    out.append(f"{path.relative_to(PACKAGE)}:{node.name} ({lines})")
    return sorted(out)


def test_the_length_checker_sees_a_long_function() -> None:
    """The checker itself: a 61-line function is reported, a 60-line one is not."""
    body = "".join(f"    x{i} = {i}\n" for i in range(60))
    long = {PACKAGE / "x.py": "def f() -> None:\n" + body}
    short = {PACKAGE / "x.py": "def f() -> None:\n" + body[: body.rindex("    x59")]}
    assert long_functions(long) == ["x.py:f (61)"]
    assert long_functions(short) == []


def test_no_function_is_longer_than_sixty_lines() -> None:
    """No function of the package (generated code under _proto/ aside) is over 60 lines."""
    assert long_functions(_sources()) == []


def test_every_kind_names_its_stats_and_the_metrics_serve_them() -> None:
    """Each kind's own per-rule stats have help text and are served as metrics families,
    beside the stats every rule counts."""
    from ferryman.stats import RULE_STATS
    from ferryman.telemetry.instruments import RULE_HELP, STATS_COUNTER_FAMILIES

    for algorithm in ALGORITHMS:
        for stat, help_text in algorithm.stats.items():
            assert stat not in RULE_STATS and help_text
            assert RULE_HELP[stat] == help_text
            assert f"ratelimit_service_rate_limit_{stat}" in STATS_COUNTER_FAMILIES
    assert set(RULE_STATS) <= set(RULE_HELP)
    assert "served_with_wait" in RULE_HELP  # a bucket node's waits are served too
