"""No two modules of ``launcher`` import each other at run time, directly or through others.

Decided from the source, not by importing: each module under ``core/launcher`` is parsed with
``ast`` and every ``import`` in it counts, at the top level and inside functions and classes
alike (a function-level import is a run-time import that merely happens later; a circle through
one still means the two modules cannot be understood, or moved, one without the other). Imports
inside an ``if TYPE_CHECKING:`` block do not count: they never run. Only the module an import
names is an edge (``from launcher.a import b`` is an edge to ``launcher.a.b`` when that is a
module, else to ``launcher.a``). Two kinds of edge are left out because they order nothing: the
parent packages Python initialises before a module (importing ``launcher.a.b`` is no edge to
``launcher.a``), and a module's explicit import of one of its own parent packages (``from
launcher import __version__`` in ``launcher.plugins.manager``): Python has initialised that
package before the module's first line runs, whatever the module says; counting it would join
``launcher``'s lazy front (``launcher.launch`` loads the API on first use) with everything below.
An import-order check would see only the circles a given start-up happens to walk; the source
shows them all, whatever the flags.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import launcher

ROOT = Path(launcher.__file__).resolve().parent


def _modules(root: Path) -> dict[str, Path]:
    """Every module of the package at ``root``, by dotted name (``launcher.agent.agent``)."""
    found = {}
    for directory, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".py"):
                continue
            parts = list(Path(directory, name).relative_to(root.parent).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = Path(directory, name)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _run_time_imports(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, int]]:
    """The import statements that can run (with their lines): all of them but TYPE_CHECKING's."""
    found: list[tuple[ast.Import | ast.ImportFrom, int]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append((node, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _edges(name: str, path: Path, modules: dict[str, Path]) -> dict[str, int]:
    """The modules of the package that ``name`` imports at run time, each with a line that does."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges: dict[str, int] = {}
    for node, line in _run_time_imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                       for alias in node.names]
        for target in targets:
            if target in modules and not f"{name}.".startswith(f"{target}."):  # itself, or a parent
                edges.setdefault(target, line)
    return edges


def import_circles(root: Path = ROOT) -> list[list[str]]:
    """Each group of modules that import one another at run time (strongly connected, 2 or more)."""
    modules = _modules(root)
    graph = {name: _edges(name, path, modules) for name, path in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            connect(name)
    return [[f"{m} (imports {', '.join(f'{t}:{graph[m][t]}' for t in sorted(graph[m]) if t in c)})" for m in c]
            for c in circles]


def test_the_checker_sees_a_circle_through_a_function_level_import_and_not_one_under_type_checking(tmp_path):
    package = tmp_path / "launcher"
    package.mkdir()
    (package / "__init__.py").write_text('"""Nothing."""\n')
    (package / "a.py").write_text("from launcher import b, c\n")
    (package / "b.py").write_text("def f():\n    from launcher.a import x\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import launcher.a\n")
    (package / "d.py").write_text("import typing\nif typing.TYPE_CHECKING:\n    pass\nelse:\n    from . import e\n")
    (package / "e.py").write_text("import launcher.d\n")
    assert [[line.split(" ")[0] for line in circle] for circle in import_circles(package)] == [
        ["launcher.a", "launcher.b"], ["launcher.d", "launcher.e"]]


def test_no_module_of_launcher_is_in_an_import_circle():
    assert import_circles() == []
