"""The Reference sections of docs/broker.md and docs/stomp.md against the code.

Each page has one reference section between ``<!-- reference -->`` and
``<!-- /reference -->``.  Its tables with a ``default`` and a ``code`` column document
one dataclass field per row (``Limits.max_clients``, ``frames.Limits.max_body``): the
default written there must be the one the dataclass has, and every field of the classes a
page documents must have a row, so a new limit without a documented default fails here.
Values are read from the code, never written in this test.

How a default cell is read: a leading backticked Python literal (``(10000, 10000)``) is
that literal, other backticked text a string (``fsync``); ``none``, ``true``, ``false``;
else a number with thousands commas and an optional unit (KiB, MiB, GiB; s, ms as
seconds).  A note in parentheses after the value is ignored.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import math
import re
from pathlib import Path
from typing import Any

import pytest

from broker import cli
from broker.engine.limits import Limits
from broker.engine.options import BrokerConfig
from broker.server.options import ServerOptions
from broker.stomp import frames
from broker.stomp.server import ListenerOptions
from broker.stomp.session import SessionConfig
from broker.store.log.options import LogOptions

DOCS = Path(__file__).resolve().parent.parent / "docs"

#: The classes a ``code`` cell may name (the text before the field's name).
CLASSES: dict[str, type] = {
    "Limits": Limits,
    "BrokerConfig": BrokerConfig,
    "ServerOptions": ServerOptions,
    "LogOptions": LogOptions,
    "SessionConfig": SessionConfig,
    "ListenerOptions": ListenerOptions,
    "frames.Limits": frames.Limits,
}
#: The classes each page documents whole: every field has a row.
PAGES: dict[str, tuple[str, ...]] = {
    "broker.md": ("Limits", "BrokerConfig", "ServerOptions", "LogOptions"),
    "stomp.md": ("SessionConfig", "ListenerOptions", "frames.Limits"),
}
#: Fields that are no setting of their own: the clock the engine's timestamps read (a
#: test's injection), and the engine's limits (documented field by field as ``Limits``).
NOT_SETTINGS = {("BrokerConfig", "wall_clock"), ("BrokerConfig", "limits")}

_UNITS = {"KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "s": 1.0, "ms": 0.001}
_NUMBER = re.compile(r"(-?[\d,]*\.?\d+)(?: (KiB|MiB|GiB|ms|s))?")


@dataclasses.dataclass(frozen=True)
class Row:
    """One documented field: where it is, its cells by column header."""

    page: str
    line: int
    cells: dict[str, str]

    @property
    def code(self) -> tuple[str, str]:
        """(class name, field name) of the ``code`` cell."""
        text = _backticked(self.cells["code"])
        assert text is not None, f"{self}: no `Class.field` in the code column"
        owner, _, name = text.rpartition(".")
        return owner, name

    @property
    def key(self) -> str | None:
        """The config key of a table whose first column is ``key``, else None."""
        first = next(iter(self.cells))
        return _backticked(self.cells[first]) if first == "key" else None

    def __str__(self) -> str:
        return f"docs/{self.page}:{self.line}"


def _backticked(cell: str) -> str | None:
    found = re.search(r"`([^`]+)`", cell)
    return found.group(1) if found else None


def _split(line: str) -> list[str]:
    """A table line's cells (``\\|`` is a pipe inside a cell)."""
    inner = line.strip()[1:-1]
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", inner)]


def reference(page: str) -> list[tuple[int, str]]:
    """The numbered lines of the page's reference section."""
    lines = (DOCS / page).read_text().splitlines()
    starts = [n for n, line in enumerate(lines) if line.strip() == "<!-- reference -->"]
    ends = [n for n, line in enumerate(lines) if line.strip() == "<!-- /reference -->"]
    assert len(starts) == 1 and len(ends) == 1 and starts[0] < ends[0], page
    return [(n + 1, lines[n]) for n in range(starts[0] + 1, ends[0])]


def rows(page: str) -> list[Row]:
    """Every row of the reference tables that have a ``default`` and a ``code`` column."""
    found: list[Row] = []
    header: list[str] | None = None
    previous = ""
    for number, line in reference(page):
        if not line.startswith("|"):
            header = None
        elif not previous.startswith("|"):
            header = [cell.lower() for cell in _split(line)]
        elif header is not None and not set(line) <= set("|-: "):
            cells = _split(line)
            assert len(cells) == len(header), f"docs/{page}:{number}: {len(cells)} cells"
            if "default" in header and "code" in header:
                found.append(Row(page, number, dict(zip(header, cells, strict=True))))
        previous = line
    return found


def documented(cell: str) -> Any:
    """The value a default cell documents (see the module docstring)."""
    cell = cell.strip()
    if cell.startswith("`"):
        text = cell[1 : cell.index("`", 1)]
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return text
    word = cell.split(" (")[0].strip()
    if word == "none":
        return None
    if word in ("true", "false"):
        return word == "true"
    match = _NUMBER.fullmatch(word)
    assert match, f"cannot read the default {cell!r}"
    digits = match.group(1).replace(",", "")
    value: float = float(digits) if "." in digits else int(digits)
    unit = match.group(2)
    if unit in ("s", "ms"):
        return float(value) * _UNITS[unit]
    return value * _UNITS[unit] if unit else value


def same(code: Any, doc: Any, cell: str) -> bool:
    """Whether the documented value ``doc`` (read from ``cell``) is the code's ``code``."""
    if isinstance(code, enum.Enum):
        return bool(doc == code.value)
    if isinstance(code, bool) or code is None:
        return doc is code
    if dataclasses.is_dataclass(code):
        kind: Any = type(code)
        return bool(doc == f"{kind.__name__}()" and code == kind())
    if isinstance(code, tuple) and not code:
        return doc is None
    if isinstance(code, tuple) and all(dataclasses.is_dataclass(item) for item in code):
        return all(f"`{leaf}`" in cell for leaf in _strings(code))
    if isinstance(code, float):
        return (
            isinstance(doc, int | float) and not isinstance(doc, bool) and math.isclose(doc, code)
        )
    return type(doc) is type(code) and bool(doc == code)


def _strings(value: Any) -> list[str]:
    """Every string inside a tuple of dataclasses (a default too rich for one literal)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, tuple):
        return [leaf for item in value for leaf in _strings(item)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [
            leaf for f in dataclasses.fields(value) for leaf in _strings(getattr(value, f.name))
        ]
    return []


def code_default(owner: str, name: str) -> Any:
    kind = CLASSES[owner]
    assert name in {f.name for f in dataclasses.fields(kind)}, f"{owner} has no field {name}"
    return getattr(kind(), name)


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_field_of_the_page_s_classes_has_a_row(page: str) -> None:
    documented_fields = {row.code for row in rows(page)}
    for owner in PAGES[page]:
        fields = {(owner, f.name) for f in dataclasses.fields(CLASSES[owner])}
        missing = sorted(name for _, name in fields - documented_fields - NOT_SETTINGS)
        assert not missing, f"docs/{page} documents no default for {owner}: {missing}"


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_documented_default_is_the_code_s(page: str) -> None:
    wrong = []
    for row in rows(page):
        owner, name = row.code
        assert owner in CLASSES, f"{row}: unknown class {owner!r} in the code column"
        value = code_default(owner, name)
        cell = row.cells["default"]
        if not same(value, documented(cell), cell):
            wrong.append(f"{row}: {owner}.{name} is {value!r}, documented {cell!r}")
    assert not wrong, "\n".join(wrong)


def test_limits_and_engine_keys_are_the_config_s() -> None:
    """A ``key`` row of ``Limits`` or ``BrokerConfig`` names the field the config sets."""
    for row in rows("broker.md"):
        owner, name = row.code
        if row.key is not None and owner in ("Limits", "BrokerConfig"):
            assert row.key == name, f"{row}: key {row.key} documents {owner}.{name}"
    limit_keys = [row.key for row in rows("broker.md") if row.code[0] == "Limits" and row.key]
    assert Limits.from_mapping(dict.fromkeys(limit_keys, 4096)).max_clients == 4096


def test_the_stomp_keys_are_the_config_s_and_set_the_documented_field() -> None:
    """Every ``[stomp]`` key the command reads has a row, every row's key is one, and
    ``broker serve`` puts a value given to that key into the field the row names."""
    stomp_owners = ("SessionConfig", "ListenerOptions", "frames.Limits")
    keyed = [row for row in rows("stomp.md") if row.key and row.code[0] in stomp_owners]
    assert {row.key for row in keyed} == set(cli.STOMP_KEYS) | {"virtual_hosts"}
    for row in keyed:
        if row.key == "virtual_hosts":  # a list of tables (tests/stomp/test_vhosts.py)
            continue
        owner, name = row.code
        assert row.key is not None
        value = _another(cli.STOMP_KEYS[row.key], code_default(owner, name))
        args = argparse.Namespace(
            stomp="tcp://127.0.0.1:0", stomp_ws=None, stomp_tls_cert=None, stomp_tls_key=None
        )
        options = cli._stomp_listen_options(args, {row.key: value}, False)
        holder: Any = {
            "ListenerOptions": options,
            "SessionConfig": options.session,
            "frames.Limits": options.session.limits,
        }[owner]
        assert getattr(holder, name) == value, f"{row}: [stomp] {row.key} does not set {name}"


def _another(kind: type, default: Any) -> Any:
    """A valid value of ``kind`` other than ``default``."""
    if kind is bool:
        return not default
    if kind is str:
        return "X-Reference-Check"
    return kind(default + 3)


def test_the_serve_flags_defaults_are_the_log_store_s() -> None:
    """``broker serve`` without flags opens the store with ``LogOptions()``'s durability
    and batch interval (the flags table documents them as the store's defaults)."""
    serve = cli.build_parser().parse_args(["serve"])
    assert serve.durability == LogOptions().durability.value
    assert math.isclose(serve.batch_interval / 1000.0, LogOptions().batch_interval)


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: str) -> set[str]:
    lines = (DOCS / page).read_text().splitlines()
    fenced = False
    found = set()
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.add(_anchor(line.lstrip("#")))
    return found


@pytest.mark.parametrize("page", sorted(PAGES))
def test_the_reference_s_links_lead_to_headings(page: str) -> None:
    broken = []
    for number, line in reference(page):
        for target, anchor in re.findall(r"\]\(([\w.]*)#([^)]+)\)", line):
            if anchor not in _anchors(target or page):
                broken.append(f"docs/{page}:{number}: {target}#{anchor}")
    assert not broken, "\n".join(broken)


def test_the_server_keys_are_the_config_s() -> None:
    """The ``[server]`` row of the config table lists exactly the keys ``broker serve``
    reads (``cli.SERVER_KEYS``; their defaults are ``ServerOptions``', checked above)."""
    line = next(
        text
        for text in (DOCS / "broker.md").read_text().splitlines()
        if text.startswith("| `[server]` |")
    )
    documented = set(re.findall(r"`([a-z_]+)`", line.split("|")[2]))
    assert documented == set(cli.SERVER_KEYS)
