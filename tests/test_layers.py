"""The package's layout is its architecture: layers that import only downwards, no cycles, small rooms.

Layers, bottom up: the shared root (errors, identity, clock, ulid, metrics, sizes), `store`,
`processing` (the user's stream and its logic), `protocol`, then `dataplane`, `control` and
`table` side by side (none imports another), `ops`, and `cli` on top. The package's face
(`__init__`) may re-export. The development tools import each other in no cycle either, and no
module of ours (library, tools, benchmarks, Dagster code, tests) is over 500 lines, but for the
older ones listed in `STILL_LONG`, which may only shrink.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "laminar_orchestration"
ROOT = "laminar_orchestration"

#: A module's layer by its first path part under the package (a root module: its own name).
LAYERS: dict[str, int] = {
    "errors": 0,
    "identity": 0,
    "clock": 0,
    "ulid": 0,
    "metrics": 0,
    "sizes": 0,
    "store": 1,
    "processing": 2,
    "protocol": 3,
    "dataplane": 4,
    "control": 4,
    "table": 4,
    "ops": 5,
    "cli": 6,
}
MAX_ROOT_MODULES = 12
MAX_MODULE_LINES = 500
#: Modules still over the limit, at most as long as they are now: they may only shrink.
STILL_LONG: dict[str, int] = {
    "benchmarks/bench_cost.py": 592,
    "benchmarks/bench_foundation.py": 537,
    "benchmarks/bench_statestore.py": 791,
    "benchmarks/bench_table.py": 515,
    "benchmarks/runtime_state.py": 748,
    "laminar_dev/chaos/processes.py": 504,
    "laminar_dev/sim/invariants.py": 634,
    "laminar_dev/sim/node_actor.py": 636,
    "laminar_dev/sim/world.py": 558,
    "tests/control/test_placement.py": 573,
    "tests/dagster/test_sensors.py": 572,
    "tests/dataplane/test_standby.py": 654,
    "tests/protocol/test_cluster_epoch.py": 562,
    "tests/scenarios/test_least_privilege.py": 781,
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> set[str]:
    """Every module of the package `path` imports, at any depth of the file (a lazy import counts)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith(ROOT):
            found.add(node.module)
            for alias in node.names:  # `from laminar_orchestration.ops import sweep` imports a module
                candidate = f"{node.module}.{alias.name}"
                if (PACKAGE.parent / candidate.replace(".", "/")).with_suffix(".py").exists():
                    found.add(candidate)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith(ROOT + "."))
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            raise AssertionError(f"{path}: relative import; the package imports absolutely")
    return found


def _graph() -> dict[str, set[str]]:
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        graph[_module_name(path)] = {m for m in _imports(path) if m != ROOT}
    return graph


def test_every_module_sits_in_a_known_layer() -> None:
    rooms = {_room(m) for m in _graph()} - {"__init__", "__main__"}
    assert rooms <= set(LAYERS), rooms - set(LAYERS)


def test_no_module_imports_from_a_layer_above_or_beside_it() -> None:
    wrong = []
    for module, imported in _graph().items():
        room = _room(module)
        if room == "__init__":
            continue  # the package's face re-exports the public API
        for target in imported:
            other = _room(target)
            if other == room or LAYERS[other] == LAYERS[room] == 0:
                continue  # within a room, or between the shared root's modules
            if LAYERS[other] >= LAYERS[room]:
                wrong.append(f"{module} -> {target}")
    assert not wrong, "imports up or across the layers:\n" + "\n".join(sorted(wrong))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    seen: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        seen[module] = 1
        for target in sorted(graph.get(module, ())):
            if target not in graph:
                continue
            if seen.get(target) == 1:
                cycles.append([*path[path.index(target) :], target] if target in path else [module, target])
            elif target not in seen:
                visit(target, [*path, target])
        seen[module] = 2

    for module in sorted(graph):
        if module not in seen:
            visit(module, [module])
    return cycles


def test_the_modules_import_each_other_in_no_cycle() -> None:
    assert not _cycles(_graph())


def _dev_graph() -> dict[str, set[str]]:
    """The development tools' modules (simulator, chaos suite, local cluster) and what each imports of
    them, relative imports resolved, imports only a type checker reads included."""
    dev = PACKAGE.parent / "laminar_dev"
    modules = {_module_name(path) for path in dev.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in dev.rglob("*.py"):
        module = _module_name(path)
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # `from .x import y` in package P: P minus (level - 1) parts, then x
                    parts = package.split(".")
                    base = ".".join([*parts[: len(parts) - node.level + 1], *([base] if base else [])])
                # `from P import m` imports the module P.m when there is one, else names of P.
                found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("laminar_dev."))
        graph[module] = {m for m in found if m in modules and m != module}
    return graph


def test_the_development_tools_import_each_other_in_no_cycle() -> None:
    graph = _dev_graph()
    assert "laminar_dev.sim.invariants" in graph["laminar_dev.sim.world"]  # relative imports are read
    assert not _cycles(graph)


def test_the_package_root_keeps_only_what_every_layer_shares() -> None:
    modules = [p.name for p in PACKAGE.glob("*.py")]
    assert len(modules) <= MAX_ROOT_MODULES, modules


#: Everything of ours a newcomer reads: the library, the development tools, the benchmarks, the
#: Dagster code location and the tests.
OWN_CODE = ("laminar_orchestration", "laminar_dev", "benchmarks", "jobs", "sensors", "assets", "resources",
            "launcher", "tests")  # fmt: skip


def test_no_module_is_over_the_size_a_newcomer_can_read() -> None:
    repo = PACKAGE.parent
    paths = [p for folder in OWN_CODE for p in (repo / folder).rglob("*.py")] + [repo / "definitions.py"]
    sizes = {str(p.relative_to(repo)): len(p.read_text().splitlines()) for p in paths}
    assert len(sizes) > 250 and "laminar_orchestration/dataplane/worker.py" in sizes
    long = {m: n for m, n in sizes.items() if n > STILL_LONG.get(m, MAX_MODULE_LINES)}
    assert not long, long


def test_every_layer_says_what_lives_there_and_what_it_may_import() -> None:
    for room in ("store", "protocol", "dataplane", "control", "table", "ops", "cli"):
        doc = ast.get_docstring(ast.parse((PACKAGE / room / "__init__.py").read_text()))
        assert doc, room
