"""kill -9 while a packed (version 3) index is rewritten (a real writer process).

The writer loads the saved index (its rows stay packed columns) and saves it again and
again, as a server or ``filemq sync`` does when it stops; it is killed -9 at random
moments.  After each kill the index on disk loads, whole, with the tree's entries
(``save`` renames a finished temp file into place); the temp file the writer was filling
is left behind by the kill, and the next ``save`` removes it (it was kept for good, as
large as the index, one more per kill).
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from filemq.index import FileIndex
from tests.polling import wait_until

ROOT = Path(__file__).resolve().parents[2]
FILES = 1500

WRITER = """
import sys
from filemq.index import FileIndex
path, root = sys.argv[1], sys.argv[2]
index = FileIndex.load(path, root)
print("loaded", flush=True)
while True:
    index.dirty = True
    index.save(path)
"""


def temps(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.glob(f".{path.name}.*.tmp"))


def test_kill_9_mid_rewrite_leaves_a_whole_index_and_the_next_save_drops_its_temp(
    tmp_path: Path,
) -> None:
    root, saved = tmp_path / "tree", tmp_path / "state" / "index"
    for i in range(FILES):
        folder = root / f"d{i % 30}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"file-with-a-longish-name-{i:05d}.txt").write_bytes(b"%d" % i)
    index = FileIndex(root)
    index.refresh()
    index.save(saved)
    expected = {e.name: e for e in index.entries().values()}
    assert len(expected) == FILES

    rng = random.Random()
    left: list[str] = []
    for _trial in range(20):
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(saved), str(root)],
            stdout=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "loaded"
        time.sleep(rng.uniform(0.0, 0.05))  # jitter: a few saves in
        # killed as soon as a save's temp file is seen: while it is written (or just
        # renamed into place: then the next trial)
        assert wait_until(lambda: bool(temps(saved)), 10.0, step=0.0005)
        writer.send_signal(signal.SIGKILL)
        writer.wait(10)
        writer.stdout.close()

        loaded = FileIndex.load(saved, root)  # whole, never torn, never refused
        assert loaded.entries() == expected
        left = temps(saved)
        if left:
            break  # killed mid-save: its temp file stayed
    assert left == [f".index.{writer.pid}.tmp"], "no kill landed inside save()"

    loaded.dirty = True
    loaded.save(saved)  # the next save (a restarted server, the next sync)
    assert temps(saved) == []
    assert FileIndex.load(saved, root).entries() == expected


def test_a_running_writers_temp_file_is_left_alone(tmp_path: Path) -> None:
    """Only the temp files of writers that are gone are removed: a live one's (another
    process saving the same index right now) would make its rename fail."""
    root, saved = tmp_path / "tree", tmp_path / "state" / "index"
    (root / "a").mkdir(parents=True)
    (root / "a" / "f.txt").write_bytes(b"x")
    index = FileIndex(root)
    index.refresh()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        saved.parent.mkdir(parents=True)
        theirs = saved.parent / f".index.{alive.pid}.tmp"
        theirs.write_bytes(b"being written")
        other = saved.parent / ".index.notapid.tmp"  # not one of save()'s names
        other.write_bytes(b"someone else's")
        index.save(saved)
        assert theirs.read_bytes() == b"being written"
        assert other.exists()
    finally:
        alive.kill()
        alive.wait(10)
    index.save(saved)  # now its writer is gone
    assert not theirs.exists() and other.exists()
