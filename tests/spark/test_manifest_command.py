"""``filemq manifest --spark`` end to end in its own process (a second JVM: slow)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from filemq import manifest
from zerohub import sparkkit

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # a Spark job on a loaded 2-core machine


def test_manifest_command_on_spark(tmp_path: Path) -> None:
    try:
        sparkkit.require()
    except sparkkit.SparkUnavailable as exc:
        pytest.skip(str(exc))
    root = tmp_path / "tree"
    for i in range(6):
        (root / f"d{i % 2}").mkdir(parents=True, exist_ok=True)
        (root / f"d{i % 2}" / f"f{i}").write_bytes(b"x" * (i * 1000))
    out = tmp_path / "m"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "filemq",
            "manifest",
            "--spark",
            "--master",
            "local[2]",
            str(root),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert f"manifest {out}: 6 files, 15000 octets, 0 unreadable" in done.stderr
    assert manifest.read(out).to_pylist() == manifest.build(root)[0].to_pylist()
    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "filemq",
            "manifest",
            "diff",
            "--spark",
            "--master",
            "local[2]",
            str(out),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0 and again.stdout == "", again.stderr
