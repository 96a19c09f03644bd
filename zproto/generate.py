"""Render a model into its output files and find the models of a project."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

from zproto.codegen import PythonGenerator
from zproto.docgen import markdown
from zproto.model import Protocol, load

_SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", "build", "dist", "tests"}


def display_name(path: Path, root: Path | None = None) -> str:
    """The model's path as written in the banner: relative to the project root."""
    path = path.resolve()
    root = (root or find_root(path.parent)).resolve()
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.name


def find_root(start: Path) -> Path:
    """Nearest ancestor holding pyproject.toml (else ``start``)."""
    for candidate in (start.resolve(), *start.resolve().parents):
        if (candidate / "pyproject.toml").exists():
            return candidate
    return start.resolve()


def render(model_path: Path, out_dir: Path | None = None) -> tuple[Protocol, dict[Path, str]]:
    """Load a model; return it and {output path: text} for the codec and its doc."""
    proto = load(model_path)
    out_dir = out_dir if out_dir is not None else model_path.parent
    name = display_name(model_path)
    code = PythonGenerator(proto, name).generate()
    doc = markdown(proto, name)
    stem = model_path.stem
    return proto, {out_dir / f"{stem}.py": code, out_dir / f"{stem}.md": doc}


def is_model(path: Path) -> bool:
    """A zproto model is an XML file whose root element is <class>."""
    try:
        for _event, elem in ET.iterparse(path, events=("start",)):
            return elem.tag == "class"
    except (ET.ParseError, OSError):
        return False
    return False


def find_models(root: Path) -> list[Path]:
    """Every model below ``root``'s packages (tests and virtualenvs excluded)."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        for filename in sorted(filenames):
            if filename.endswith(".xml"):
                path = Path(dirpath) / filename
                if is_model(path):
                    found.append(path)
    return found
