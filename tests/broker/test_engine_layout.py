"""The engine and the TMQP server are composed, not layered: no class of theirs is a
subclass of a class defined in another of their modules (issue 9: "no class split across
files by inheritance").  The modules are read with ``ast``; nothing is imported.

A subclass beside its base in one module (the delivery handlers, the authorizers, the
error hierarchy) is one concept and stays allowed; so are Protocols, which describe a
part without being one.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("broker/engine", "broker/server")


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _classes() -> dict[str, dict[str, ast.ClassDef]]:
    """Module -> its top-level classes, for every module of the engine and the server."""
    found: dict[str, dict[str, ast.ClassDef]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            found[_module(path)] = {
                node.name: node for node in tree.body if isinstance(node, ast.ClassDef)
            }
    return found


def _is_protocol(node: ast.ClassDef) -> bool:
    return any(
        (isinstance(b, ast.Name) and b.id == "Protocol")
        or (isinstance(b, ast.Subscript) and getattr(b.value, "id", "") == "Protocol")
        for b in node.bases
    )


def cross_module_bases(modules: dict[str, dict[str, ast.ClassDef]]) -> list[str]:
    """``module.Class(other.Base)`` for each base class defined in another module."""
    problems = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = _module(path)
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            imported: dict[str, str] = {}
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module in modules:
                    for alias in node.names:
                        imported[alias.asname or alias.name] = node.module
            for node in tree.body:
                if not isinstance(node, ast.ClassDef):
                    continue
                for base in node.bases:
                    name = base.id if isinstance(base, ast.Name) else None
                    origin = imported.get(name or "")
                    if origin is None or name is None:
                        continue
                    base_node = modules[origin].get(name)
                    if base_node is not None and not _is_protocol(base_node):
                        problems.append(f"{module}.{node.name}({origin}.{name})")
    return problems


def test_no_engine_or_server_class_is_split_across_modules_by_inheritance() -> None:
    modules = _classes()
    assert "broker.engine.queue.queue" in modules and "broker.server.server" in modules
    assert "Queue" in modules["broker.engine.queue.queue"]
    assert cross_module_bases(modules) == []
