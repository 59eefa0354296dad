"""What gets installed, and how the library's modules import each other.

The wheel holds the library only: the chaos suite, the local cluster, the
fault-injecting store and the moto server are development tooling
(`laminar_dev`), run from a checkout. Library modules import each other
without cycles, deferred imports included (a deferred import only hides a
cycle until the function runs).
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LIBRARY = "laminar_orchestration"

#: Cycles allowed between library modules, each with what removes it (none today). The test fails on
#: any other cycle, and once a listed one is gone (so it is deleted here).
KNOWN_CYCLES: dict[frozenset[str], str] = {}


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: module level and deferred (in functions), not under TYPE_CHECKING."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for branch in node.orelse:
                visit(branch)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph() -> dict[str, set[str]]:
    """Library module -> the library modules it imports at run time (package parents left out)."""
    files = {_module_name(f): f for f in (REPO / LIBRARY).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps: set[str] = set()
        for node in _runtime_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    target = ".".join([*base, node.module] if node.module else base)
                else:
                    target = node.module or ""
                candidates = [f"{target}.{alias.name}" for alias in node.names] + [target]
            else:
                candidates = [alias.name for alias in node.names]
            for candidate in candidates:
                if candidate in files and candidate != name and not (package + ".").startswith(candidate + "."):
                    deps.add(candidate)
                    break
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def test_library_modules_import_no_cycle_at_run_time() -> None:
    graph = import_graph()
    found = cycles(graph)
    unknown = [sorted(c) for c in found if c not in KNOWN_CYCLES]
    assert not unknown, f"import cycles between library modules: {unknown}"
    gone = [sorted(c) for c in KNOWN_CYCLES if c not in found]
    assert not gone, f"no longer a cycle, delete it from KNOWN_CYCLES: {gone}"
    # The command line sits on top: nothing in the library imports it (the demo used to, for `verify`).
    importers = sorted(
        m for m, deps in graph.items() if f"{LIBRARY}.cli" in deps and not m.startswith(f"{LIBRARY}.cli")
    )
    assert not importers, f"library modules importing the CLI: {importers}"
    assert not any(f"{LIBRARY}.cli" in c or f"{LIBRARY}.demo" in c for c in found)


def test_the_graph_sees_deferred_imports(tmp_path: Path) -> None:
    # The checker itself: a cycle closed only by an import inside a function is still a cycle.
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [frozenset({"a", "b"})]
    tree = ast.parse("def f():\n    from . import x\nif TYPE_CHECKING:\n    import y\n")
    assert [type(n).__name__ for n in _runtime_imports(tree)] == ["ImportFrom"]


def test_no_library_module_imports_the_development_package() -> None:
    for path in (REPO / LIBRARY).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            assert not any(n.split(".")[0] == "laminar_dev" for n in names), f"{path} imports laminar_dev"


@pytest.mark.processes
@pytest.mark.slow
def test_the_wheel_holds_the_library_and_no_test_harness(tmp_path: Path) -> None:
    # Built from a copy, so the build's own directories never land in the checkout.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in (LIBRARY, "laminar_dev", "tests", "benchmarks"):
        shutil.copytree(REPO / package, src / package, ignore=ignore)
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        # As `pip install .` does it: pyproject's build backend in an isolated environment.
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    [wheel] = wheels.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {LIBRARY, next(t for t in tops if t.endswith(".dist-info"))}, tops
    for harness in ("laminar_dev", "chaos", "localcluster", "faults", "s3server", "conftest"):
        assert not [n for n in names if harness in n], f"{harness} is in the wheel"
    assert f"{LIBRARY}/cli/__main__.py" in names and f"{LIBRARY}/py.typed" in names
