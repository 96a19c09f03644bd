"""What ``filemq sync`` imports: a no-change resync of 10,000 files is as short as rsync's
only if the interpreter's start-up is too, so a sync loads no module it does not use."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from filemq.server import FileServer

from .conftest import read_tree, write_tree

#: Never imported by a plain ``filemq sync``: other commands' (asyncio, watchdog, Spark,
#: progress libraries), and what a helper used elsewhere drags in (shutil's bz2 and lzma,
#: tempfile; hashlib: a no-change sync reads no file).
_NOT_FOR_SYNC = (
    "asyncio", "zmq.asyncio", "watchdog", "pyarrow", "pyspark", "rich", "tqdm",
    "shutil", "tempfile", "bz2", "lzma", "hashlib", "filemq.server", "filemq.live",
)  # fmt: skip


def _imported(stderr: str) -> set[str]:
    return set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", stderr, re.M))


def test_a_no_change_sync_imports_only_what_it_uses(
    tmp_path: Path, serve: Callable[..., FileServer]
) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    write_tree(src, {f"d{i % 3}/f{i}.txt": b"%d" % i for i in range(30)})
    server = serve(src)
    cmd = [sys.executable, "-X", "importtime", "-m", "filemq", "-q", "sync", server.endpoint]
    cmd += [str(dest), "--once", "--index", str(tmp_path / "dest.idx")]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr[-2000:]
    assert read_tree(dest) == read_tree(src)
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    imported = _imported(again.stderr)
    assert {"filemq.client", "zmq"} <= imported  # (the listing is read)
    assert sorted(imported & set(_NOT_FOR_SYNC)) == []
