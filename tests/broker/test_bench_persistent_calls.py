"""``bench/bench_persistent.py --calls`` counts every Python call: named tuples'
constructors share one pstats label (``<string>:1:<lambda>``), and pstats' total kept
only one of them (the persistent rows' count moved by 1.0 call per message with the
order tuple classes were first made in)."""

from __future__ import annotations

import cProfile
import sys
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bench_persistent import python_calls


class _First(NamedTuple):
    a: int


class _Second(NamedTuple):
    b: int


def _make(n: int) -> None:
    for i in range(n):
        _First(i)
        _Second(i)


def test_each_named_tuple_constructor_is_counted() -> None:
    prof = cProfile.Profile()
    prof.enable()
    _make(50)
    prof.disable()
    # _make once; per tuple made its ``__new__`` and the ``tuple.__new__`` it calls (the
    # two classes' ``__new__`` share one pstats label: pstats' total has 151)
    assert python_calls(prof) >= 1 + 2 * 50 + 2 * 50
