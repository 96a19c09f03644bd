"""Sans-IO engines: resume offers, resumed transfers, listings and the resync plan.

Expected values worked out by hand from the conventions in ``filemq.engine``.
"""

from __future__ import annotations

from typing import Any

import pytest

from filemq import fmq_msg
from filemq.engine import Operation, RemoteProtocolError, load_wire
from filemq.engine_client import (
    ClientSession,
    FileChunk,
    FileListed,
    FileRefused,
    ResyncDone,
    ResyncPlan,
    Send,
)
from filemq.engine_server import (
    FileOp,
    ServerSession,
    Subscribe,
    plan_headers,
    resume_from,
    resume_points,
)

WIRE = load_wire("spec")
A = "a" * 40
B = "b" * 40


def sent(actions: list[Any]) -> list[Any]:
    return [fmq_msg.decode(a.frames) for a in actions if isinstance(a, Send)]


def client(path: str = "/docs", *, listing: bool = False) -> ClientSession:
    return ClientSession(WIRE, path, {}, 0.0, window=1 << 20, listing=listing)


def open_session(s: ClientSession) -> list[Any]:
    s.start(0.0)
    out = sent(s.receive(fmq_msg.encode(fmq_msg.OhaiOk()), 0.1))
    s.receive(fmq_msg.encode(fmq_msg.IcanhazOk()), 0.1)
    return out


def burger(seq: int, name: str, offset: int, data: bytes, eof: int = 0, **kw: Any) -> list[bytes]:
    op = kw.pop("op", 1)
    headers = kw.pop("headers", {})
    return fmq_msg.encode(fmq_msg.Cheezburger(seq, op, name, offset, eof, headers, data))


# -- client ------------------------------------------------------------------------------


def test_offers_travel_in_the_icanhaz_and_unsafe_names_stay_home() -> None:
    s = client()
    s.offer_resume({"big.bin": (1000, A.upper()), "../x": (5, A), "c": (0, A), "d": (9, "z")})
    icanhaz = open_session(s)[0]
    assert isinstance(icanhaz, fmq_msg.Icanhaz)
    assert icanhaz.options["RESUME"] == f"1000 {A} /docs/big.bin"
    assert icanhaz.options["RESYNC"] == "1"


def test_first_chunk_at_the_offered_offset_resumes() -> None:
    s = client()
    s.offer_resume({"big.bin": (1000, A)})
    open_session(s)
    version = {"sha1": A, "size": "1010", "mtime_ns": "7"}
    first = s.receive(burger(0, "/docs/big.bin", 1000, b"01234", headers=version), 1.0)
    last = s.receive(burger(1, "/docs/big.bin", 1005, b"56789", eof=1, headers=version), 1.0)
    chunks = [a for a in first + last if isinstance(a, FileChunk)]
    assert [(c.offset, c.first, c.eof) for c in chunks] == [
        (1000, True, False),
        (1005, False, True),
    ]
    assert chunks[0].headers == version  # the version is known from the first chunk
    # the offer is used up: a second transfer of that file must start at 0
    with pytest.raises(RemoteProtocolError, match="first chunk at offset 1000"):
        s.receive(burger(2, "/docs/big.bin", 1000, b"x"), 1.0)


@pytest.mark.parametrize("offset", [999, 1001, 5])
def test_first_chunk_at_another_offset_is_a_protocol_error(offset: int) -> None:
    s = client()
    s.offer_resume({"big.bin": (1000, A)})
    open_session(s)
    with pytest.raises(RemoteProtocolError, match="first chunk at offset"):
        s.receive(burger(0, "/docs/big.bin", offset, b"x"), 1.0)


def test_no_offer_no_resume() -> None:
    s = client()
    open_session(s)
    with pytest.raises(RemoteProtocolError, match="first chunk at offset"):
        s.receive(burger(0, "/docs/other.bin", 1000, b"x"), 1.0)


def test_a_file_restarted_from_zero_uses_up_the_offer() -> None:
    s = client()
    s.offer_resume({"big.bin": (1000, A), "other": (50, B)})
    open_session(s)
    actions = s.receive(burger(0, "/docs/big.bin", 0, b"new", eof=1), 1.0)
    assert [(c.offset, c.first) for c in actions if isinstance(c, FileChunk)] == [(0, True)]
    refetch = sent(s.refetch("", {}))[0]  # later ICANHAZ carry only what is left
    assert refetch.options["RESUME"] == f"50 {B} /docs/other"
    assert s.forget_offers() == ["other"]
    assert "RESUME" not in sent(s.refetch("", {}))[0].options


def test_resync_plan_headers_become_an_action() -> None:
    s = client()
    open_session(s)
    plan = {"resync-files": "3", "resync-bytes": "12345"}
    actions = s.receive(burger(0, "/docs/a", 0, b"abc", eof=1, headers=plan), 1.0)
    assert isinstance(actions[0], ResyncPlan) and (actions[0].files, actions[0].bytes) == (
        3,
        12345,
    )
    garbage = {"resync-files": "-1", "resync-bytes": "lots"}
    actions = s.receive(burger(1, "/docs/b", 0, b"", eof=1, op=2, headers=garbage), 1.0)
    assert isinstance(actions[0], ResyncPlan) and (actions[0].files, actions[0].bytes) == (0, 0)


def test_listing_client_gets_stat_entries_and_refuses_content() -> None:
    s = client(listing=True)
    icanhaz = open_session(s)[0]
    assert icanhaz.options == {"RESYNC": "1", "LIST": "1"}
    meta = {"sha1": A, "size": "10", "mtime_ns": "5"}
    stat = s.receive(burger(0, "/docs/sub/a.txt", 0, b"", eof=1, op=3, headers=meta), 1.0)
    assert stat == [FileListed("sub/a.txt", meta)]
    refused = s.receive(burger(1, "/docs/../x", 0, b"", eof=1, op=3, headers=meta), 1.0)
    assert isinstance(refused[0], FileRefused)
    done = {"resync": "complete", "path": "/docs/"}
    assert s.receive(burger(2, "", 0, b"", eof=1, op=0, headers=done), 1.0) == [
        ResyncDone("/docs/")
    ]
    with pytest.raises(RemoteProtocolError, match="LIST"):
        s.receive(burger(3, "/docs/b", 0, b"content", eof=1), 1.0)


def test_listing_client_refuses_even_an_empty_file() -> None:
    """An older zerohub server sends empty files whatever the credit: not a listing."""
    s = client(listing=True)
    open_session(s)
    with pytest.raises(RemoteProtocolError, match="LIST"):
        s.receive(burger(0, "/docs/empty", 0, b"", eof=1), 1.0)


def test_stat_outside_a_listing_is_a_protocol_error() -> None:
    s = client()
    open_session(s)
    with pytest.raises(RemoteProtocolError, match="STAT"):
        s.receive(burger(0, "/docs/a", 0, b"", eof=1, op=3), 1.0)


# -- server ------------------------------------------------------------------------------


def test_resume_points_reads_good_lines_and_ignores_the_rest() -> None:
    lines = [
        f"100 {A} /docs/big.bin",
        f"200 {B.upper()} /docs/with space.bin",
        f"7 {A} /elsewhere/x",  # not under the ICANHAZ path
        f"8 {A} /docs/../etc/passwd",
        f"9 {A} /docs//x",  # not normal
        f"x {A} /docs/y",
        f"10 {A[:39]} /docs/z",
        "",
        "garbage",
    ]
    points = resume_points("/docs/", {"RESUME": "\n".join(lines)})
    assert points == {"/docs/big.bin": (100, A), "/docs/with space.bin": (200, B)}
    assert resume_points("/", {}) == {}
    many = "\n".join(f"{i + 1} {A} /f{i}" for i in range(1000))
    assert len(resume_points("/", {"RESUME": many})) == 64  # at most 64 lines read


def test_resume_from_only_the_same_version_inside_the_file() -> None:
    op = FileOp("/big", Operation.CREATE, "src/big", 1000, 5, A)
    assert resume_from(op, {"/big": (400, A)}).start == 400
    assert resume_from(op, {"/big": (400, B)}).start == 0  # another version: from zero
    assert resume_from(op, {"/big": (1000, A)}).start == 0  # nothing left to send
    assert resume_from(op, {"/big": (0, A)}).start == 0
    assert resume_from(op, {"/other": (400, A)}) is op


def ready_server(chunk_size: int = 300) -> ServerSession:
    s = ServerSession(WIRE, b"c", 0.0, chunk_size=chunk_size)
    s.receive(fmq_msg.encode(fmq_msg.Ohai()), 0.0)
    s.receive(fmq_msg.encode(fmq_msg.Icanhaz("/", {"RESYNC": "1"}, {})), 0.0)
    s.receive(fmq_msg.encode(fmq_msg.Nom(1 << 20, 0)), 0.0)
    return s


def test_server_sends_a_resumed_file_from_its_start_offset() -> None:
    s = ready_server()
    s.enqueue(plan_headers([FileOp("/big", Operation.CREATE, "src/big", 1000, 5, A, start=400)]))
    content = bytes(range(256)) * 4
    chunks = []
    while (plan := s.next_chunk()) is not None:
        chunks.append(
            fmq_msg.decode(s.chunk_frames(plan, content[plan.offset : plan.offset + plan.size]))
        )
    assert [(c.offset, len(c.chunk), c.eof) for c in chunks] == [(400, 300, 0), (700, 300, 1)]
    version = {"sha1": A, "size": "1000", "mtime_ns": "5"}
    plan = {"resync-files": "1", "resync-bytes": "600"}
    assert chunks[0].headers == {**version, **plan} and chunks[1].headers == version
    assert s.sent_bytes == 600 and s.credit == (1 << 20) - 600


def test_resumed_file_changed_before_its_first_chunk_starts_from_zero() -> None:
    s = ready_server()
    s.enqueue([FileOp("/big", Operation.CREATE, "src/big", 1000, 5, A, start=400)])
    plan = s.next_chunk()
    assert plan is not None and (plan.offset, plan.first) == (400, True)
    fresh = s.replace_current(FileOp("/big", Operation.CREATE, "src/big", 900, 6, B))
    assert fresh is not None and (fresh.offset, fresh.first, fresh.size) == (0, True, 300)


def test_listing_is_not_a_subscription() -> None:
    s = ServerSession(WIRE, b"c", 0.0)
    s.receive(fmq_msg.encode(fmq_msg.Ohai()), 0.0)
    actions = s.receive(
        fmq_msg.encode(fmq_msg.Icanhaz("/docs", {"RESYNC": "1", "LIST": "1"}, {"a": A})), 0.0
    )
    subscribe = next(a for a in actions if isinstance(a, Subscribe))
    assert subscribe.listing and subscribe.resync and subscribe.cache == {}
    assert not s.wants("/docs/a")  # no live changes for a lister
    s.receive(fmq_msg.encode(fmq_msg.Nom(1, 0)), 0.0)
    s.enqueue([FileOp("/docs/a", Operation.STAT, "src/a", 10, 5, A)])
    plan = s.next_chunk()
    assert plan is not None
    msg = fmq_msg.decode(s.chunk_frames(plan, b""))
    assert (msg.operation, msg.chunk, msg.eof) == (3, b"", 1)
    assert msg.headers == {"sha1": A, "size": "10", "mtime_ns": "5"}
    assert s.credit == 1  # costs no credit


def test_plan_headers_count_creates_and_the_bytes_left() -> None:
    ops = [
        FileOp("/gone", Operation.DELETE),
        FileOp("/a", Operation.CREATE, "a", 100, 1, A),
        FileOp("/b", Operation.CREATE, "b", 1000, 1, B, start=600),
    ]
    planned = plan_headers(ops)
    assert dict(planned[0].headers) == {"resync-files": "2", "resync-bytes": "500"}
    assert planned[1:] == ops[1:]
    assert plan_headers([FileOp("/gone", Operation.DELETE)]) == [FileOp("/gone", Operation.DELETE)]
