"""``bench/bench_filemq_start.py`` removes its work tree when ``timeout`` (SIGTERM) or a
closed terminal (SIGHUP) ends it half-way.

Was (session 14, fmqstart14): a 98 MB tree of 100,000 files left in the temp folder: the
signals' default action ended the process before its ``finally`` removed the tree.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.polling import WAIT

_BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_filemq_start.py"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["TERM", "HUP"])
def test_a_signal_mid_run_leaves_no_work_tree(tmp_path: Path, sig: signal.Signals) -> None:
    # (turns enough that the signal comes before the end on any machine)
    argv = ["--files", "300", "--turns", "10000", "--dir", str(tmp_path)]
    with subprocess.Popen(
        [sys.executable, str(_BENCH), *argv], stderr=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stderr is not None
        # the first turn's line: the tree and its index are made, a child is measuring
        said = next((line for line in proc.stderr if line.startswith("  turn 1 ")), "")
        made = [p.name for p in tmp_path.iterdir()]
        proc.send_signal(sig)
        try:
            _out, rest = proc.communicate(timeout=WAIT * 3)
        finally:
            proc.kill()  # (nothing if it ended)
    assert said and len(made) == 1 and made[0].startswith("bench-fmq-start-"), made
    assert proc.returncode == 128 + sig, rest
    assert list(tmp_path.iterdir()) == []
    assert "left " not in rest
