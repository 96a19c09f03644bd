"""The Reference sections of docs/filemq.md, docs/hub.md and docs/bridges.md against the code.

Each command's options are documented as a table under a heading naming the command
(``#### `filemq sync` ``): one row per option, its default in the second column.  The
rows are compared with the command's argparse parser, both ways (an option missing from
the table, or a row the parser lacks, fails too).  A limits table (header
``| limit | default | scope | past it | code |``: FILEMQ's, the hub's) names in its last
column where the code holds each bound; the value there is read at test time and
compared with the documented default.  Nothing here is a copy of a value: a default
changed in the code fails this test until the page says the same.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

#: The page that documents each command (by the first word of its title).
_PAGES = {"filemq": "filemq.md", "zerohub": "hub.md", "broker": "bridges.md"}

#: Options every command has, documented once (README's exit codes and -v/-q).
_COMMON = {"-h", "-v", "-q"}

_HEADING = re.compile(r"^#{2,4} `([^`]+)`\s*$")
_NUMBER = re.compile(r"^\s*(\d[\d,]*(?:\.\d+)?)\s*(KiB|MiB|GiB)?")
_UNITS = {None: 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
_LIMITS_HEADER = "| limit | default | scope | past it | code |"


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found: argparse.ArgumentParser = action.choices[name]
            return found
    raise KeyError(name)


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every documented command's parser, by its title (``filemq sync``)."""
    from broker.cli import build_parser as broker_parser
    from filemq.cli import build_parser as filemq_parser
    from zerohub.main import build_parser as zerohub_parser

    found: dict[str, argparse.ArgumentParser] = {}
    for name in ("serve", "sync", "subscribe", "ls", "status"):
        found[f"filemq {name}"] = _subparser(filemq_parser([name]), name)
    keys = _subparser(filemq_parser(["keys"]), "keys")
    found["filemq keys new"] = _subparser(keys, "new")
    found["zerohub serve"] = _subparser(zerohub_parser(), "serve")
    bridge = _subparser(broker_parser(), "bridge")
    for kind in ("mqtt", "amqp", "zmq", "stomp", "run"):
        found[f"broker bridge {kind}"] = _subparser(bridge, kind)
    return found


def documented(action: argparse.Action) -> bool:
    """False for -h/-v/-q (every command's) and the subcommand switch."""
    if isinstance(action, argparse._SubParsersAction):
        return False
    return not (set(action.option_strings) & _COMMON)


def option_name(action: argparse.Action) -> str:
    """How a table names the option: ``--bind``, or a positional's ``ENDPOINT``."""
    if action.option_strings:
        return max(action.option_strings, key=len)
    return str(action.metavar or action.dest).upper()


def default_text(action: argparse.Action) -> str:
    """What a table says of an option's default, made from its parser action."""
    if action.required:
        return "required"
    if isinstance(action, argparse._StoreTrueAction):
        return "off"
    value = action.default
    if value is None or value == [] or value is argparse.SUPPRESS:
        text = "none"
    elif isinstance(value, tuple):
        text = ":".join(str(v) for v in value)
    else:
        text = str(value)
    if action.option_strings and action.nargs == "?" and action.const is not None:
        text += f"; bare: {action.const}"
    return text


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def option_tables(text: str) -> dict[str, dict[str, str]]:
    """``{title: {option: default}}`` of every option table of a page."""
    tables: dict[str, dict[str, str]] = {}
    title = None
    for line in text.splitlines():
        heading = _HEADING.match(line)
        if heading:
            title = heading.group(1)
            continue
        if title is None or not line.startswith("|"):
            if line.startswith("#"):
                title = None
            continue
        cells = _cells(line)
        if cells[:2] == ["option", "default"] or set(line) <= set("|-: "):
            tables.setdefault(title, {})
            continue
        tables.setdefault(title, {})[cells[0].strip("`")] = cells[1].strip("`")
    return tables


def limit_rows(text: str) -> list[tuple[str, str, str]]:
    """``(name, default, code)`` of each row of a page's limits table (none: empty)."""
    lines = text.splitlines()
    if _LIMITS_HEADER not in lines:
        return []
    rows = []
    for line in lines[lines.index(_LIMITS_HEADER) + 2 :]:
        if not line.startswith("|"):
            break
        cells = _cells(line)
        rows.append((cells[0], cells[1], cells[-1].strip("`")))
    return rows


def doc_value(cell: str) -> float:
    """``16 MiB`` -> 16777216, ``10,000 names`` -> 10000, ``0.05 s`` -> 0.05."""
    found = _NUMBER.match(cell)
    assert found, f"no number at the start of the default {cell!r}"
    return float(found.group(1).replace(",", "")) * _UNITS[found.group(2)]


def _resolve(dotted: str) -> Any:
    """``package.module.NAME.attr``: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            value = getattr(value, name)
        return value
    raise ImportError(dotted)


def code_value(where: str) -> float:
    """The value the code holds at ``where`` (the limits table's last column):

    * ``filemq sync --window``: the parser's default;
    * ``filemq/fmq_msg.xml ICANHAZ cache``: a field's ``limit`` in the protocol model;
    * ``filemq.server.FileServer(max_clients)``: a parameter's default;
    * ``filemq.engine.load_wire("spec").max_name_octets``: an attribute of a call's value;
    * ``filemq.partial.MAX_PARTIALS``: a module constant (or a class attribute).
    """
    words = where.split()
    if words[0] in _PAGES:
        title, option = " ".join(words[:-1]), words[-1]
        actions = {option_name(a): a for a in parsers()[title]._actions}
        return float(actions[option].default)
    if words[0].endswith(".xml"):
        model = ET.parse(ROOT / words[0]).getroot()
        field = model.find(f"message[@name='{words[1]}']/field[@name='{words[2]}']")
        assert field is not None, where
        return float(field.get("limit", "nan"))
    parameter = re.fullmatch(r"([\w.]+)\((\w+)\)", where)
    if parameter:
        call = _resolve(parameter.group(1))
        return float(inspect.signature(call).parameters[parameter.group(2)].default)
    called = re.fullmatch(r'([\w.]+)\("(\w+)"\)\.(\w+)', where)
    if called:
        return float(getattr(_resolve(called.group(1))(called.group(2)), called.group(3)))
    return float(_resolve(where))


@pytest.fixture(autouse=True)
def _no_endpoint_override(monkeypatch: pytest.MonkeyPatch) -> None:
    """``broker`` commands take ``--connect``'s default from ``$BROKER_ENDPOINT``."""
    monkeypatch.delenv("BROKER_ENDPOINT", raising=False)


def _page(title: str) -> str:
    return (DOCS / _PAGES[title.split()[0]]).read_text(encoding="utf-8")


@pytest.mark.parametrize("title", sorted(parsers()))
def test_options_table_matches_the_parser(title: str) -> None:
    tables = option_tables(_page(title))
    assert title in tables, f"no options table under a heading `{title}`"
    table = tables[title]
    actions = {option_name(a): a for a in parsers()[title]._actions if documented(a)}
    assert sorted(table) == sorted(actions), f"{title}: options documented vs the parser's"
    for option, action in actions.items():
        assert table[option] == default_text(action), f"{title} {option}: default"


@pytest.mark.parametrize(("page", "least"), [("filemq.md", 30), ("hub.md", 5)])
def test_limits_table_matches_the_code(page: str, least: int) -> None:
    rows = limit_rows((DOCS / page).read_text(encoding="utf-8"))
    assert len(rows) >= least, f"{page}: no limits table, or a short one"
    wrong = [
        f"{name}: documented {default}, the code's {code_value(where)} ({where})"
        for name, default, where in rows
        if doc_value(default) != code_value(where)
    ]
    assert not wrong, "\n".join(wrong)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it (``## Direct I/O`` -> ``direct-io``)."""
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: str) -> set[str]:
    text = (DOCS / page).read_text(encoding="utf-8")
    return {slug(line) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


@pytest.mark.parametrize("page", sorted(set(_PAGES.values())))
def test_reference_comes_first_and_lists_the_sections(page: str) -> None:
    text = (DOCS / page).read_text(encoding="utf-8")
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings[0] == "## Reference", f"{page}: the Reference section is not first"
    linked = set(re.findall(r"\]\(#([\w-]+)\)", text))
    for heading in headings[1:]:
        assert slug(heading) in linked, f"{page}: {heading!r} is not linked from the Reference"


@pytest.mark.parametrize("page", sorted(set(_PAGES.values())))
def test_every_link_to_a_section_leads_to_one(page: str) -> None:
    text = (DOCS / page).read_text(encoding="utf-8")
    for target, anchor in re.findall(r"\]\(([\w.]*)#([\w-]+)\)", text):
        assert anchor in _anchors(target or page), f"{page}: no section for {target}#{anchor}"


def test_table_parsing_sees_a_changed_default() -> None:
    """The check is live: a table with a wrong default differs from the parser."""
    text = "#### `filemq sync`\n\n| option | default | what |\n|---|---|---|\n"
    text += "| --window | 1 | x |\n"
    actions = {option_name(a): a for a in parsers()["filemq sync"]._actions}
    assert option_tables(text)["filemq sync"]["--window"] != default_text(actions["--window"])
    assert doc_value("16 MiB") == 16 << 20 and doc_value("10,000 names") == 10_000
