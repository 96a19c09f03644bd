"""The sans-IO engines and metadata: options checked, headers sent, hostile headers refused."""

from __future__ import annotations

from typing import Any

import pytest

from filemq import fmq_msg
from filemq.engine import Operation, load_wire
from filemq.engine_client import (
    ClientSession,
    FileChunk,
    FileDelete,
    FileRefused,
    FileSkipped,
    MakeDir,
    MakeLink,
    Send,
    Touch,
)
from filemq.engine_server import FileOp, Reply, ServerSession, SessionState, Subscribe
from filemq.filters import Filters
from filemq.meta import LinkPolicy

from .test_engine_client import Server

WIRE = load_wire("spec")
SHA = "a" * 40


def server_session() -> ServerSession:
    s = ServerSession(WIRE, b"c1", 0.0, chunk_size=100)
    s.receive(fmq_msg.encode(fmq_msg.Ohai()), 0.0)
    return s


def icanhaz(s: ServerSession, options: dict[str, str], path: str = "/docs/") -> list[Any]:
    msg = fmq_msg.Icanhaz(path, {"RESYNC": "1", **options}, {"x": SHA})
    return s.receive(fmq_msg.encode(msg), 1.0)


def test_server_reads_meta_links_filter_attrs() -> None:
    s = server_session()
    attrs = "x\tf\t644\t5\nd\td\t755\nl\tl\t../x\nbad line"
    actions = icanhaz(
        s, {"META": "777", "LINKS": "copy", "FILTER": "*.log\nbuild/", "ATTRS": attrs}
    )
    sub = next(a for a in actions if isinstance(a, Subscribe))
    assert sub.meta == 0o777 and sub.links is LinkPolicy.COPY
    assert sub.filters is not None and sub.filters.lines == ("*.log", "build/")
    assert sub.attrs == {"/docs/x": "f\t644\t5", "/docs/d": "d\t755", "/docs/l": "l\t../x"}
    assert s.wants("/docs/a.txt") and not s.wants("/docs/sub/a.log")
    assert not s.wants("/docs/build/x.c") and not s.wants("/docs/build", is_dir=True)
    assert not s.wants("/other/a.txt")


def test_an_older_client_gets_no_meta() -> None:
    s = server_session()
    sub = next(a for a in icanhaz(s, {}) if isinstance(a, Subscribe))
    assert sub.meta is None and sub.links is LinkPolicy.SKIP and sub.filters is None
    assert sub.attrs == {}


@pytest.mark.parametrize(
    "options",
    [
        {"META": "rwx"},
        {"META": "0"},
        {"LINKS": "follow-everything"},
        {"FILTER": "*a*a*a*a*b"},
        {"FILTER": "\\"},
        {"FILTER": "\n".join(f"p{i}" for i in range(1000))},
    ],
)
def test_bad_options_get_srsly_and_nothing_is_queued(options: dict[str, str]) -> None:
    s = server_session()
    actions = icanhaz(s, options)
    (reply,) = [fmq_msg.decode(a.frames) for a in actions if isinstance(a, Reply)]
    assert isinstance(reply, fmq_msg.Srsly) and "option refused" in reply.reason
    assert not any(isinstance(a, Subscribe) for a in actions)
    assert s.state is SessionState.REFUSED


def test_file_ops_carry_their_mode_and_meta_ops_their_own_headers() -> None:
    s = server_session()
    icanhaz(s, {"META": "777"})
    s.receive(fmq_msg.encode(fmq_msg.Nom(1000, 0)), 1.0)
    s.enqueue(
        [
            FileOp("/docs/d", Operation.CREATE, headers=(("kind", "dir"), ("mode", "700"))),
            FileOp("/docs/f", Operation.CREATE, "", 2, 7, SHA, mode=0o4755),
            FileOp("/docs/old", Operation.DELETE, headers=(("kind", "file"),)),
        ]
    )
    sent = []
    while (plan := s.next_chunk()) is not None:
        data = b"hi" if plan.size else b""
        sent.append(fmq_msg.decode(s.chunk_frames(plan, data)))
    assert [m.filename for m in sent] == ["/docs/d", "/docs/f", "/docs/old"]
    assert sent[0].headers == {"kind": "dir", "mode": "700"}
    assert sent[1].headers == {"sha1": SHA, "size": "2", "mtime_ns": "7", "mode": "4755"}
    assert sent[2].headers == {"kind": "file"}


def client(**kwargs: Any) -> tuple[ClientSession, Server]:
    s = ClientSession(WIRE, "/docs", {}, 0.0, window=1 << 20, **kwargs)
    s.start(0.0)
    s.receive(fmq_msg.encode(fmq_msg.OhaiOk()), 0.1)
    s.receive(fmq_msg.encode(fmq_msg.IcanhazOk()), 0.2)
    return s, Server(s)


def test_client_sends_attrs_of_each_icanhaz() -> None:
    asked: list[str] = []

    def attrs(path: str) -> str:
        asked.append(path)
        return "a\td\t755"

    s = ClientSession(WIRE, "/docs", {}, 0.0, options={"META": "777"}, attrs=attrs)
    s.start(0.0)
    out = s.receive(fmq_msg.encode(fmq_msg.OhaiOk()), 0.1)
    msg = fmq_msg.decode(next(a for a in out if isinstance(a, Send)).frames)
    assert msg.options == {"RESYNC": "1", "META": "777", "ATTRS": "a\td\t755"}
    s.refetch("sub/f", {})
    assert asked == ["/docs/", "/docs/sub/f"]


def test_client_turns_headers_into_entries() -> None:
    _s, srv = client()
    (d,) = srv.chunk("/docs/d", 0, b"", eof=1, headers={"kind": "dir", "mode": "750"})
    assert isinstance(d, MakeDir) and d.parts == ("d",) and d.meta.mode == 0o750
    (link,) = srv.chunk("/docs/d/l", 0, b"", eof=1, headers={"kind": "symlink", "target": "../x"})
    assert isinstance(link, MakeLink) and link.meta.target == "../x"
    touch_headers = {"touch": "1", "sha1": SHA, "size": "3", "mtime_ns": "9", "mode": "600"}
    (touch,) = srv.chunk("/docs/f", 0, b"", eof=1, headers=touch_headers)
    assert isinstance(touch, Touch) and (touch.sha1, touch.size) == (SHA, 3)
    assert touch.meta.mtime_ns == 9 and touch.meta.mode == 0o600
    (chunk,) = srv.chunk("/docs/g", 0, b"abc", eof=1, headers={"mode": "7777", "mtime_ns": "1"})
    assert isinstance(chunk, FileChunk) and chunk.meta is not None and chunk.meta.mode == 0o7777
    (delete,) = srv.chunk("/docs/g", 0, b"", eof=1, op=2, headers={"kind": "file"})
    assert isinstance(delete, FileDelete) and delete.kinded
    (old_delete,) = srv.chunk("/docs/h", 0, b"", eof=1, op=2)
    assert isinstance(old_delete, FileDelete) and not old_delete.kinded


@pytest.mark.parametrize(
    "headers",
    [
        {"mode": "99", "sha1": SHA},
        {"mode": "-7"},
        {"mtime_ns": "yesterday"},
        {"mtime_ns": "9" * 25},
        {"kind": "device"},
        {"kind": "symlink", "target": "../../etc"},
        {"kind": "symlink", "target": "/etc/passwd"},
        {"kind": "symlink", "target": "a/../../x"},
        {"kind": "symlink"},
        {"touch": "1", "sha1": "short", "size": "1"},
        {"touch": "1", "sha1": SHA, "size": "-1"},
    ],
)
def test_hostile_headers_are_refused_and_the_session_goes_on(headers: dict[str, str]) -> None:
    _s, srv = client()
    actions = srv.chunk("/docs/x", 0, b"", eof=1, headers=headers)
    assert [type(a) for a in actions] == [FileRefused]
    (after,) = srv.chunk("/docs/ok", 0, b"fine", eof=1, headers={"mode": "644"})
    assert isinstance(after, FileChunk) and after.name == "ok"


def test_hostile_header_on_the_last_chunk_of_a_long_file() -> None:
    s, srv = client()
    first = srv.chunk("/docs/big", 0, b"x" * 10)
    assert isinstance(first[0], FileChunk) and first[0].first
    (refused,) = srv.chunk("/docs/big", 10, b"y", eof=1, headers={"mode": "zz"})
    assert isinstance(refused, FileRefused)  # (the client drops its temp file)
    assert not s.in_file


def test_entries_with_content_are_refused() -> None:
    _s, srv = client()
    (refused,) = srv.chunk("/docs/d", 0, b"data", eof=1, headers={"kind": "dir"})
    assert isinstance(refused, FileRefused)


def test_the_mirrors_patterns_drop_creates_and_ignore_deletes() -> None:
    filters = Filters(["*.log", "cache/"])
    _s, srv = client(excluded=filters.excluded_path)
    assert srv.chunk("/docs/a.log", 0, b"x", eof=1) == [FileSkipped("a.log")]
    assert srv.chunk("/docs/cache", 0, b"", eof=1, headers={"kind": "dir"}) == [
        FileSkipped("cache")
    ]
    assert srv.chunk("/docs/cache/in.txt", 0, b"x", eof=1) == [FileSkipped("cache/in.txt")]
    assert srv.chunk("/docs/a.log", 0, b"", eof=1, op=2) == []  # never deleted
    (kept,) = srv.chunk("/docs/a.txt", 0, b"x", eof=1)
    assert isinstance(kept, FileChunk)
