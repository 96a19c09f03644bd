"""Resume, listings and progress (i13-resume) together with metadata, patterns and the
dry run (i13-meta): where the two meet.

* a file's version headers (and ``mode``) stay on its first and last chunks when the
  resync plan headers ride on it; folders, links and touches are not counted as files;
* a listing's options never become the session's (its live changes keep the
  subscription's patterns and policy);
* a resumed file gets the server's mode and mtime like any other, after the check;
  partial files are private (0600) until then, as temp files are;
* a dry run proves no partial file (proving drops or truncates) and offers none;
* the progress totals count only what the mirror's patterns admit.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filemq import fmq_msg
from filemq.client import SyncClient, SyncResult
from filemq.engine import Operation, load_wire
from filemq.engine_server import FileOp, ServerSession, plan_headers
from filemq.filters import Filters
from filemq.index import FileEntry, FileIndex
from filemq.meta import EntryMeta, Kind
from filemq.mirror import PARTIAL_PREFIX, Mirror
from filemq.offer import touch_op
from filemq.server import FileServer

from .conftest import write_tree

Serve = Callable[..., FileServer]
Sync = Callable[..., SyncResult]
WIRE = load_wire("spec")
A = "a" * 40
MTIME = 1_600_000_000_123_456_789


def sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def ready_server(chunk_size: int = 300, options: dict[str, str] | None = None) -> ServerSession:
    s = ServerSession(WIRE, b"c", 0.0, chunk_size=chunk_size)
    s.receive(fmq_msg.encode(fmq_msg.Ohai()), 0.0)
    icanhaz = fmq_msg.Icanhaz("/", {"RESYNC": "1", **(options or {})}, {})
    s.receive(fmq_msg.encode(icanhaz), 0.0)
    s.receive(fmq_msg.encode(fmq_msg.Nom(1 << 20, 0)), 0.0)
    return s


def drain(s: ServerSession, content: bytes = b"") -> list[Any]:
    out = []
    while (plan := s.next_chunk()) is not None:
        data = content[plan.offset : plan.offset + plan.size]
        out.append(fmq_msg.decode(s.chunk_frames(plan, data)))
    return out


# -- engines ----------------------------------------------------------------------------


def test_plan_headers_on_a_file_leave_its_version_and_mode_on_first_and_last_chunks() -> None:
    s = ready_server()
    s.enqueue(plan_headers([FileOp("/f", Operation.CREATE, "src/f", 500, 7, A, mode=0o751)]))
    first, last = drain(s, bytes(500))
    version = {"sha1": A, "size": "500", "mtime_ns": "7", "mode": "751"}
    assert first.headers == {**version, "resync-files": "1", "resync-bytes": "500"}
    assert last.headers == version and last.eof


def test_folders_links_and_touches_keep_their_own_headers_and_are_not_planned_files() -> None:
    folder = FileOp("/d", Operation.CREATE, headers=(("kind", "dir"), ("mode", "755")))
    entry = FileEntry("t", 3, 9, 1, A, 0o600)
    ops = plan_headers(
        [folder, FileOp("/f", Operation.CREATE, "src/f", 10, 7, A), touch_op("/t", entry)]
    )
    assert dict(ops[0].headers)["resync-files"] == "1"  # the file only
    assert dict(ops[0].headers)["resync-bytes"] == "10"
    s = ready_server()
    s.enqueue(ops)
    d, f, t = drain(s, bytes(10))
    assert d.headers == {"kind": "dir", "mode": "755", "resync-files": "1", "resync-bytes": "10"}
    assert f.headers == {"sha1": A, "size": "10", "mtime_ns": "7"}
    assert t.headers == {"touch": "1", "sha1": A, "size": "3", "mtime_ns": "9", "mode": "600"}


def test_a_listing_does_not_change_the_sessions_patterns_or_link_policy() -> None:
    s = ready_server(options={"META": "777", "LINKS": "links", "FILTER": "*.log"})
    assert s.filters is not None and s.wants("/keep.txt") and not s.wants("/x.log")
    listing = fmq_msg.Icanhaz("/", {"RESYNC": "1", "LIST": "1", "LINKS": "copy"}, {})
    s.receive(fmq_msg.encode(listing), 0.0)
    assert (s.meta, s.links.value) == (0o777, "links")
    assert not s.wants("/x.log")  # the subscription's patterns still hold
    bad = fmq_msg.Icanhaz("/", {"RESYNC": "1", "LIST": "1", "META": "12"}, {})
    [reply] = s.receive(fmq_msg.encode(bad), 0.0)
    assert isinstance(fmq_msg.decode(reply.frames), fmq_msg.Srsly)


def test_a_stat_carries_the_mode() -> None:
    s = ready_server()
    s.enqueue([FileOp("/f", Operation.STAT, "src/f", 10, 7, A, mode=0o640)])
    [msg] = drain(s)
    assert msg.headers == {"sha1": A, "size": "10", "mtime_ns": "7", "mode": "640"}


# -- the mirror ---------------------------------------------------------------------------


def test_a_resumed_file_gets_mode_and_mtime_and_its_partial_file_is_private(
    tmp_path: Path,
) -> None:
    content = os.urandom(3 << 20)
    version = {"sha1": sha1(content), "size": str(len(content)), "mtime_ns": str(MTIME)}
    old = os.umask(0)  # the partial file's mode is the code's, not the umask's
    try:
        mirror = Mirror(tmp_path, FileIndex(tmp_path), resume_min=1)
        mirror.begin(("big.bin",), str(tmp_path / "big.bin"), version)
        mirror.write(content[: 2 << 20])
        mirror.abort()
    finally:
        os.umask(old)
    kept = [p for p in tmp_path.iterdir() if p.name.startswith(PARTIAL_PREFIX)]
    assert len(kept) == 2  # the data and its journal, both for the mirror only
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in kept)
    mirror = Mirror(tmp_path, FileIndex(tmp_path), resume_min=1)
    [point] = mirror.resume_points()
    assert mirror.resume(("big.bin",), str(tmp_path / "big.bin"), point.offset, version) == ""
    mirror.write(content[point.offset :])
    meta = EntryMeta(Kind.FILE, 0o751, MTIME)
    assert mirror.finish({**version, "mode": "751"}, meta) == (True, "")
    st = (tmp_path / "big.bin").stat()
    assert (stat.S_IMODE(st.st_mode), st.st_mtime_ns) == (0o751, MTIME)
    entry = mirror.index.get("big.bin")
    assert entry is not None and entry.mode == 0o751
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.bin"]


# -- end to end ---------------------------------------------------------------------------


def _interrupted(dest: Path, name: str, content: bytes, upto: int, mtime_ns: int) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    mirror = Mirror(dest, FileIndex(dest), resume_min=1)
    version = {"sha1": sha1(content), "size": str(len(content)), "mtime_ns": str(mtime_ns)}
    mirror.begin((name,), str(dest / name), version)
    mirror.write(content[:upto])
    mirror.abort()


def test_sync_resumes_and_the_file_keeps_the_servers_mode_and_mtime(
    tmp_path: Path, serve: Serve, sync_once: Sync
) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    content = os.urandom(3 << 20)
    write_tree(src, {"big.bin": content})
    (src / "big.bin").chmod(0o741)
    os.utime(src / "big.bin", ns=(MTIME, MTIME))
    _interrupted(dest, "big.bin", content, 2 << 20, MTIME)
    server = serve(src)
    result = sync_once(server.endpoint, dest, resume_min=1)
    assert result.resumed_bytes >= 1 << 20 and result.errors == 0
    assert (dest / "big.bin").read_bytes() == content
    st = (dest / "big.bin").stat()
    assert (stat.S_IMODE(st.st_mode), st.st_mtime_ns) == (0o741, MTIME)
    assert sorted(p.name for p in dest.iterdir() if p.name.startswith(PARTIAL_PREFIX)) == []


def test_a_dry_run_leaves_partial_files_alone_and_offers_none(
    tmp_path: Path, serve: Serve, sync_once: Sync
) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    content = os.urandom(3 << 20)
    write_tree(src, {"big.bin": content})
    # one partial file of this version, one of a version the server does not have
    _interrupted(dest, "big.bin", content, 2 << 20, MTIME)
    _interrupted(dest, "gone.bin", os.urandom(2 << 20), 1 << 20, MTIME)
    before = {p.name: p.read_bytes() for p in dest.iterdir()}
    server = serve(src)
    plan = io.StringIO()
    result = sync_once(server.endpoint, dest, resume_min=1, dry_run=True, plan=plan)
    assert result.resumed_bytes == 0 and result.errors == 0
    assert "create big.bin" in plan.getvalue()
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == before
    server.stop()
    assert server.sent_bytes == len(content)  # offered nothing: sent from byte 0


def test_progress_totals_count_only_the_files_the_patterns_admit(
    tmp_path: Path, serve: Serve, zctx: Any
) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    write_tree(src, {"a.txt": b"a" * 100, "b.log": b"b" * 5000, "sub/c.txt": b"c" * 10})
    (src / "empty").mkdir()
    server = serve(src)
    client = SyncClient(
        zctx,
        server.endpoint,
        dest,
        once=True,
        connect_timeout=5.0,
        idle_timeout=5.0,
        filters=Filters.from_options([("exclude", "*.log")], []),
    )
    result = client.run()
    assert result.errors == 0 and (dest / "empty").is_dir() and not (dest / "b.log").exists()
    progress = client._progress
    assert (progress.total_files, progress.total_bytes) == (2, 110)
    assert (progress.files, progress.bytes) == (2, 110)
