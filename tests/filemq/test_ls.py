"""``filemq ls``: what a server publishes, with sizes, mtimes and SHA-1s, copying nothing."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from filemq import fmq_msg
from filemq.client import SyncError, SyncRefused
from filemq.engine_client import FileListed
from filemq.filters import Filters
from filemq.lister import ListedFile, list_files
from filemq.server import FileServer
from tests.polling import WAIT
from zerohub.zmqkit import new_certificate

from .conftest import write_tree

Serve = Callable[..., FileServer]

TREE = {"a.txt": b"alpha", "sub/b.bin": b"b" * 300_000, "sub/deep/c": b"", "z z.txt": b"zed"}


def sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def expected(src: Path, prefix: str = "/") -> list[ListedFile]:
    return [
        ListedFile(
            prefix + name,
            len(data),
            (src / name).stat().st_mtime_ns,
            sha1(data),
            {},
            (src / name).stat().st_mode & 0o7777,
        )
        for name, data in sorted(TREE.items())
    ]


def test_listing_names_every_file_and_sends_no_content(
    tmp_path: Path, serve: Serve, zctx: zmq.Context[Any]
) -> None:
    src = tmp_path / "src"
    write_tree(src, TREE)
    server = serve(src, chunk_size=1000)
    assert list_files(zctx, server.endpoint) == expected(src)
    sub = list_files(zctx, server.endpoint, "/sub")
    assert [f.path for f in sub] == ["/sub/b.bin", "/sub/deep/c"]
    assert list_files(zctx, server.endpoint, "/nothing/here") == []
    server.stop()
    assert server.sent_bytes == 0  # not one byte of content


def test_listing_of_mounts_at_virtual_paths(
    tmp_path: Path, serve: Serve, zctx: zmq.Context[Any]
) -> None:
    write_tree(tmp_path / "docs", {"d.txt": b"doc"})
    write_tree(tmp_path / "pics", {"p.jpg": b"pic"})
    server = serve((tmp_path / "docs", "/docs"), (tmp_path / "pics", "/media/pics"))
    assert [f.path for f in list_files(zctx, server.endpoint)] == [
        "/docs/d.txt",
        "/media/pics/p.jpg",
    ]
    assert [f.path for f in list_files(zctx, server.endpoint, "/media")] == ["/media/pics/p.jpg"]


def test_listing_shows_modes_and_what_the_server_publishes_files_only(
    tmp_path: Path, serve: Serve, zctx: zmq.Context[Any]
) -> None:
    """A listing is the server's view: its own patterns apply (an excluded name is not
    published), folders (even empty ones) and links are not listed, modes are."""
    src = tmp_path / "src"
    write_tree(src, {"keep.txt": b"k", "run.sh": b"#!/bin/sh\n", "noise.log": b"n"})
    (src / "run.sh").chmod(0o750)
    (src / "keep.txt").chmod(0o604)
    (src / "empty").mkdir()
    (src / "link").symlink_to("keep.txt")
    server = serve(src, filters=Filters.from_options([("exclude", "*.log")], []))
    listed = list_files(zctx, server.endpoint)
    assert [(f.path, f.mode) for f in listed] == [("/keep.txt", 0o604), ("/run.sh", 0o750)]
    assert all("kind" not in f.headers for f in listed)


def test_a_listing_with_a_garbage_mode_header_keeps_the_entry_without_a_mode() -> None:
    entry = FileListed("x", {"sha1": "a" * 40, "size": "1", "mtime_ns": "5", "mode": "9z"})
    assert ListedFile.from_stat("/", entry) == ListedFile("/x", 1, 5, "a" * 40, {}, -1)


class Unaware:
    """A FILEMQ server that knows nothing of LIST (or of sending only what it may): it
    answers every ICANHAZ with a file's content, as far as the credit it got allows.
    Records the NOM credit it received."""

    def __init__(self, ctx: zmq.Context[Any], *, send: bool = True) -> None:
        self.credit: list[int] = []
        self.router = ctx.socket(zmq.ROUTER)
        self.router.linger = 0
        self.router.bind("tcp://127.0.0.1:*")
        self.endpoint = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.send = send
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="unaware-server")
        self._thread.start()

    def _run(self) -> None:
        seq = 0
        try:
            while not self._stop.is_set():
                if not self.router.poll(50):
                    continue
                ident, *body = self.router.recv_multipart()
                msg = fmq_msg.decode(body)
                reply: list[Any] = []
                if isinstance(msg, fmq_msg.Ohai):
                    reply = [fmq_msg.OhaiOk()]
                elif isinstance(msg, fmq_msg.Hugz):
                    reply = [fmq_msg.HugzOk()]
                elif isinstance(msg, fmq_msg.Icanhaz):
                    reply = [fmq_msg.IcanhazOk()]
                elif isinstance(msg, fmq_msg.Nom):
                    self.credit.append(msg.credit)
                    if self.send:  # spends its credit on a file's content
                        data = b"S" * msg.credit
                        reply = [fmq_msg.Cheezburger(seq, 1, "/secret", 0, 0, {}, data)]
                        seq += 1
                for out in reply:
                    self.router.send_multipart([ident, *fmq_msg.encode(out)])
        finally:
            self.router.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def unaware(zctx: zmq.Context[Any]) -> Iterator[Callable[..., Unaware]]:
    made: list[Unaware] = []

    def make(**kwargs: Any) -> Unaware:
        made.append(Unaware(zctx, **kwargs))
        return made[-1]

    yield make
    for server in made:
        server.stop()


def test_a_server_without_list_gets_one_byte_of_credit_and_the_lister_stops(
    zctx: zmq.Context[Any], unaware: Callable[..., Unaware]
) -> None:
    server = unaware()
    with pytest.raises(SyncError, match="LIST"):
        list_files(zctx, server.endpoint, timeout=5)
    assert server.credit == [1]  # the most content it could ever send: one byte


def test_a_server_that_never_lists_ends_the_listing_after_the_timeout(
    zctx: zmq.Context[Any], unaware: Callable[..., Unaware]
) -> None:
    server = unaware(send=False)  # (answers heartbeats: alive, but lists nothing)
    with pytest.raises(SyncError, match="support LIST"):
        list_files(zctx, server.endpoint, timeout=0.5)


def test_curve_listing_allowed_and_refused(
    tmp_path: Path, serve: Serve, zctx: zmq.Context[Any]
) -> None:
    keys, allowed = tmp_path / "keys", tmp_path / "allowed"
    server_pub, server_sec = new_certificate("server", keys)
    good_pub, good_sec = new_certificate("good", keys)
    allowed.mkdir()
    (allowed / "good.key").write_bytes(good_pub.read_bytes())
    write_tree(tmp_path / "src", TREE)
    server = serve(tmp_path / "src", curve_secret=server_sec, allow_dir=allowed)
    listed = list_files(zctx, server.endpoint, curve_secret=good_sec, server_key=server_pub)
    assert listed == expected(tmp_path / "src")
    with pytest.raises(SyncRefused, match="requires CURVE"):
        list_files(zctx, server.endpoint, timeout=WAIT)


# -- the command ------------------------------------------------------------------------------


def _ls(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "filemq", "ls", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TZ": "UTC"},
    )


def test_ls_command_lines_and_json(tmp_path: Path, serve: Serve) -> None:
    src = tmp_path / "src"
    write_tree(src, TREE)
    os.utime(src / "a.txt", ns=(0, 1_700_000_000_123_456_789))
    (src / "a.txt").chmod(0o640)
    (src / "sub/b.bin").chmod(0o755)
    server = serve(src)
    plain = _ls(server.endpoint)
    assert plain.returncode == 0, plain.stderr
    lines = plain.stdout.splitlines()
    assert len(lines) == len(TREE)
    mode, size, when, digest, path = lines[0].split(maxsplit=4)
    assert (mode, size, when, digest, path) == (
        "0640",
        "5",
        "2023-11-14T22:13:20Z",
        sha1(b"alpha"),
        "/a.txt",
    )
    assert lines[-1].endswith("  /z z.txt")
    as_json = _ls(server.endpoint, "/sub", "--json")
    assert as_json.returncode == 0, as_json.stderr
    objects = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert objects[0] == {
        "path": "/sub/b.bin",
        "size": 300_000,
        "mtime_ns": (src / "sub/b.bin").stat().st_mtime_ns,
        "mtime": objects[0]["mtime"],
        "sha1": sha1(b"b" * 300_000),
        "mode": "755",
    }
    assert [o["path"] for o in objects] == ["/sub/b.bin", "/sub/deep/c"]
    empty = _ls(server.endpoint, "/nothing")
    assert (empty.returncode, empty.stdout) == (0, "")
    assert "publishes no files under /nothing" in empty.stderr


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["tcp://127.0.0.1:1", "--timeout", "0.5"], 1, "filemq: no answer from"),
        (["127.0.0.1:5670"], 2, "bad endpoint"),
        (["tcp://127.0.0.1:1", "--server-key", "x.key"], 2, "go together"),
    ],
)
def test_ls_command_failures_are_one_line(args: list[str], code: int, message: str) -> None:
    done = _ls(*args)
    assert done.returncode == code
    assert message in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
