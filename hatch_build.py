"""The opt-in compiled build: ``ZEROHUB_COMPILE=1 pip install -e .`` compiles the modules
listed under ``[tool.hatch.build.hooks.custom] compile`` (pyproject.toml) with mypyc.

Without ``ZEROHUB_COMPILE=1`` this hook does nothing and asks for nothing: the default
install, CI and the wheel stay pure Python, exactly as without it.

With it, the build environment also gets mypy (mypyc's compiler, pinned: its output and
its refusals change between releases), setuptools (mypyc drives the C compiler through
it) and the project's own dependencies (so mypy sees pyzmq's types, as the checker of CI
does); then mypyc writes one extension module beside each listed ``.py`` file and one
shared runtime library (``*__mypyc.*.so``) at the root of the checkout.  Python imports
an extension module before a ``.py`` of the same name, so an editable install runs the
compiled code from the checkout; a wheel carries the extension modules (and is then
tagged for this Python and platform).  Nothing it makes is committed (``.gitignore``:
``*.so``, ``build/``); ``python hatch_build.py --clean`` removes them (back to pure).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

#: The environment variable that turns the compiled build on ("1"; anything else: pure).
COMPILE_ENV = "ZEROHUB_COMPILE"
#: mypyc as the measured build used it (README, "Compiled build").
MYPY_PIN = "mypy==2.4.1"

#: Run by the build environment's Python in the checkout: mypyc compiles the modules
#: named on its command line in place (``packages=[]``: setuptools is only the C
#: compiler's driver here, it must not go looking for the project's packages).
_COMPILE = """
import sys
from setuptools import setup
from mypyc.build import mypycify

temp = sys.argv[1]
setup(
    name="zerohub-compiled",
    packages=[],
    py_modules=[],
    ext_modules=mypycify(sys.argv[2:], target_dir=temp + "/c", opt_level="3"),
    script_args=["build_ext", "--inplace", "--build-temp", temp + "/o"],
)
"""


def enabled() -> bool:
    return os.environ.get(COMPILE_ENV) == "1"


def products(root: Path, modules: list[str]) -> list[Path]:
    """The compiled build's files present in ``root``: each listed module's extension and
    the shared runtime library."""
    found = sorted(root.glob("*__mypyc.*.so"))
    for module in modules:
        found += sorted((root / module).parent.glob(Path(module).stem + ".*.so"))
    return found


def compile_modules(root: Path, modules: list[str]) -> list[Path]:
    """mypyc over ``modules`` (paths relative to ``root``), in place; the files made."""
    for stale in products(root, modules):
        stale.unlink()
    with tempfile.TemporaryDirectory(prefix="zerohub-mypyc-") as temp:
        subprocess.run(
            [sys.executable, "-c", _COMPILE, temp, *modules],
            cwd=root,
            check=True,
            env={**os.environ, "MYPY_CACHE_DIR": temp + "/cache"},
        )
    made = products(root, modules)
    if len(made) != len(modules) + 1:
        raise RuntimeError(f"mypyc made {len(made)} files for {len(modules)} modules")
    return made


try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # (run as a script, outside a build: ``--clean``)
    BuildHookInterface = object  # type: ignore[assignment,misc]


class CompileHook(BuildHookInterface):  # type: ignore[misc,type-arg]
    """Hatchling's custom build hook (``[tool.hatch.build.hooks.custom]``)."""

    def modules(self) -> list[str]:
        return list(self.config.get("compile", []))

    def dependencies(self) -> list[str]:
        if not enabled():
            return []
        return [MYPY_PIN, "setuptools>=68", *self.metadata.core.dependencies]

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if not enabled():
            return
        root = Path(self.root)
        made = compile_modules(root, self.modules())
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if version == "editable":  # (the checkout is on sys.path: its files are used)
            return
        for path in made:
            relative = path.relative_to(root).as_posix()
            if "/" in relative:
                build_data["artifacts"].append("/" + relative)
            else:  # (the shared library: at the root of site-packages)
                build_data["force_include"][str(path)] = relative


def main(argv: list[str]) -> int:
    """``python hatch_build.py --clean``: remove the compiled build's files (pure again)."""
    import tomllib

    if argv != ["--clean"]:
        print("usage: python hatch_build.py --clean", file=sys.stderr)
        return 2
    root = Path(__file__).resolve().parent
    config = tomllib.loads((root / "pyproject.toml").read_text())
    modules = config["tool"]["hatch"]["build"]["hooks"]["custom"]["compile"]
    for path in products(root, modules):
        path.unlink()
        print(f"removed {path.relative_to(root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
