"""The sans-IO server session: handshake, errors, credit arithmetic, queueing."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from filemq import fmq_msg, fmq_msg_czmq
from filemq.engine import Operation, load_wire
from filemq.engine_server import (
    Close,
    FileOp,
    Reply,
    ServerSession,
    SessionState,
    Subscribe,
    resolve_cache,
)

WIRE = load_wire("spec")


def frames(msg: fmq_msg.Message) -> list[bytes]:
    return fmq_msg.encode(msg)


def replies(actions: Sequence[object]) -> list[fmq_msg.Message]:
    return [fmq_msg.decode(a.frames) for a in actions if isinstance(a, Reply)]


def burger(raw: list[bytes]) -> fmq_msg.Cheezburger:
    msg = fmq_msg.decode(raw)
    assert isinstance(msg, fmq_msg.Cheezburger)
    return msg


def ready(chunk_size: int = 10) -> ServerSession:
    s = ServerSession(WIRE, b"c1", 0.0, chunk_size=chunk_size)
    assert replies(s.receive(frames(fmq_msg.Ohai()), 0.0)) == [fmq_msg.OhaiOk()]
    assert s.state is SessionState.READY
    return s


def test_ohai_of_another_version_or_protocol_gets_rtfm() -> None:
    good = frames(fmq_msg.Ohai())[0]
    bad_version = good[:-2] + b"\x00\x03"
    bad_protocol = good.replace(b"FILEMQ", b"FILEMX")
    for raw in (bad_version, bad_protocol):
        s = ServerSession(WIRE, b"c", 0.0)
        actions = s.receive([raw], 0.0)
        assert isinstance(replies(actions)[0], fmq_msg.Rtfm)
        assert any(isinstance(a, Close) for a in actions)


def test_refusal_reasons_quoting_the_peer_fit_their_field() -> None:
    """Reasons quote what the peer sent: multi-octet text must not overflow the string."""
    proto = ("é" * 120).encode()
    raw = b"\xaa\xa3\x01" + bytes([len(proto)]) + proto + b"\x00\x02"
    s = ServerSession(WIRE, b"c", 0.0)
    actions = s.receive([raw], 0.0)
    [rtfm] = replies(actions)
    assert isinstance(rtfm, fmq_msg.Rtfm) and "é" in rtfm.reason
    assert len(rtfm.reason.encode()) <= 255
    assert any(isinstance(a, Close) for a in actions)
    s = ServerSession(WIRE, b"c", 0.0, access=lambda key, path: False)
    s.receive(frames(fmq_msg.Ohai()), 0)
    [srsly] = replies(s.receive(frames(fmq_msg.Icanhaz("/" + "é" * 127)), 0))
    assert isinstance(srsly, fmq_msg.Srsly) and len(srsly.reason.encode()) <= 255


def test_no_signature_is_dropped_silently() -> None:
    s = ready()
    assert s.receive([b"GET / HTTP/1.0\r\n"], 1.0) == []
    assert s.receive([b""], 1.0) == []
    assert s.state is SessionState.READY


def test_unexpected_and_malformed_commands_get_rtfm() -> None:
    for before_ohai in (fmq_msg.Icanhaz("/"), fmq_msg.Nom(1, 0), fmq_msg.Hugz()):
        s = ServerSession(WIRE, b"c", 0.0)
        assert isinstance(replies(s.receive(frames(before_ohai), 0.0))[0], fmq_msg.Rtfm)
    for bad in (
        [b"\xaa\xa3\x63"],
        [b"\xaa\xa3\x07\x00"],
        frames(fmq_msg.OhaiOk()),
        [*frames(fmq_msg.Hugz()), b"extra frame"],
    ):
        s = ready()
        actions = s.receive(bad, 1.0)
        assert isinstance(replies(actions)[0], fmq_msg.Rtfm), bad
        assert s.state is SessionState.CLOSED


def test_icanhaz_rules() -> None:
    s = ready()
    actions = s.receive(frames(fmq_msg.Icanhaz("/docs/", {"RESYNC": "1"}, {"a": "AB" * 20})), 1)
    assert replies(actions) == [fmq_msg.IcanhazOk()]
    sub = next(a for a in actions if isinstance(a, Subscribe))
    assert sub == Subscribe("/docs/", True, {"/docs/a": "ab" * 20}, {"RESYNC": "1"})
    assert isinstance(replies(s.receive(frames(fmq_msg.Icanhaz("docs")), 1))[0], fmq_msg.Rtfm)
    s = ready()
    assert isinstance(replies(s.receive(frames(fmq_msg.Icanhaz("/a/../b")), 1))[0], fmq_msg.Srsly)
    assert s.state is SessionState.REFUSED
    assert s.receive(frames(fmq_msg.Hugz()), 2) == []  # discarded after SRSLY


def test_access_policy_refusal_gets_srsly() -> None:
    s = ServerSession(WIRE, b"c", 0.0, access=lambda key, path: not path.startswith("/x"))
    s.receive(frames(fmq_msg.Ohai()), 0)
    assert isinstance(replies(s.receive(frames(fmq_msg.Icanhaz("/x/y")), 0))[0], fmq_msg.Srsly)


def test_resolve_cache_follows_the_spec() -> None:
    cache = {"/docs/a": "1", "/other/b": "2", "rel/c": "3", "../up": "4", "/docs/../x": "5"}
    assert resolve_cache("/docs/", cache) == {"/docs/a": "1", "/docs/rel/c": "3"}
    assert resolve_cache("/docs", {"x": "9"}) == {"/docs/x": "9"}


def test_hugz_and_kthxbai() -> None:
    s = ready()
    assert replies(s.receive(frames(fmq_msg.Hugz()), 5.0)) == [fmq_msg.HugzOk()]
    assert s.last_seen == 5.0 and not s.expired(10.0, 30.0) and s.expired(40.0, 30.0)
    assert isinstance(s.receive(frames(fmq_msg.Kthxbai()), 6.0)[0], Close)


def _drain(s: ServerSession, files: dict[str, bytes], nom: int) -> list[fmq_msg.Cheezburger]:
    """Grant ``nom`` credit whenever the session stalls; collect every chunk."""
    out: list[fmq_msg.Cheezburger] = []
    for _ in range(100_000):
        plan = s.next_chunk()
        if plan is None:
            if not s.queued:
                return out
            assert s.credit == 0  # stalls only for lack of credit: no livelock
            s.receive(frames(fmq_msg.Nom(nom, 0)), 0)
            continue
        assert plan.size <= s.credit
        data = files.get(plan.op.source, b"")[plan.offset : plan.offset + plan.size]
        msg = fmq_msg.decode(s.chunk_frames(plan, data))
        assert isinstance(msg, fmq_msg.Cheezburger)
        out.append(msg)
    raise AssertionError("no progress")


@pytest.mark.parametrize("chunk", [10, 7])
@pytest.mark.parametrize("credit", [1, 6, 9, 10, 11, 25, 1000])
def test_credit_edge_cases_never_livelock(chunk: int, credit: int) -> None:
    content = {"src/a": bytes(range(37)), "src/b": b"", "src/c": b"xyz" * 7}
    s = ready(chunk_size=chunk)
    s.enqueue(
        [
            FileOp("/a", Operation.CREATE, "src/a", 37, 5, "aa" * 20),
            FileOp("/b", Operation.CREATE, "src/b", 0, 5, "bb" * 20),
            FileOp("/gone", Operation.DELETE),
            FileOp("/c", Operation.CREATE, "src/c", 21, 5, "cc" * 20),
        ]
    )
    s.enqueue_marker("/")
    s.receive(frames(fmq_msg.Nom(credit, 0)), 0)
    chunks = _drain(s, content, credit)
    assert [c.sequence for c in chunks] == list(range(len(chunks)))
    assert all(len(c.chunk) <= min(chunk, credit) for c in chunks)
    for name, src in (("/a", "src/a"), ("/b", "src/b"), ("/c", "src/c")):
        mine = [c for c in chunks if c.filename == name]
        assert b"".join(c.chunk for c in mine) == content[src]
        offsets = [c.offset for c in mine]
        assert offsets == [sum(len(c.chunk) for c in mine[:i]) for i in range(len(mine))]
        assert [c.eof for c in mine] == [0] * (len(mine) - 1) + [1]
        assert mine[-1].headers["sha1"] == name[1] * 40
        assert mine[-1].headers["size"] == str(len(content[src]))
    names = [c.filename for c in chunks]
    first = {n: names.index(n) for n in set(names)}
    last = {n: len(names) - 1 - names[::-1].index(n) for n in set(names)}
    assert last["/a"] < first["/b"] < first["/gone"] < first["/c"]  # files not interleaved
    assert chunks[-1].operation == 0 and chunks[-1].headers["resync"] == "complete"


def test_nothing_without_credit_and_free_zero_length_ops() -> None:
    s = ready()
    s.enqueue([FileOp("/e", Operation.CREATE, "e", 0), FileOp("/d", Operation.DELETE)])
    assert s.next_chunk() is None  # no NOM yet
    s.receive(frames(fmq_msg.Nom(1, 0)), 0)
    for _ in range(2):
        plan = s.next_chunk()
        assert plan is not None and plan.size == 0
        s.chunk_frames(plan, b"")
    assert s.credit == 1 and s.next_chunk() is None


def test_pending_op_replaced_not_duplicated() -> None:
    s = ready()
    s.enqueue([FileOp("/a", Operation.CREATE, "v1", 1), FileOp("/b", Operation.DELETE)])
    s.enqueue([FileOp("/a", Operation.DELETE)])
    s.receive(frames(fmq_msg.Nom(100, 0)), 0)
    sent = []
    while (plan := s.next_chunk()) is not None:
        sent.append(burger(s.chunk_frames(plan, b"")))
    assert [(c.filename, c.operation) for c in sent] == [("/a", 2), ("/b", 2)]


def test_source_vanished_or_shrank() -> None:
    s = ready()
    s.enqueue([FileOp("/a", Operation.CREATE, "a", 20, 0, "a" * 40)])
    s.enqueue([FileOp("/b", Operation.CREATE, "b", 20, 0, "b" * 40)])
    s.receive(frames(fmq_msg.Nom(100, 0)), 0)
    plan = s.next_chunk()
    assert plan is not None
    gone = burger(s.chunk_frames(plan, None))
    assert (gone.filename, gone.operation) == ("/a", 2)  # never started: becomes a delete
    plan = s.next_chunk()
    assert plan is not None
    short = burger(s.chunk_frames(plan, b"12345"))
    assert short.eof == 1 and short.headers["size"] == "20"  # client's check will fail
    assert s.next_chunk() is None


def test_unreadable_source_is_skipped_not_deleted() -> None:
    s = ready()
    s.enqueue([FileOp("/a", Operation.CREATE, "a", 20, 0, "a" * 40)])
    s.enqueue([FileOp("/b", Operation.CREATE, "b", 5, 0, "b" * 40)])
    s.receive(frames(fmq_msg.Nom(100, 0)), 0)
    plan = s.next_chunk()
    assert plan is not None and plan.op.name == "/a"
    s.skip_current()  # the I/O layer could not read /a: nothing goes out for it
    plan = s.next_chunk()
    assert plan is not None and plan.op.name == "/b"
    sent = burger(s.chunk_frames(plan, b"12345"))
    assert (sent.filename, sent.operation, sent.sequence) == ("/b", 1, 0)
    assert s.credit == 95 and s.next_chunk() is None
    s.enqueue([FileOp("/c", Operation.CREATE, "c", 20, 0, "c" * 40)])
    plan = s.next_chunk()
    assert plan is not None
    s.chunk_frames(plan, b"x" * 10)
    with pytest.raises(ValueError):
        s.skip_current()  # half sent: only a short end can stop it now


def test_refuse_after_subscribe_gets_srsly_and_discards_the_rest() -> None:
    s = ready()
    actions = s.receive(frames(fmq_msg.Icanhaz("/", {"RESYNC": "1", "X": "y"}, {})), 1)
    sub = next(a for a in actions if isinstance(a, Subscribe))
    assert sub.options == {"RESYNC": "1", "X": "y"}
    assert isinstance(replies(s.refuse("no"))[0], fmq_msg.Srsly)
    assert s.state is SessionState.REFUSED
    assert s.enqueue([FileOp("/a", Operation.DELETE)]) == 0
    assert s.receive(frames(fmq_msg.Nom(100, 0)), 2) == [] and s.next_chunk() is None


def test_long_names_skipped_on_spec_wire() -> None:
    s = ready()
    assert s.enqueue([FileOp("/" + "x" * 300, Operation.DELETE)]) == 0


CZMQ = load_wire("czmq")


@pytest.mark.parametrize("chunk", [10, 7])
@pytest.mark.parametrize("credit", [1, 9, 10, 11, 1000])
def test_czmq_wire_ends_every_file_with_an_empty_chunk(chunk: int, credit: int) -> None:
    """As the reference server: data chunks eof=0, then a zero-length chunk eof=1 + headers."""
    content = {"src/a": bytes(range(37)), "src/b": b"", "src/c": b"xyz" * 7, "src/d": b"q" * 10}
    s = ServerSession(CZMQ, b"c1", 0.0, chunk_size=chunk)
    s.receive(fmq_msg_czmq.encode(fmq_msg_czmq.Ohai()), 0.0)
    s.enqueue(
        [
            FileOp(f"/{n}", Operation.CREATE, f"src/{n}", len(content[f"src/{n}"]), 5, n * 40)
            for n in "abcd"
        ]
    )
    s.enqueue_marker("/")
    s.receive(fmq_msg_czmq.encode(fmq_msg_czmq.Nom(credit, 0)), 0)
    chunks: list[fmq_msg_czmq.Cheezburger] = []
    for _ in range(10_000):
        plan = s.next_chunk()
        if plan is None:
            if not s.queued:
                break
            s.receive(fmq_msg_czmq.encode(fmq_msg_czmq.Nom(credit, 0)), 0)
            continue
        data = content.get(plan.op.source, b"")[plan.offset : plan.offset + plan.size]
        msg = fmq_msg_czmq.decode(s.chunk_frames(plan, data))
        assert isinstance(msg, fmq_msg_czmq.Cheezburger)
        chunks.append(msg)
    assert [c.sequence for c in chunks] == list(range(len(chunks)))
    for n in "abcd":
        mine = [c for c in chunks if c.filename == f"/{n}"]
        data = content[f"src/{n}"]
        assert b"".join(c.chunk for c in mine) == data
        assert all(c.chunk for c in mine[:-1]) and mine[-1].chunk == b""  # one empty, last
        assert [c.eof for c in mine] == [0] * (len(mine) - 1) + [1]
        assert mine[-1].offset == len(data)
        version = {"sha1": n * 40, "size": str(len(data)), "mtime_ns": "5"}
        assert mine[-1].headers == version
        assert mine[0].headers == version  # the first chunk names the version too (resume)
        assert all(not c.headers for c in mine[1:-1])
    assert chunks[-1].operation == 0 and chunks[-1].headers["resync"] == "complete"


def test_czmq_wire_short_read_still_ends_with_an_empty_chunk() -> None:
    s = ServerSession(CZMQ, b"c1", 0.0, chunk_size=100)
    s.receive(fmq_msg_czmq.encode(fmq_msg_czmq.Ohai()), 0.0)
    s.enqueue([FileOp("/a", Operation.CREATE, "a", 20, 0, "a" * 40)])
    s.receive(fmq_msg_czmq.encode(fmq_msg_czmq.Nom(100, 0)), 0)
    sent = []
    while (plan := s.next_chunk()) is not None:
        data = b"12345" if plan.size else b""  # the file shrank to 5 bytes
        msg = fmq_msg_czmq.decode(s.chunk_frames(plan, data))
        assert isinstance(msg, fmq_msg_czmq.Cheezburger)
        sent.append(msg)
    assert [(c.offset, c.chunk, c.eof) for c in sent] == [(0, b"12345", 0), (5, b"", 1)]
    assert sent[-1].headers["size"] == "20"  # the client's check fails: it asks again


def _icanhaz_raw(options: int, cache: int) -> list[bytes]:
    """An ICANHAZ of ``/`` whose hashes hold that many minimal entries (an empty key,
    an empty value: 5 octets each), as a hostile client makes them."""
    tiny = b"\x00\x00\x00\x00\x00"
    raw = b"\xaa\xa3\x05\x01/" + options.to_bytes(4, "big") + tiny * options
    return [raw + cache.to_bytes(4, "big") + tiny * cache]


@pytest.mark.parametrize(("options", "cache"), [(257, 0), (0, 2_000_001)])
def test_a_file_list_past_its_limit_is_refused_before_it_is_decoded(
    options: int, cache: int
) -> None:
    """A 128 MiB ICANHAZ of tiny entries would decode into ~30x its size in Python
    objects: the cache holds 2,000,000 entries at most, the options 256 (the models'
    ``limit=``); over it: RTFM, the session closed, nothing subscribed."""
    s = ready()
    actions = s.receive(_icanhaz_raw(options, cache), 1.0)
    answer = replies(actions)
    assert len(answer) == 1 and isinstance(answer[0], fmq_msg.Rtfm)
    assert "more than" in answer[0].reason
    assert any(isinstance(a, Close) for a in actions)
    assert not any(isinstance(a, Subscribe) for a in actions)
    if options:  # the limit itself is accepted (2,000,000 entries: seconds to decode)
        s = ready()
        assert replies(s.receive(_icanhaz_raw(256, 0), 1.0)) == [fmq_msg.IcanhazOk()]


def _session_asking(answer: bool) -> tuple[ServerSession, list[tuple[str, bytes, str]]]:
    """A ready session whose I/O layer answers ``answer`` to every up-to-date question,
    and the questions it was asked."""
    asked: list[tuple[str, bytes, str]] = []

    def up_to_date(_session: ServerSession, sub: Subscribe, octets: bytes, attrs: str) -> bool:
        asked.append((sub.path, octets, attrs))
        return answer

    s = ServerSession(WIRE, b"c1", 0.0, up_to_date=up_to_date)
    assert replies(s.receive(frames(fmq_msg.Ohai()), 0.0)) == [fmq_msg.OhaiOk()]
    return s, asked


def test_a_resync_the_server_finds_up_to_date_is_subscribed_without_its_cache() -> None:
    """The I/O layer is asked with the cache as it came (octets, not a dict) and the
    ATTRS text; a yes subscribes with nothing to plan and nothing decoded."""
    cache = {"a.txt": "a" * 40, "d/b.txt": "b" * 40}
    options = {"RESYNC": "1", "META": "777", "ATTRS": "a.txt\tf\t644\t1"}
    s, asked = _session_asking(True)
    actions = s.receive(frames(fmq_msg.Icanhaz("/", options, cache)), 1.0)
    assert replies(actions) == [fmq_msg.IcanhazOk()]
    sub = next(a for a in actions if isinstance(a, Subscribe))
    assert sub.up_to_date and sub.cache == {} and sub.attrs == {} and sub.resync
    sent = fmq_msg.encode(fmq_msg.Icanhaz("/", {}, cache))[0][9:]  # (after path, options)
    assert asked == [("/", sent, options["ATTRS"])]
    s, asked = _session_asking(False)
    sub = next(
        a
        for a in s.receive(frames(fmq_msg.Icanhaz("/", options, cache)), 1.0)
        if isinstance(a, Subscribe)
    )
    assert not sub.up_to_date and sub.cache == {"/a.txt": "a" * 40, "/d/b.txt": "b" * 40}
    assert sub.attrs == {"/a.txt": "f\t644\t1"} and len(asked) == 1
    s, asked = _session_asking(True)  # no resync asked: nothing to ask about
    s.receive(frames(fmq_msg.Icanhaz("/", {}, cache)), 1.0)
    assert asked == []


@pytest.mark.parametrize("resync", [False, True])
@pytest.mark.parametrize("answer", [False, True])
def test_a_cache_entry_that_does_not_decode_gets_rtfm(answer: bool, resync: bool) -> None:
    """A malformed cache entry is a malformed command (``decode`` walks the lazy cache):
    RTFM and the session closed, with or without RESYNC, before anything compares the
    octets (the up-to-date check is not asked, whatever it would answer)."""
    bad = b"\x00\x00\x00\x01" + b"\x02\xff\xfe" + b"\x00\x00\x00\x01x"
    options = {"RESYNC": "1"} if resync else {}
    raw = b"\xaa\xa3\x05\x01/" + fmq_msg.encode(fmq_msg.Icanhaz("", options))[0][4:-4]
    s, asked = _session_asking(answer)
    actions = s.receive([raw + bad], 1.0)
    answer_frames = replies(actions)
    assert len(answer_frames) == 1 and isinstance(answer_frames[0], fmq_msg.Rtfm)
    assert "malformed" in answer_frames[0].reason
    assert any(isinstance(a, Close) for a in actions)
    assert not any(isinstance(a, Subscribe) for a in actions)
    assert asked == []
