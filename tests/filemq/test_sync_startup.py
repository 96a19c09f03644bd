"""What ``filemq sync`` imports: a no-change resync of 10,000 files is as short as rsync's
only if the interpreter's start-up is too, so a sync loads no module it does not use."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from filemq.client import default_index_path
from filemq.server import FileServer
from filemq.state import path_key, server_index_path

from .conftest import read_tree, write_tree

#: Never imported by a plain ``filemq sync``: other commands' (asyncio, watchdog, Spark,
#: progress libraries, the broker), and what a helper used elsewhere drags in (shutil's bz2
#: and lzma, tempfile; hashlib and OpenSSL: a no-change sync reads no file, and the default
#: index path's name is hashed without them, ~3 ms; session 19), and what only a transfer
#: or an option needs (the direct-I/O writer, the bandwidth cap).
_NOT_FOR_SYNC = (
    "asyncio", "zmq.asyncio", "watchdog", "pyarrow", "pyspark", "rich", "tqdm", "pathspec",
    "shutil", "tempfile", "bz2", "lzma", "hashlib", "_hashlib", "filemq.server",
    "filemq.live", "filemq.publisher", "filemq.manifest", "filemq.stagedwriter",
    "filemq.ratelimit", "broker", "zerohub.hub", "zmq.auth",
)  # fmt: skip


def _imported(stderr: str) -> set[str]:
    return set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", stderr, re.M))


@pytest.mark.parametrize("index", ["--index", "default"])
def test_a_no_change_sync_imports_only_what_it_uses(
    tmp_path: Path, serve: Callable[..., FileServer], index: str
) -> None:
    """With ``--index FILE`` and with the default index path (its name is a hash)."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    write_tree(src, {f"d{i % 3}/f{i}.txt": b"%d" % i for i in range(30)})
    server = serve(src)
    cmd = [sys.executable, "-X", "importtime", "-m", "filemq", "-q", "sync", server.endpoint]
    cmd += [str(dest), "--once"]
    if index == "--index":
        cmd += ["--index", str(tmp_path / "dest.idx")]
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    assert read_tree(dest) == read_tree(src)
    if index == "default":  # (saved where the default path says: the resync reads it)
        saved = tmp_path / "cache" / "filemq" / "mirrors" / default_index_path(dest).name
        assert saved.is_file()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert again.returncode == 0, again.stderr[-2000:]
    imported = _imported(again.stderr)
    assert {"filemq.client", "zmq"} <= imported  # (the listing is read)
    assert sorted(imported & set(_NOT_FOR_SYNC)) == []


def test_index_file_names_are_the_sha1_they_always_were(tmp_path: Path) -> None:
    """``path_key`` (no OpenSSL) names the index files as ``hashlib``'s SHA-1 did: an
    upgrade finds the indexes the last version saved."""
    for ident in (b"", b"/srv/public", "/caf\u00e9/\u6587".encode(), bytes(range(256)) * 40):
        assert path_key(ident) == hashlib.sha1(ident).hexdigest()[:20]
    real = os.fsencode(os.path.realpath(tmp_path))
    assert default_index_path(tmp_path).name == hashlib.sha1(real).hexdigest()[:20] + ".idx"
    ident = real + b"\0/pub/"
    name = server_index_path(tmp_path / "state", tmp_path, "/pub/").name
    assert name == hashlib.sha1(ident).hexdigest()[:20] + ".idx"
