"""``filemq`` and ``broker`` stand side by side: neither imports the other.

What both need (CURVE keys, the bind policy, socket helpers, the handshake monitor) is in
``zerohub`` (``zerohub.zmqkit``); running both in one process is ``zerohub.hub``'s job.
Every import statement counts, lazy ones included (read with ``ast``, nothing imported).
"""

from __future__ import annotations

import ast

import pytest

from tests.zproto.test_import_cycles import ROOT, imported_names, package_modules


def imports_in(tree: ast.Module, module: str, is_package: bool, other: str) -> list[str]:
    """What ``module`` (parsed as ``tree``) imports from the package ``other``."""
    found = []
    for base, member in imported_names(tree, module, is_package):
        if base == other or base.startswith(f"{other}.") or (base == "" and member == other):
            found.append(f"{base}.{member}" if member else base)
    return sorted(found)


def imports_of(package: str, other: str) -> list[tuple[str, str]]:
    """(module of ``package``, what it imports) for every import of ``other``."""
    found = []
    for name, path in package_modules(package).items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        found += [(name, target) for target in imports_in(tree, name, is_package, other)]
    return sorted(found)


@pytest.mark.parametrize(("package", "other"), [("broker", "filemq"), ("filemq", "broker")])
def test_no_import_between_filemq_and_broker(package: str, other: str) -> None:
    assert len(package_modules(package)) > 3  # the package was found and read
    found = imports_of(package, other)
    assert found == [], f"{package} imports {other}: {found}"


def test_the_checker_sees_lazy_imports_and_ignores_lookalikes() -> None:
    assert (ROOT / "broker").is_dir()
    source = (
        "import zmq\nimport filemqx\nfrom zerohub import zmqkit\n"
        "def f():\n    from filemq import security\n\nimport filemq.client as c\n"
    )
    tree = ast.parse(source)
    assert imports_in(tree, "broker.x", False, "filemq") == ["filemq.client", "filemq.security"]
