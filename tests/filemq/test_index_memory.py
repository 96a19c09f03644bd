"""What a loaded FILEMQ index costs in memory per file (issue 15: a 100,000-file resync).

Measured with tracemalloc (allocation sizes are deterministic, unlike RSS or time)."""

from __future__ import annotations

import gc
import os
import tracemalloc
from pathlib import Path

from filemq.index import FileIndex

COUNT = 1000


def test_a_loaded_index_keeps_its_rows_packed_and_costs_at_most_160_octets_a_file(
    tmp_path: Path,
) -> None:
    """Names of 21 characters (``d0001/file0000001.dat``), two modes: a loaded row is
    its name in a sorted list plus 48 octets of columns (a ``FileEntry`` in a dict was
    ~350 octets a file, ~550 at the peak of the load); a resync cache taken from it
    (``digests``) is a snapshot of the rows, not a dict of every name (26 octets a
    file before)."""
    root = tmp_path / "root"
    for i in range(COUNT):
        path = root / f"d{i % 30:04d}" / f"file{i:07d}.dat"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(i.to_bytes(8, "little"))
        os.chmod(path, 0o644 if i % 2 else 0o640)
    index = FileIndex(root)
    index.refresh()
    index.save(tmp_path / "index")
    gc.collect()
    tracemalloc.start()
    try:
        loaded = FileIndex.load(tmp_path / "index", root)
        octets, peak = tracemalloc.get_traced_memory()
        cache = loaded.digests()
        cache_octets = tracemalloc.get_traced_memory()[0] - octets
    finally:
        tracemalloc.stop()
    assert loaded.entries() == index.entries()  # nothing lost on the way
    assert dict(cache.items()) == {e.name: e.sha1 for e in index}
    assert {entry.mode for entry in loaded} == {0o644, 0o640}
    assert octets / COUNT <= 160, f"{octets / COUNT:.0f} octets a file"
    assert peak / COUNT <= 300, f"{peak / COUNT:.0f} octets a file at the peak of the load"
    assert cache_octets / COUNT <= 8, f"{cache_octets / COUNT:.0f} octets a file for a cache"
