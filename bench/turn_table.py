"""The table a bench prints when it measures checkouts in turns (this one and ``--base``).

One row per checkout per turn -- the turn, the checkout's name ("this", "base"), the
bench's figures, the machine's load when the row was measured -- printed as soon as it is
measured (a long run shows its first turns; a run cut short keeps them).  The checkouts
take turns as ``bench_client_push.in_turns`` orders them, so both meet the same load.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from bench_client_push import in_turns

R = TypeVar("R", bound=dict[str, Any])


def from_checkout(root: Path, result: R) -> R:
    """``result`` without its ``broker`` key (the ``broker`` package file the measuring
    process imported), which must lie in ``root``: else the run measured another
    checkout (a path or an install that won) and the bench stops saying so."""
    if not str(result.pop("broker")).startswith(str(root)):
        raise SystemExit(f"measured another checkout than {root}")
    return result


@dataclass(frozen=True, slots=True)
class Column:
    """One figure of a row: its title, the key of the measured mapping, its format."""

    title: str
    key: str
    spec: str = ".1f"  # the format spec of the value (its width comes from the title)
    width: int = 0  # (0: the title's length, at least 8)

    def cell_width(self) -> int:
        return self.width or max(8, len(self.title))


def print_turns(
    columns: Sequence[Column],
    base: Path | None,
    turns: int,
    measure: Callable[[Path], Mapping[str, float]],
) -> None:
    """Measure this checkout (and ``base``) ``turns`` times in turns with ``measure``
    (a checkout's root -> its figures by key) and print the table, row by row."""
    titles = " ".join(f"{c.title:>{c.cell_width()}}" for c in columns)
    print(f"{'turn':<5} {'checkout':<9} {titles} {'load':>6}", flush=True)
    for turn, name, root in in_turns(base, turns):
        figures = measure(root)
        cells = " ".join(f"{figures[c.key]:>{c.cell_width()}{c.spec}}" for c in columns)
        print(f"{turn:<5} {name:<9} {cells} {os.getloadavg()[0]:>6.1f}", flush=True)
