"""examples/spark_pipeline.py runs as its docstring says (its own process and JVM: slow)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from zerohub import sparkkit

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark_pipeline.py"


def test_spark_pipeline_example_counts_every_file() -> None:
    try:
        sparkkit.require()
    except sparkkit.SparkUnavailable as exc:
        pytest.skip(str(exc))
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=540
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split() for line in done.stdout.splitlines()[1:]]
    totals: dict[str, tuple[int, int]] = {}
    for _batch, extension, files, octets in rows:
        old = totals.get(extension, (0, 0))
        totals[extension] = (old[0] + int(files), old[1] + int(octets))
    assert totals == {"csv": (2, 32), "log": (2, 830), "txt": (1, 23)}
