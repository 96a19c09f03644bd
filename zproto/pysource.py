"""Writing Python source that ``ruff format`` leaves as it is.

The generator's output is committed and checked by ``zproto check``; these helpers
lay statements out the way the formatter would (double quotes, one argument per
line with a trailing comma once a line is too long), so generated files stay
formatted without running a formatter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

STRUCT_CHAR = {1: "B", 2: "H", 4: "I", 8: "Q"}
#: Generated code is written to be stable under ``ruff format`` at this width.
LINE_LENGTH = 99
ORDER_PREFIX = {"big": ">", "little": "<"}


def lit(value: object) -> str:
    """Python literal with the double quotes a formatter would choose."""
    text = repr(value)
    if isinstance(value, bytes) and text.startswith("b'") and '"' not in text:
        return 'b"' + text[2:-1] + '"'
    if isinstance(value, str) and text.startswith("'") and '"' not in value:
        return '"' + text[1:-1] + '"'
    if isinstance(value, tuple):
        inner = ", ".join(lit(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return text


def wrap(indent: int, head: str, args: list[str], tail: str) -> list[str]:
    """``head + args + tail`` on one line if it fits, else one argument per line.

    The exploded form ends with a trailing comma, which formatters keep as is.
    """
    one = " " * indent + head + ", ".join(args) + tail
    if len(one) <= LINE_LENGTH:
        return [one]
    pad = " " * (indent + 4)
    return [" " * indent + head] + [f"{pad}{a}," for a in args] + [" " * indent + tail]


@dataclass
class Source:
    lines: list[str] = field(default_factory=list)
    level: int = 0

    def __call__(self, line: str = "") -> None:
        self.lines.append(("    " * self.level + line) if line else "")

    def wrapped(self, head: str, args: list[str], tail: str) -> None:
        for line in wrap(4 * self.level, head, args, tail):
            self.lines.append(line)

    def unpack(self, targets: list[str], call: str) -> None:
        """``(a, b) = call`` laid out as ``ruff format`` would."""
        names = ", ".join(targets) + ("," if len(targets) == 1 else "")
        pad = "    " * self.level
        callee, _, args = call.partition("(")
        if len(f"{pad}({names}) = {call}") <= LINE_LENGTH:
            self(f"({names}) = {call}")
        elif len(f"{pad}({names}) = {callee}(") <= LINE_LENGTH:
            self(f"({names}) = {callee}(")
            self(f"    {args[:-1]}")
            self(")")
        elif len(f"{pad}({names}) = (") <= LINE_LENGTH:
            self(f"({names}) = (")
            self(f"    {call}")
            self(")")
        else:
            self("(")
            for target in targets:
                self(f"    {target},")
            self(f") = {call}")

    def indent(self) -> None:
        self.level += 1

    def end_def(self, last: str) -> None:
        """The last statement of the function being written (its ``return``), then its
        end: one level out and the two blank lines after a top-level function."""
        self(last)
        self.dedent()
        self()
        self()

    def dedent(self) -> None:
        self.level -= 1


class StructNames:
    """Module-level struct.Struct constants, named after their format."""

    def __init__(self) -> None:
        self.formats: dict[str, str] = {}

    def name(self, fmt: str) -> str:
        if fmt not in self.formats:
            order = "BE" if fmt[0] == ">" else "LE"
            self.formats[fmt] = f"_{order}_{fmt[1:]}"
        return self.formats[fmt]


def isort_key(name: str) -> tuple[int, str]:
    """Order of ``__all__`` entries: CONSTANTS, then Classes, then functions."""
    if name.isupper():
        return (0, name)
    return (1 if name[:1].isupper() else 2, name)


def assign(target: str, operands: list[str], op: str, width: int) -> list[str]:
    """``target = a op b op c`` laid out the way ``ruff format`` lays it out."""
    one = f"{target} = {op.join(operands)}"
    if len(one) <= width:
        return [one]
    if len(op.join(operands)) + 4 <= width:
        return [f"{target} = (", f"    {op.join(operands)}", ")"]
    sym = op.strip()
    return (
        [f"{target} = (", f"    {operands[0]}"] + [f"    {sym} {o}" for o in operands[1:]] + [")"]
    )


def group_checks(checks: list[str], width: int) -> list[str]:
    """Join checks with ``or`` into as few lines as fit in ``width``."""
    groups: list[str] = []
    for check in checks:
        if groups and len(groups[-1]) + 4 + len(check) + 4 <= width:
            groups[-1] += f" or {check}"
        else:
            groups.append(check)
    return groups
