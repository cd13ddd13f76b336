"""No import cycles in the ``narwhal`` package, counting every import the source states.

Rule kept here: a module's dependencies run one way. An import inside a function, one under
``if TYPE_CHECKING:`` and a module named by a string that ``importlib`` loads all count as
edges: each hides a cycle from the interpreter without removing it from the design, so a reader
(and a refactor) still has to hold both modules in mind at once.

Theory of operation: :func:`import_graph` parses every ``.py`` file of a package with
:mod:`ast` (nothing is imported) and records, for each module, the package's modules it names:
``import a.b``, ``from a import b`` (both ``a`` and, when it is a module, ``a.b``), relative
imports resolved against the importing module's package, and, in a module that calls
``import_module``, any string constant that is exactly a module's dotted name (its targets, often
kept in a table). Elsewhere such a string is not an import (a ``python -m`` argument, a
``find_spec`` lookup, a logger's name).
:func:`cycles` returns the strongly connected components of more than one module (Tarjan's
algorithm, iterative), each sorted; the package test asserts there are none, and the tests of
the checker build small packages in ``tmp_path`` to show that each kind of import is seen.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "narwhal"


def _modules(package: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package's ``__init__``) for every module under ``package``."""
    found: dict[str, tuple[Path, bool]] = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_init = parts[-1] == "__init__"
        if is_init:
            parts.pop()
        found[".".join(parts)] = (path, is_init)
    return found


def _absolute(module: str, is_init: bool, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` names, its relative dots resolved."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_init else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, wherever in the file the import is."""
    modules = _modules(package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, is_init) in modules.items():
        named: list[str] = []
        strings: list[str] = []
        loads_by_name = False
        for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
            if isinstance(node, ast.Import):
                named.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(name, is_init, node)
                named.append(source)
                named.extend(f"{source}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                strings.append(node.value)
            elif isinstance(node, ast.Call):
                called = node.func
                called_name = called.attr if isinstance(called, ast.Attribute) else None
                if isinstance(called, ast.Name):
                    called_name = called.id
                loads_by_name = loads_by_name or called_name == "import_module"
        if loads_by_name:  # its module names are importlib's targets
            named.extend(strings)
        graph[name] = {target for target in named if target in modules and target != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component: list[str] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


def _describe(graph: dict[str, set[str]], component: list[str]) -> str:
    members = set(component)
    edges = [f"{a} -> {b}" for a in component for b in sorted(graph[a] & members)]
    return "; ".join(edges)


def test_the_package_has_no_import_cycle() -> None:
    graph = import_graph(PACKAGE)
    assert len(graph) > 100  # the whole package was read
    found = cycles(graph)
    assert not found, "import cycles: " + " | ".join(_describe(graph, c) for c in found)


# ---------------------------------------------------------------------------- the checker


def _package(root: Path, files: dict[str, str]) -> Path:
    package = root / "pkg"
    for relative, text in {"__init__.py": "", **files}.items():
        path = package / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, "utf-8")
    return package


def test_a_cycle_through_a_function_level_import_is_found(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "a.py": "from pkg.b import g\n\ndef f():\n    return g()\n",
            "b.py": "def g():\n    from pkg import a\n    return a\n",
            "c.py": "import pkg.a\n",
        },
    )
    assert cycles(import_graph(package)) == [["pkg.a", "pkg.b"]]


def test_a_cycle_through_type_checking_and_relative_imports_is_found(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "sub/__init__.py": "from .x import X\n",
            "sub/x.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from ..y import Y\n"
                "class X: ...\n"
            ),
            "y.py": "from pkg.sub.x import X\nclass Y(X): ...\n",
        },
    )
    assert cycles(import_graph(package)) == [["pkg.sub.x", "pkg.y"]]


def test_a_cycle_through_an_importlib_target_is_found(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "table.py": 'import importlib\nDRAW = {"t": "pkg.tool"}\n'
            "def load(n):\n    return importlib.import_module(DRAW[n])\n",
            "tool.py": "def run():\n    from pkg.table import load\n    return load\n",
            "other.py": 'ARGV = ["python", "-m", "pkg.table"]\n',
        },
    )
    graph = import_graph(package)
    assert graph["pkg.other"] == set()  # a module's name that nothing imports by
    assert cycles(graph) == [["pkg.table", "pkg.tool"]]


def test_a_longer_cycle_is_found_whole_and_an_acyclic_package_passes(tmp_path: Path) -> None:
    chain = {f"m{i}.py": f"import pkg.m{i + 1}\n" for i in range(3)}
    acyclic = _package(tmp_path / "ok", {**chain, "m3.py": "import json\n"})
    assert cycles(import_graph(acyclic)) == []
    cyclic = _package(tmp_path / "bad", {**chain, "m3.py": "def f():\n    import pkg.m0\n"})
    assert cycles(import_graph(cyclic)) == [["pkg.m0", "pkg.m1", "pkg.m2", "pkg.m3"]]
