"""Random trees of small files mirrored exactly through the per-file paths of session
19 (the receiving thread's whole-file path, the placer's staged hand-over: ``--placer
thread``) and through the same files placed inline (``--placer inline``): both DESTs
hold SRC's bytes, mtimes and modes, and both indexes say the same of every file.

The sizes cover an empty file, 1 byte, one under, exactly, and one over the server's
chunk (``--chunk-size``: a file of exactly one chunk goes whole; one over goes in two
chunks, the general path, between whole files); the names need escapes on a shell or in
a URL (space, ``%``, ``#``, ``'``, non-ASCII)."""

from __future__ import annotations

import os
import random
import stat
from pathlib import Path

import pytest

from filemq.state import load_index

from .conftest import write_tree
from .test_subscribe_cli import Proc, files, procs, serve

__all__ = ["procs"]  # (the fixture, shared with test_subscribe_cli)

CHUNK = 4096
_SIZES = [0, 1, 2, CHUNK - 1, CHUNK, CHUNK + 1, 777]
_NAMES = ["a b", "100%", "#tag", "it's", "é", "日本", "x.dat", "-dash", "plain"]


def _tree(seed: int) -> dict[str, bytes]:
    rng = random.Random(seed)
    tree: dict[str, bytes] = {}
    for i in range(120):
        folder = rng.choice(["", "d1/", "d 2/", "é/", "d1/deep/"])
        name = f"{folder}{rng.choice(_NAMES)}{i}"
        tree[name] = rng.randbytes(rng.choice(_SIZES))
    return tree


def _stamp(src: Path, seed: int) -> None:
    rng = random.Random(seed)
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        ns = rng.randrange(1, 2_000_000_000) * 1_000_000_000 + rng.randrange(1_000_000_000)
        os.utime(path, ns=(ns, ns))
        path.chmod(rng.choice([0o600, 0o644, 0o640, 0o755]))


def _attrs(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for path in root.rglob("*"):
        if path.is_file() and not path.name.startswith(".filemq-"):
            st = path.stat()
            out[path.relative_to(root).as_posix()] = (st.st_mtime_ns, stat.S_IMODE(st.st_mode))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_whole_and_chunked_small_files_mirror_exactly_on_both_placers(
    tmp_path: Path, procs: list[Proc], seed: int
) -> None:
    tree = _tree(seed)
    src = tmp_path / "src"
    write_tree(src, tree)
    _stamp(src, seed)
    server = serve(tmp_path, procs, src, "tcp://127.0.0.1:*", "--chunk-size", str(CHUNK))
    endpoint = server.wait_stderr(r"on (tcp://\S+) \(").group(1)
    indexes = {}
    for placer in ("thread", "inline"):
        dest, index = tmp_path / f"dest-{placer}", tmp_path / f"{placer}.idx"
        args = ["sync", endpoint, str(dest), "--once", "--index", str(index), "--placer", placer]
        sync = Proc(tmp_path, f"sync-{placer}", *args)
        procs.append(sync)
        assert sync.popen.wait(120) == 0, sync.stderr()
        assert files(dest) == tree
        assert _attrs(dest) == _attrs(src)
        loaded = load_index(index, dest)
        indexes[placer] = {e.name: (e.size, e.mtime_ns, e.sha1, e.mode) for e in loaded}
        assert set(indexes[placer]) == set(tree)
    assert indexes["thread"] == indexes["inline"]
