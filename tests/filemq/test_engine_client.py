"""The sans-IO client session: handshake, credit window, name checks, protocol errors."""

from __future__ import annotations

from typing import Any

import pytest

from filemq import fmq_msg
from filemq.engine import RemoteProtocolError, load_wire
from filemq.engine_client import (
    ClientSession,
    FileChunk,
    FileDelete,
    FileRefused,
    PeerTimeout,
    Refused,
    Rejected,
    ResyncDone,
    Send,
    Subscribed,
)

WIRE = load_wire("spec")


def sent(actions: list[Any]) -> list[fmq_msg.Message]:
    return [fmq_msg.decode(a.frames) for a in actions if isinstance(a, Send)]


class Server:
    """Feeds a session CHEEZBURGERs with correct sequence numbers."""

    def __init__(self, session: ClientSession) -> None:
        self.s = session
        self.seq = 0

    def chunk(
        self,
        name: str,
        offset: int,
        data: bytes,
        eof: int = 0,
        op: int = 1,
        headers: dict[str, str] | None = None,
        seq: int | None = None,
    ) -> list[Any]:
        msg = fmq_msg.Cheezburger(
            self.seq if seq is None else seq, op, name, offset, eof, headers or {}, data
        )
        self.seq += 1
        return self.s.receive(fmq_msg.encode(msg), 1.0)


def active(path: str = "/docs", window: int = 100) -> tuple[ClientSession, Server]:
    s = ClientSession(
        WIRE,
        path,
        {"a.txt": "a" * 40},
        0.0,
        window=window,
        heartbeat=5,
        timeout=30,
        reserved=lambda parts: parts[0].startswith(".tmp"),
    )
    assert sent(s.start(0.0)) == [fmq_msg.Ohai()]
    out = sent(s.receive(fmq_msg.encode(fmq_msg.OhaiOk()), 0.1))
    assert out == [
        fmq_msg.Icanhaz("/docs/", {"RESYNC": "1"}, {"a.txt": "a" * 40}),
        fmq_msg.Nom(window, 0),
    ]
    assert isinstance(s.receive(fmq_msg.encode(fmq_msg.IcanhazOk()), 0.2)[0], Subscribed)
    return s, Server(s)


def test_file_chunks_and_completion_marker() -> None:
    s, srv = active()
    a1 = srv.chunk("/docs/sub/f.txt", 0, b"hello ")
    a2 = srv.chunk("/docs/sub/f.txt", 6, b"world", eof=1, headers={"sha1": "x"})
    chunks = [a for a in a1 + a2 if isinstance(a, FileChunk)]
    assert [(c.name, c.offset, c.first, c.eof) for c in chunks] == [
        ("sub/f.txt", 0, True, False),
        ("sub/f.txt", 6, False, True),
    ]
    assert chunks[1].headers == {"sha1": "x"}
    assert isinstance(srv.chunk("/docs/old", 0, b"", eof=1, op=2)[0], FileDelete)
    assert not s.synced
    done = srv.chunk("", 0, b"", eof=1, op=0, headers={"resync": "complete", "path": "/docs/"})
    assert isinstance(done[0], ResyncDone) and s.synced


def test_sliding_window_returns_credit() -> None:
    _s, srv = active(window=100)
    noms = []
    for i in range(10):
        noms += [
            m
            for m in sent(srv.chunk("/docs/big", i * 30, b"x" * 30))
            if isinstance(m, fmq_msg.Nom)
        ]
    assert sum(n.credit for n in noms) >= 300 - 100 + 25  # window refilled as data arrived
    assert all(n.credit >= 25 for n in noms)


@pytest.mark.parametrize(
    "name",
    [
        "/docs/../etc/passwd",
        "/docs/a/../../x",
        "/etc/passwd",
        "/docs/a\x00b",
        "/docs/a\\..\\b",
        "/docs/",
        "/docs//x",
        "/docs/.tmp-file",
        "../x",
        "C:/win",
    ],
)
def test_unsafe_names_refused_and_session_goes_on(name: str) -> None:
    _s, srv = active()
    first = srv.chunk(name, 0, b"evil")
    assert isinstance(first[0], FileRefused)
    assert not any(isinstance(a, FileChunk) for a in first)
    rest = srv.chunk(name, 4, b"more", eof=1)  # chunks of the refused file are dropped
    assert not any(isinstance(a, FileChunk) for a in rest)
    assert isinstance(srv.chunk(name, 0, b"", eof=1, op=2)[0], FileRefused)  # delete too
    ok = srv.chunk("/docs/fine", 0, b"ok", eof=1)
    assert any(isinstance(a, FileChunk) for a in ok)


@pytest.mark.parametrize(
    "script",
    [
        [("/docs/f", 5, b"x", 0)],  # first chunk not at offset 0
        [("/docs/f", 0, b"abc", 0), ("/docs/f", 4, b"x", 1)],  # gap
        [("/docs/f", 0, b"abc", 0), ("/docs/f", 2, b"x", 1)],  # overlap
        [("/docs/f", 0, b"abc", 0), ("/docs/g", 0, b"x", 1)],  # interleaved files
        [("/docs/f", 0, b"x" * 101, 1)],  # more than the credit granted
    ],
)
def test_protocol_errors(script: list[tuple[str, int, bytes, int]]) -> None:
    _s, srv = active(window=100)
    with pytest.raises(RemoteProtocolError):
        for name, offset, data, eof in script:
            srv.chunk(name, offset, data, eof)


def test_sequence_gap_and_unknown_operation_are_errors() -> None:
    s, srv = active()
    with pytest.raises(RemoteProtocolError):
        srv.chunk("/docs/f", 0, b"x", seq=5)
    s, srv = active()
    with pytest.raises(RemoteProtocolError):
        srv.chunk("/docs/f", 0, b"x", op=7)
    s, srv = active()
    with pytest.raises(RemoteProtocolError):
        s.receive(fmq_msg.encode(fmq_msg.Ohai()), 1)


def test_srsly_rtfm_and_silent_garbage() -> None:
    s, _ = active()
    assert s.receive([b"no signature"], 1) == []
    assert isinstance(s.receive(fmq_msg.encode(fmq_msg.Srsly("no")), 1)[0], Refused)
    s, _ = active()
    assert isinstance(s.receive(fmq_msg.encode(fmq_msg.Rtfm("bad")), 1)[0], Rejected)


def test_heartbeat_and_timeout() -> None:
    s, _ = active()
    assert sent(s.tick(1.0)) == []
    assert sent(s.tick(6.0)) == [fmq_msg.Hugz()]
    assert sent(s.receive(fmq_msg.encode(fmq_msg.Hugz()), 7.0)) == [fmq_msg.HugzOk()]
    with pytest.raises(PeerTimeout):
        s.tick(40.0)


def test_refetch_asks_for_one_file_with_its_cache() -> None:
    s, _ = active()
    out = sent(s.refetch("sub/f.txt", {"sub/f.txt": "1" * 40, "other": "2" * 40}))
    assert out == [
        fmq_msg.Icanhaz("/docs/sub/f.txt", {"RESYNC": "1"}, {"/docs/sub/f.txt": "1" * 40})
    ]
    assert not s.synced


def test_last_traffic_counts_file_traffic_not_heartbeats() -> None:
    s, srv = active()
    assert s.last_traffic == 0.2  # ICANHAZ-OK
    s.receive(fmq_msg.encode(fmq_msg.HugzOk()), 3.0)
    s.receive(fmq_msg.encode(fmq_msg.Hugz()), 4.0)
    assert s.last_traffic == 0.2
    srv.chunk("/docs/f", 0, b"x")  # (at 1.0, see Server.chunk)
    assert s.last_traffic == 1.0


def test_empty_chunk_after_an_ended_file_is_dropped_not_a_new_file() -> None:
    _s, srv = active()
    srv.chunk("/docs/f", 0, b"hello", eof=1)
    assert srv.chunk("/docs/f", 5, b"", eof=1) == []  # the reference ending, repeated
    with pytest.raises(RemoteProtocolError):  # not after anything else
        srv.chunk("/docs/f", 5, b"", eof=1)


def test_the_attrs_text_is_not_alive_beside_the_whole_icanhaz_frame() -> None:
    """``ATTRS`` (a line per file: ~5 MiB at 100,000) is made when the codec reads the
    options and dropped once it is in the frame, before the cache is appended: before
    session 18 the text stayed alive beside the whole frame (the ICANHAZ part of the
    peak RSS of a big no-change sync).  The frame is the one a dict of the same options
    makes."""
    import tracemalloc

    cache = {f"dir{i % 100:03d}/file{i:06d}.dat": f"{i * 7919:040x}" for i in range(40_000)}
    lines = "\n".join(f"{name}\tf\t644\t{i}" for i, name in enumerate(cache))

    def attrs(path: str) -> str:  # (a new text each time, made in one allocation)
        return lines.replace("\tf\t644\t", "\tf\t640\t")

    s = ClientSession(WIRE, "/", cache, 0.0, attrs=attrs)
    s.start(0.0)
    ohai_ok = fmq_msg.encode(fmq_msg.OhaiOk())
    tracemalloc.start()
    try:
        actions = s.receive(ohai_ok, 0.1)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    icanhaz = sent(actions)[0]
    assert isinstance(icanhaz, fmq_msg.Icanhaz) and icanhaz.cache == cache
    assert icanhaz.options == {**icanhaz.options, "ATTRS": attrs("/")}
    frame = len(actions[0].frames[0])
    # the frame (and its buffer's growth); not the frame and the text at once
    assert peak < 1.2 * frame + 0.3 * len(lines), (peak / frame, len(lines) / frame)
