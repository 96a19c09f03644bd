"""Every bench's call count is ``bench/call_count.python_calls`` (one home): per code
object, so each named tuple's constructor counts (pstats' total folds them all into one
``<string>:1:<lambda>`` row).  Two benches that count in this process are played with
the named tuples of persist15's test (``test_bench_persistent_calls``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bench_fanout_decode import RUN_MAX, calls_per_delivery
from bench_stomp_paths import _calls

from tests.broker.test_bench_persistent_calls import _make

#: ``_make(50)``'s calls: itself, then per tuple made its ``__new__`` and the
#: ``tuple.__new__`` it calls (pstats' total: 151, one class's ``__new__`` lost)
MADE = 1 + 2 * 50 + 2 * 50


def test_the_stomp_paths_bench_counts_each_named_tuple_constructor() -> None:
    assert _calls(lambda: _make(50)) >= MADE


def test_the_fanout_decode_bench_counts_each_named_tuple_constructor() -> None:
    # (its figure is per delivery: 10 calls of the function, RUN_MAX deliveries each)
    assert calls_per_delivery(lambda: _make(50)) * 10 * RUN_MAX >= 10 * MADE
