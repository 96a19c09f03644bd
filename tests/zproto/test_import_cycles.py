"""No import cycle inside a package: the project's modules are read with ``ast`` (nothing
is imported) and the module graph of each package is searched for strongly connected parts.

Every import statement counts, wherever it stands (module level, inside a function, under
``if TYPE_CHECKING``): a cycle hidden behind a lazy import is still two modules that cannot
be understood one without the other.  Importing a submodule runs its package's
``__init__`` first, but that implicit edge is not counted (it is not written anywhere).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def package_modules(package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``package`` and its subpackages."""
    base = ROOT / package
    out: dict[str, Path] = {}
    for path in sorted(base.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imported_names(tree: ast.Module, module: str, is_package: bool) -> set[tuple[str, str]]:
    """What the import statements of ``module`` load, in absolute form.

    ``import a.b`` gives ``("a.b", "")``; ``from a.b import c`` gives ``("a.b", "c")``,
    where ``c`` may be a submodule or a name defined in ``a.b``: the caller decides.
    """
    package = module if is_package else module.rpartition(".")[0]
    names: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((alias.name, "") for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")
                if node.level > 1:
                    anchor = anchor[: -(node.level - 1)]
                base = ".".join([*anchor, node.module] if node.module else anchor)
            else:
                base = node.module or ""
            names.update((base, alias.name) for alias in node.names)
    return names


def import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports."""
    modules = package_modules(package)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets = set()
        for base, member in imported_names(tree, name, path.name == "__init__.py"):
            submodule = f"{base}.{member}"
            targets.add(submodule if member and submodule in modules else base)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    part = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        part.append(member)
                        if member == node:
                            break
                    if len(part) > 1:
                        found.append(sorted(part))
    return found


def _describe(parts: list[list[str]]) -> str:
    return "; ".join(f"{len(p)} modules: {', '.join(p)}" for p in parts)


@pytest.mark.parametrize(
    "package",
    [
        "zproto",
        "filemq",
        "broker",
        "zerohub",
    ],
)
def test_no_import_cycle_inside_the_package(package: str) -> None:
    graph = import_graph(package)
    assert len(graph) > 3  # the package was found and read
    found = cycles(graph)
    assert not found, f"import cycles in {package}: {_describe(found)}"


def test_no_import_cycle_among_the_engine_modules() -> None:
    # issue 9: the engine's modules, its queue package and the TMQP server import one way
    # (the client package is left to its own step; the broker case above stays xfail
    # until it is clean too)
    graph = import_graph("broker")
    assert "broker.engine.engine" in graph and "broker.engine.queue.queue" in graph
    found = [
        part
        for part in cycles(graph)
        if any(m.startswith(("broker.engine.", "broker.server.")) for m in part)
    ]
    assert not found, f"import cycles through the engine or server: {_describe(found)}"


def test_the_checker_finds_cycles_and_resolves_relative_imports(tmp_path: Path) -> None:
    tree = ast.parse("from . import b\nfrom .c import thing\nimport pkg.d\nfrom pkg import e\n")
    assert imported_names(tree, "pkg.a", is_package=False) == {
        ("pkg", "b"),
        ("pkg.c", "thing"),
        ("pkg.d", ""),
        ("pkg", "e"),
    }
    tree = ast.parse("def f():\n    from .. import top\n")
    assert imported_names(tree, "pkg.sub.x", is_package=False) == {("pkg", "top")}
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"x": {"y"}, "y": set()}) == []
