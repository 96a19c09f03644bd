"""``filemq manifest --spark``: the Spark job's manifest equals one made in one process."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from filemq import manifest
from filemq.index import FileIndex
from filemq.manifest_spark import build_on_spark, diff_on_spark

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]  # a loaded 2-core machine


def _tree(root: Path, folders: int = 12, per_folder: int = 5) -> None:
    """Files of several sizes on three levels, plus what a manifest leaves out."""
    for f in range(folders):
        folder = root / f"d{f}" / ("deep" if f % 3 == 0 else "")
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_folder):
            (folder / f"file{i}.bin").write_bytes(os.urandom(f * 997 + i * 131))
    (root / "top.txt").write_text("top\n")
    (root / "empty").write_bytes(b"")
    (root / "link").symlink_to("/etc/passwd")  # never followed nor listed
    (root / ".filemq-part-1-2").write_bytes(b"a download in progress")


def test_spark_manifest_equals_single_process_hashing(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "tree"
    _tree(root)
    out = tmp_path / "manifest"
    stats = build_on_spark(spark, root, str(out))
    made = manifest.read(out)
    local, local_stats = manifest.build(root)
    assert made.to_pylist() == local.to_pylist()
    assert stats == local_stats
    assert stats.files == 12 * 5 + 3 and stats.unreadable == 0  # the part file counts
    # an oracle apart from the manifest code: the FILEMQ index's SHA-1 of the same tree
    index = FileIndex(root)
    index.refresh()
    assert {r["path"]: r["sha1"] for r in made.to_pylist()} == {e.name: e.sha1 for e in index}


def test_spark_job_refuses_an_existing_out(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "tree"
    _tree(root, folders=2, per_folder=1)
    out = tmp_path / "manifest"
    out.mkdir()
    with pytest.raises(manifest.ManifestError, match="already exists"):
        build_on_spark(spark, root, str(out))


def test_spark_diff_equals_the_local_diff(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "tree"
    _tree(root, folders=3, per_folder=3)
    before = tmp_path / "before.parquet"
    table, _ = manifest.build(root)
    manifest.write(table, before)
    (root / "d1" / "file0.bin").write_bytes(b"new content")  # changed
    (root / "d2" / "file1.bin").unlink()  # removed
    (root / "d2" / "added.txt").write_text("added")  # added
    st = (root / "top.txt").stat()
    os.utime(root / "top.txt", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched
    after = tmp_path / "after"
    build_on_spark(spark, root, str(after))
    on_spark = [
        (r["change"], r["path"]) for r in diff_on_spark(spark, str(before), str(after)).collect()
    ]
    local = [(c.value, p) for c, p in manifest.diff(before, after)]
    assert (
        local
        == on_spark
        == [
            ("changed", "d1/file0.bin"),
            ("added", "d2/added.txt"),
            ("removed", "d2/file1.bin"),
            ("touched", "top.txt"),
        ]
    )
