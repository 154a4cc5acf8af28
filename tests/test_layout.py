"""The package's shape: its parts import each other in one direction only."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "service" / "ferryman"


def _part(module: str) -> str | None:
    """The part of the package a module belongs to: ``ferryman.core.answers`` -> ``engine``."""
    names = module.split(".")
    if names[0] != "ferryman":
        return None
    return names[1] if len(names) > 1 else "ferryman"


def import_graph() -> dict[str, set[str]]:
    """Part -> the other parts it imports (at any depth: function-level imports count)."""
    edges: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        if "_proto" in rel.parts:
            continue
        parts = rel.parts[:-1] if rel.parts[-1] == "__init__" else rel.parts
        source = _part(".".join(parts))
        assert source is not None
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules = [node.module]
                if node.module == "ferryman":
                    modules = [f"ferryman.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            for module in modules:
                target = _part(module)
                if target is not None and target != source:
                    edges[source].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle found by a depth-first walk, each as the parts along it."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    return found


def test_cycle_finder_finds_a_planted_cycle() -> None:
    """The checker itself: a graph with a cycle is reported, one without is not."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b", "c"}, "b": {"c"}}) == []


def test_no_import_cycle_between_the_parts_of_the_package() -> None:
    """No part of ferryman imports, directly or not, a part that imports it back."""
    edges = import_graph()
    assert "engine" in edges and "algorithms" in edges["engine"]  # the graph was read
    assert cycles(edges) == []


def test_algorithms_and_connections_sit_below_engine_backends_and_server() -> None:
    """The algorithms know nothing of the engine, the backends, the config or the server:
    only the shared core (rules, answers, keys, the Algorithm protocol) and the leaves."""
    edges = import_graph()
    assert edges["algorithms"] <= {"clock", "connections", "core", "errors", "stats", "tasks"}
    assert edges["core"] <= {"clock", "durations", "errors", "stats"}
    assert not edges.get("clock") and not edges.get("tasks")  # the leaves import nothing
    assert edges["connections"] <= {"errors"}
    assert not edges["engine"] & {"server", "apis", "edge", "telemetry"}


def test_the_process_sits_on_the_apis_and_the_apis_on_the_edge() -> None:
    """The transport knows no protocol, and no protocol knows the process that wires them."""
    edges = import_graph()
    assert "apis" in edges["server"] and "edge" in edges["apis"]  # the graph was read
    assert not edges["edge"] & {"apis", "server", "engine", "config", "backends", "algorithms"}
    assert "server" not in edges["apis"]


def test_pure_parts_import_without_grpc_or_the_client() -> None:
    """Config, algorithms and the engine load without grpc; ``ferryman.Client`` still works."""
    code = (
        "import sys\n"
        "import ferryman, ferryman.config, ferryman.engine, ferryman.algorithms.burst.model\n"
        "assert 'grpc' not in sys.modules and 'ferryman.client' not in sys.modules\n"
        "assert ferryman.Client.__name__ == 'Client'\n"
        "assert 'grpc' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def _envoy_import_sites(path: Path) -> list[str]:
    """The functions of a module that import ``ferryman.envoy`` ("" for the module level)."""
    sites: list[str] = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, child.name)
                continue
            names: list[str] = []
            if isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                names = [child.module] + [f"{child.module}.{a.name}" for a in child.names]
            elif isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            if any(n == "ferryman.envoy" or n.startswith("ferryman.envoy.") for n in names):
                sites.append(function)
            visit(child, function)

    visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return sites


def test_envoy_import_sites_are_found_at_any_depth(tmp_path: Path) -> None:
    """The checker itself: a module-level import, one in a function, one under a branch."""
    source = (
        "import ferryman.envoy.read\n"
        "def f():\n    if x:\n        from ferryman.envoy.routes import Routes\n"
        "def g():\n    from ferryman import envoy\n    import ferryman.engine\n"
    )
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert _envoy_import_sites(path) == ["", "f", "g"]


def test_only_the_command_line_and_one_server_function_import_the_envoy_tools() -> None:
    """``ferryman.envoy`` (and envoy-data-plane, an optional extra) stays out of the service:
    the command line uses it; in the APIs, only the function that reads ENVOY_CONFIG_FILES
    at start, and only when the setting is given. Importing the server loads none of it."""
    edges = import_graph()
    assert sorted(part for part, targets in edges.items() if "envoy" in targets) == [
        "apis",
        "cli",
    ]
    sites = {
        str(path.relative_to(PACKAGE)): found
        for path in (PACKAGE / "apis").rglob("*.py")
        if (found := _envoy_import_sites(path))
    }
    assert list(sites) == ["apis/envoy_routes.py"], sites
    assert set(sites["apis/envoy_routes.py"]) == {"read_routes"}, sites
    code = (
        "import sys\n"
        "import ferryman.cli, ferryman.server.app\n"
        "from ferryman.apis.envoy_routes import read_routes\n"
        "assert read_routes(()) is None\n"
        "names = ('envoy_data_plane', 'ferryman.envoy')\n"
        "assert not [m for m in sys.modules if m.startswith(names)]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def _long_functions(root: Path, most: int) -> list[str]:
    """Every function under ``root`` longer than ``most`` lines (from ``def`` to its end)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > most:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} {lines}")
    return found


def test_long_function_finder_finds_a_planted_one(tmp_path: Path) -> None:
    """The checker itself: a function of 4 lines is over 3, one of 3 is not."""
    (tmp_path / "probe.py").write_text("def f():\n    a = 1\n    b = 2\n    return a + b\n")
    assert len(_long_functions(tmp_path, 3)) == 1 and _long_functions(tmp_path, 4) == []


def test_no_function_of_the_server_edge_or_apis_is_over_60_lines() -> None:
    """The wiring, the transport and the protocols read one screen per function."""
    for part in ("server", "edge", "apis"):
        assert _long_functions(PACKAGE / part, 60) == [], part
