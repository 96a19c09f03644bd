"""A scripted (hostile) FILEMQ server cannot make the client write outside DEST."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq

from filemq import fmq_msg
from filemq.client import SyncError, SyncResult

from .conftest import read_tree

Script = Callable[[int, fmq_msg.Icanhaz], list[tuple[int, str, int, int, dict[str, str], bytes]]]
MARKER = (0, "", 0, 1, {"resync": "complete", "path": "/"}, b"")
_ids = itertools.count()


class ScriptedServer:
    """ROUTER test double: answers OHAI/ICANHAZ, then plays ``script(n, icanhaz)``."""

    def __init__(self, ctx: zmq.Context[Any], script: Script) -> None:
        self.script = script
        self.icanhaz: list[fmq_msg.Icanhaz] = []
        self.hugz = 0  # HUGZ answered (as the reference server does, with HUGZ-OK)
        self.router = ctx.socket(zmq.ROUTER)
        self.router.linger = 0
        self.router.bind("tcp://127.0.0.1:*")
        self.endpoint = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        address = f"inproc://scripted-{next(_ids)}"
        self._pipe = ctx.socket(zmq.PAIR)
        self._pipe.bind(address)
        self._peer = ctx.socket(zmq.PAIR)
        self._peer.connect(address)
        self._thread = threading.Thread(target=self._run, name="scripted-server")
        self._thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self._peer, zmq.POLLIN)
        seq: dict[bytes, int] = {}
        try:
            while True:
                events = dict(poller.poll(1000))
                if self._peer in events:
                    return
                if self.router not in events:
                    continue
                ident, *body = self.router.recv_multipart()
                msg = fmq_msg.decode(body)
                if isinstance(msg, fmq_msg.Hugz):
                    self.hugz += 1
                    self.router.send_multipart([ident, *fmq_msg.encode(fmq_msg.HugzOk())])
                elif isinstance(msg, fmq_msg.Ohai):
                    self.router.send_multipart([ident, *fmq_msg.encode(fmq_msg.OhaiOk())])
                elif isinstance(msg, fmq_msg.Icanhaz):
                    self.icanhaz.append(msg)
                    self.router.send_multipart([ident, *fmq_msg.encode(fmq_msg.IcanhazOk())])
                    for op, name, offset, eof, headers, data in self.script(
                        len(self.icanhaz), msg
                    ):
                        n = seq.get(ident, 0)
                        seq[ident] = n + 1
                        out = fmq_msg.Cheezburger(n, op, name, offset, eof, headers, data)
                        self.router.send_multipart([ident, *fmq_msg.encode(out)])
        finally:
            self.router.close()
            self._peer.close()

    def stop(self) -> None:
        self._pipe.send(b"STOP")
        self._thread.join(5)
        self._pipe.close()


@pytest.fixture
def scripted(zctx: zmq.Context[Any]) -> Any:
    servers: list[ScriptedServer] = []

    def start(script: Script) -> ScriptedServer:
        servers.append(ScriptedServer(zctx, script))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


def _sha1(data: bytes) -> str:
    import hashlib

    return hashlib.sha1(data).hexdigest()


def _file(name: str, data: bytes) -> tuple[int, str, int, int, dict[str, str], bytes]:
    return (1, name, 0, 1, {"sha1": _sha1(data), "size": str(len(data))}, data)


def test_escaping_names_are_refused(
    tmp_path: Path, scripted: Any, sync_once: Callable[..., SyncResult]
) -> None:
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    dest.mkdir()
    outside.mkdir()
    (dest / "link").symlink_to(outside)
    (dest / "afile").write_bytes(b"I am a file")
    (dest / "adir").mkdir()
    keep = tmp_path / "keep"  # a link to it inside adir: replacing adir must not follow it
    keep.mkdir()
    (keep / "precious").write_bytes(b"not DEST's")
    (dest / "adir" / "to-keep").symlink_to(keep)
    evil = [
        "/../escape",
        "/a/../../escape2",
        "/link/pwned",
        "/link/../../escape3",
        "/sub/..\\..\\escape4",
        "/nul\x00byte",
        "/afile/child",
        "/.filemq-part-1-1",
        "/.filemq-part-lock",
        "/" + str(outside / "abs"),
    ]
    server = scripted(
        lambda n, req: (
            [_file(name, b"evil") for name in evil]
            + [(2, "/link/victim", 0, 1, {}, b""), _file("/ok.txt", b"fine")]
            + [_file("/adir", b"over a folder"), MARKER]  # a file where DEST has a folder
        )
    )
    result = sync_once(server.endpoint, dest)
    # every evil name refused; the delete through the link failed
    assert result.refused == len(evil) and result.errors == len(evil) + 1
    assert result.synced
    assert list(outside.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest", "keep", "outside"]
    # the verified file replaced the folder (a mirror), without following the link in it
    assert read_tree(dest) == {
        "ok.txt": b"fine",
        "afile": b"I am a file",
        "adir": b"over a folder",
    }
    assert (keep / "precious").read_bytes() == b"not DEST's"
    assert (dest / "link").is_symlink()


def test_bad_offsets_abort_without_writing(
    tmp_path: Path, scripted: Any, sync_once: Callable[..., SyncResult]
) -> None:
    dest = tmp_path / "dest"
    server = scripted(
        lambda n, req: [(1, "/f", 0, 0, {}, b"abc"), (1, "/f", 100, 1, {}, b"xyz"), MARKER]
    )
    with pytest.raises(SyncError):
        sync_once(server.endpoint, dest, max_retries=1)
    assert len(server.icanhaz) == 2  # reconnected once, then gave up
    assert list(dest.iterdir()) == []  # no partial file, no temp file


def test_sha1_mismatch_fetches_again(
    tmp_path: Path, scripted: Any, sync_once: Callable[..., SyncResult]
) -> None:
    good = b"the real content"

    def script(n: int, req: fmq_msg.Icanhaz) -> list[Any]:
        if n == 1:  # first answer corrupt: right size, wrong digest
            return [
                (1, "/f.txt", 0, 1, {"sha1": _sha1(b"x"), "size": str(len(good))}, good),
                MARKER,
            ]
        assert req.path == "/f.txt"
        return [_file("/f.txt", good), (0, "", 0, 1, {"resync": "complete"}, b"")]

    result = sync_once(scripted(script).endpoint, tmp_path / "dest")
    assert result.refetched == 1 and result.files == 1 and result.synced
    assert read_tree(tmp_path / "dest") == {"f.txt": good}


def test_wrong_size_never_replaces_existing_file(
    tmp_path: Path, scripted: Any, sync_once: Callable[..., SyncResult]
) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "f").write_bytes(b"old")
    server = scripted(lambda n, req: [(1, "/f", 0, 1, {"size": "99"}, b"truncated"), MARKER])
    result = sync_once(server.endpoint, dest)
    assert result.errors == 1 and (dest / "f").read_bytes() == b"old"


def test_peer_without_marker_ends_by_idle_timeout(
    tmp_path: Path, scripted: Any, sync_once: Callable[..., SyncResult]
) -> None:
    server = scripted(lambda n, req: [_file("/a", b"1")])
    result = sync_once(server.endpoint, tmp_path / "d", idle_timeout=0.3)
    assert result.synced and not result.marker and result.files == 1


def test_saved_index_goes_out_first_and_differences_follow(
    tmp_path: Path, scripted: Any, sync_once: Callable[..., SyncResult]
) -> None:
    """ICANHAZ carries the saved index; a file changed behind it gets an ICANHAZ of its own."""
    dest, idx = tmp_path / "dest", tmp_path / "mirror.idx"
    first = scripted(lambda n, req: [_file("/a", b"server"), _file("/b", b"bee"), MARKER])
    assert sync_once(first.endpoint, dest, index_path=idx).files == 2
    (dest / "a").write_bytes(b"edited in DEST")

    def script(n: int, req: fmq_msg.Icanhaz) -> list[Any]:
        if n == 1:
            return [MARKER]  # the saved index says DEST is up to date
        return [_file("/a", b"server"), (0, "", 0, 1, {"resync": "complete", "path": "/a"}, b"")]

    second = scripted(script)
    result = sync_once(second.endpoint, dest, index_path=idx)
    assert [req.path for req in second.icanhaz] == ["/", "/a"]
    assert second.icanhaz[0].cache == {"a": _sha1(b"server"), "b": _sha1(b"bee")}
    assert second.icanhaz[1].cache == {"/a": _sha1(b"edited in DEST")}
    assert result.synced and result.files == 1
    assert read_tree(dest) == {"a": b"server", "b": b"bee"}


def test_both_file_endings_and_the_two_together(
    tmp_path: Path, scripted: Any, sync_once: Callable[..., SyncResult]
) -> None:
    """eof on the last data chunk; eof on an extra empty chunk; both (an empty chunk after eof).

    The empty chunk after an ended file is dropped: no empty new version, no protocol error.
    """
    a, b, c = b"hello world", b"reference style", b"both endings"

    def end(data: bytes) -> dict[str, str]:
        return {"sha1": _sha1(data), "size": str(len(data))}

    server = scripted(
        lambda n, req: [
            (1, "/a", 0, 0, {}, a[:6]),
            (1, "/a", 6, 1, end(a), a[6:]),  # spec: eof on the last data chunk
            (1, "/b", 0, 0, {}, b[:4]),
            (1, "/b", 4, 0, {}, b[4:]),
            (1, "/b", len(b), 1, end(b), b""),  # reference: an empty chunk ends it
            (1, "/c", 0, 1, end(c), c),
            (1, "/c", len(c), 1, {}, b""),  # both: eof, then the empty chunk as well
            (1, "/e", 0, 1, end(b""), b""),  # an empty file
            MARKER,
        ]
    )
    result = sync_once(server.endpoint, tmp_path / "d", max_retries=0)
    assert (result.files, result.errors, result.refetched) == (4, 0, 0)
    assert read_tree(tmp_path / "d") == {"a": a, "b": b, "c": c, "e": b""}
    assert len(server.icanhaz) == 1  # one session: no protocol error, no refetch


def _sync_process(tmp_path: Path, endpoint: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    return subprocess.run(
        [sys.executable, "-m", "filemq", "sync", endpoint, str(tmp_path / "d"), "--once", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_sync_once_without_marker_ends_though_heartbeats_are_answered(
    tmp_path: Path, scripted: Any
) -> None:
    """Idle means no file traffic: HUGZ-OK answers (every 0.1 s here) do not keep it alive."""
    server = scripted(lambda n, req: [_file("/a", b"only file")])  # and never a marker
    done = _sync_process(tmp_path, server.endpoint, "--heartbeat", "0.1", "--idle-timeout", "1")
    assert done.returncode == 0, done.stderr
    assert read_tree(tmp_path / "d") == {"a": b"only file"}
    assert server.hugz >= 2  # heartbeats went on, and were answered, while it idled
    said = [line for line in done.stderr.splitlines() if "resync-complete marker" in line]
    assert len(said) == 1 and "1.0 s without file traffic" in said[0], done.stderr
    assert "Traceback" not in done.stderr


def test_sync_once_server_stalled_mid_file_gives_up(tmp_path: Path, scripted: Any) -> None:
    """A server that stops in the middle of a file but answers heartbeats: exit 1, no file."""
    server = scripted(lambda n, req: [(1, "/big", 0, 0, {}, b"first part of it")])
    done = _sync_process(
        tmp_path,
        server.endpoint,
        "--heartbeat",
        "0.1",
        "--idle-timeout",
        "1",
        "--retries",
        "0",
    )
    assert done.returncode == 1, done.stderr
    assert "in the middle of a file" in done.stderr and "Traceback" not in done.stderr
    assert server.hugz >= 2
    assert not list((tmp_path / "d").iterdir())  # no partial file, no temp file
