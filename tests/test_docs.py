"""The docs say what the code is: every backticked reference to a name in one of our modules resolves,
and `docs/design.md`'s code layout is the one the layers' own docstrings give (each layer's
``__init__`` and each module's first sentence). `python -m tests.test_docs` prints that layout.
"""

from __future__ import annotations

import ast
import functools
import re
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "laminar_orchestration"
#: The layers the layout shows, bottom up.
LAYERS = ("store", "processing", "protocol", "dataplane", "control", "table", "ops", "cli")
#: The layout's columns: names, then summaries up to this width.
NAME_WIDTH = 18
LAYOUT_WIDTH = 110
#: Where docstrings are read: the package and the Dagster code location.
SOURCES = ("laminar_orchestration", "jobs", "resources", "sensors", "assets", "launcher")
#: A backticked dotted name: `chain_writes.ChainSealer`, `dataplane.node.Node.run`, `store.open_store()`.
REFERENCE = re.compile(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(\))?`")


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _summary(path: Path) -> str:
    """The first sentence of a module's docstring, on one line."""
    doc = ast.get_docstring(_tree(path)) or ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    match = re.match(r"(.+?\.)(?:\s|$)", paragraph)
    return (match.group(1) if match else paragraph).rstrip(".")


def _entry(indent: int, name: str, summary: str) -> list[str]:
    """`name` and its summary in the layout's two columns, the summary wrapped at `LAYOUT_WIDTH`."""
    column = " " * (indent + NAME_WIDTH)
    lines = textwrap.wrap(summary, LAYOUT_WIDTH, initial_indent=column, subsequent_indent=column)
    head = " " * indent + name
    if len(head) >= indent + NAME_WIDTH:
        return [head, *lines]
    return [head + lines[0][len(head) :], *lines[1:]]


def layout() -> str:
    """The code layout of `docs/design.md`: each layer, then each of its modules, with its summary."""
    lines = []
    for layer in LAYERS:
        lines += _entry(2, f"{layer}/", _summary(PACKAGE / layer / "__init__.py"))
        for module in sorted((PACKAGE / layer).glob("*.py")):
            if module.name != "__init__.py":
                lines += _entry(4, module.name, _summary(module))
    return "\n".join(lines)


def _documented_layout() -> str:
    text = (REPO / "docs" / "design.md").read_text()
    block = text[text.index("\n  store/") + 1 :]
    return block[: block.index("\nresources/")]


@functools.cache
def _modules() -> dict[str, list[Path]]:
    """Our modules by every dotted suffix of their name (`node`, `dataplane.node`, ...)."""
    found: dict[str, list[Path]] = {}
    for folder in SOURCES:
        for path in (REPO / folder).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            for i in range(len(parts)):
                found.setdefault(".".join(parts[i:]), []).append(path)
    return found


@functools.cache
def _names(path: Path) -> frozenset[str]:
    """What a module defines or imports at any depth (classes, functions, assignments, imports)."""
    names: set[str] = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    names.update(p.stem for p in path.parent.glob("*.py") if path.name == "__init__.py")
    names.update(p.name for p in path.parent.iterdir() if path.name == "__init__.py" and p.is_dir())
    return frozenset(names)


def _texts() -> list[tuple[str, str]]:
    texts = [(str(md.relative_to(REPO)), md.read_text()) for md in sorted((REPO / "docs").glob("*.md"))]
    for folder in SOURCES:
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(_tree(path)):
                if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    doc = ast.get_docstring(node, clean=False)
                    if doc:
                        texts.append((str(path.relative_to(REPO)), doc))
    return texts


def unresolved(text: str) -> list[str]:
    """The references in `text` to a module of ours whose name that module does not have.

    A reference is to a module when its dotted start names one of ours and either that start has
    two parts or more (`dataplane.node`) or the name is a class (`chain_writes.ChainSealer`): a lower-case
    name after one word (`config.node_id`) is as often an attribute of a variable as a module's.
    """
    missing = []
    for ref in REFERENCE.findall(text):
        parts = ref.split(".")
        for k in range(len(parts) - 1, 0, -1):
            module, name = ".".join(parts[:k]), parts[k]
            if module in _modules():
                if (k > 1 or name[0].isupper()) and not any(name in _names(p) for p in _modules()[module]):
                    missing.append(ref)
                break
    return missing


def test_design_md_shows_the_layout_the_layers_describe() -> None:
    assert _documented_layout() == layout(), "regenerate it: python -m tests.test_docs"


def test_every_reference_to_a_name_of_ours_resolves() -> None:
    missing = [f"{where}: `{ref}`" for where, text in _texts() for ref in unresolved(text)]
    assert not missing, "\n".join(missing)


def test_a_stale_reference_is_found() -> None:
    assert unresolved("sealed by `chain_writes.ChainSealer`, not `manifest.ChainSealer`; `config.node_id`") == [
        "manifest.ChainSealer"
    ]


if __name__ == "__main__":
    print(layout())
