"""SENDs alike but the value of their last ``receipt`` header as one unit (session 22),
against the one-frame-at-a-time readers.

stomp.py sorts a frame's headers, so a producer asking a receipt per SEND writes
``content-length``, ``destination``, then ``receipt:N``: every head is one lead plus a
last line that differs.  The parser gives such SENDs as one ``SendStreak`` with
``receipts``; the session reads its lead once and answers the run's receipts in one go.

* the parser: the frames of its items are what ``feed_until_error`` gives, on generated
  streams (receipts or not, escaped values on 1.1/1.2, values read raw on 1.0, a
  receipt header twice, a header after it, CR, NUL, bad UTF-8, a line over the limit, a
  body that lies, no NUL or no empty line where they belong), fed
  whole, byte by byte or cut anywhere -- and a streak cut at every byte;
* ``read_send_run`` over receipt streaks: each SEND's spec and receipt as
  ``parse_send_control`` gives them, the window cutting a streak (its unread SENDs keep
  their receipts);
* the session: what a batch backend publishes and writes back equals a backend taking
  one SEND at a time (a SEND refused in the middle of a run: the RECEIPTs before it,
  then the ERROR naming its receipt);
* a real listener and engine: stomp.py sending 5000 SENDs each with a receipt.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.stomp.frames import Command, Frame, FrameParser, Limits, SendStreak, Version
from broker.stomp.session import SessionConfig
from broker.stomp.subscription import read_send_run
from tests.polling import wait_until
from tests.stomp.test_send_run_reads import _oracle
from tests.stomp.test_send_streaks import _Later, _outcome, _pieces, _read, _Runs, _specs
from tests.stomp.two_doors import Broker, Connect, subscribed


def _unfolded(items: list[Frame | SendStreak]) -> list[Frame]:
    return [f for i in items for f in (i.frames() if isinstance(i, SendStreak) else [i])]


# -- the parser ---------------------------------------------------------------------------

#: leads (the head but its last line; ``{n}``: the body's length)
LEADS = [
    "SEND\ncontent-length:{n}\ndestination:/queue/a\n",  # stomp.py's
    "SEND\ndestination:/queue/a\ncontent-length:{n}\n",
    "SEND\ncontent-length:{n}\ndestination:/queue/a\nreceipt:first\n",  # a receipt twice
    "SEND\ncontent-length:{n}\ndestination:/queue/a\\cb\n",  # an escape in the lead
    "SEND\ncontent-length:{n}\ndestination:/queue/a\ntransaction:t\n",
    "SEND\ndestination:/queue/a\n",  # no content-length: the body ends at its NUL
]
#: last lines: receipts (plain, escaped, undefined escape, CR, NUL, bad UTF-8, over the
#: 64-byte line limit, empty, a colon, UTF-8) and others
LASTS = [
    b"receipt:%d",
    b"receipt:%d",
    b"receipt:r%d-x",
    b"receipt:a\\cb%d",
    b"receipt:a\\nb\\\\%d",
    b"receipt:x\\r%d",
    b"receipt:bad\\q%d",
    b"receipt:%d\r",
    b"receipt:%d\0",
    b"receipt:\xc3%d",
    b"receipt:\xc3\xa9%d",
    b"receipt:" + b"z" * 60 + b"%d",
    b"receipt:",
    b"receipt:a:b%d",
    b"x:%d",
    b"",
    b"receipt:%d\nx:1",  # a header after the receipt
]
BODIES = [b"abc", b"", b"a\0c", b"abcd", b"<head>", b"<head-end>", b"<frames>"]
#: bodies that hold their own SEND's lead and ``receipt:`` (``{tag}``), 80 bytes long
HEADY = {
    b"<head>": b"{tag}",
    b"<head-end>": b"x{tag}",
    b"<frames>": b"{tag}9\n\nab\0{tag}",
}


def _frame(lead: int, last: int, number: int, body: bytes, lie: int = 0) -> bytes:
    """A SEND: the lead, its last line (numbered), the body (``lie``: 1, one byte more
    than its content-length says; 2, no NUL after it; 3, no empty line before it)."""
    line = LASTS[last] % number if b"%d" in LASTS[last] else LASTS[last]
    if body in HEADY:  # (its lead with the content-length 80, then receipt:)
        tag = LEADS[lead].format(n=80 - (lie == 1)).encode() + b"receipt:"
        held = HEADY[body].replace(b"{tag}", tag)
        body = (held.rjust if body == b"<head-end>" else held.ljust)(80, b".")[-80:]
    head = LEADS[lead].format(n=len(body) - (lie == 1)).encode() + (line + b"\n" if line else b"")
    if "{n}" not in LEADS[lead] and b"\0" in body:
        body = b"nul"  # (a NUL would end it early: another frame)
    # (2: no NUL after the body, 3: no empty line after the head -- one byte instead)
    return head + (b"Z" if lie == 3 else b"\n") + body + (b"X" if lie == 2 else b"\0")


STREAMS = st.lists(
    st.tuples(
        st.sampled_from([0, 0, 1, 2, 3, 4, 5]),
        st.integers(1, 8),  # SENDs of that lead in a row
        st.sampled_from([0, 0, 0, 1, 2, 14, 15]) | st.integers(0, len(LASTS) - 1),
        st.integers(0, len(BODIES) - 1),
        st.integers(-1, 8),  # the SEND (if any) whose last line is a hostile one instead
        st.integers(0, len(LASTS) - 1),
        st.sampled_from([0, 0, 0, 1, 2, 3]),  # the last SEND lies (``_frame``)
    ),
    min_size=1,
    max_size=6,
)


def _stream(parts: list[tuple[int, int, int, int, int, int, bool]]) -> bytes:
    out = []
    number = itertools.count()
    for lead, times, last, body, odd, other, lie in parts:
        for i in range(times):
            out.append(
                _frame(
                    lead,
                    other if i == odd else last,
                    next(number),
                    BODIES[body],
                    lie if i == times - 1 else 0,
                )
            )
    return b"".join(out)


def _parser(version: Version | None) -> FrameParser:
    return FrameParser(limits=Limits(max_header_length=64), version=version)


@settings(max_examples=400, deadline=None)
@given(
    parts=STREAMS,
    version=st.sampled_from([None, Version.V1_0, Version.V1_1, Version.V1_2]),
    cuts=st.lists(st.integers(1, 600), max_size=4),
)
def test_receipt_streaks_unfold_to_the_frames_the_parser_gives(
    parts: list[tuple[int, int, int, int, int, int, bool]],
    version: Version | None,
    cuts: list[int],
) -> None:
    """Every stream, whole, byte by byte or in pieces: the streak reading's frames,
    error, idleness and heart-beat count are the frame reading's."""
    stream = _stream(parts)
    for pieces in _pieces(stream, cuts):
        expected = _read(_parser(version), pieces, streaks=False)
        assert _read(_parser(version), pieces, streaks=True) == expected


def _receipt_streaks(
    parser: FrameParser, pieces: list[bytes]
) -> tuple[list[Frame], list[SendStreak]]:
    """The frames of what ``pieces`` bring, and the receipt streaks among them."""
    frames: list[Frame] = []
    found = []
    for piece in pieces:
        items, error = parser.feed_streaks_until_error(piece)
        assert error is None
        frames += _unfolded(items)
        found += [i for i in items if isinstance(i, SendStreak) and i.receipts is not None]
    return frames, found


def test_stomp_py_sends_with_a_receipt_each_come_as_streaks_with_their_receipts() -> None:
    """stomp.py's heads (``receipt:N`` last) in 64 KiB reads: every SEND with its receipt
    and body, in order; all but the first two and one per read boundary in receipt
    streaks, which share one lead tuple without a receipt."""
    lead = b"SEND\ncontent-length:100\ndestination:/queue/bench\n"
    stream = b"".join(lead + b"receipt:%d\n\n" % i + b"%0100d\0" % i for i in range(3000))
    pieces = [stream[at : at + 65536] for at in range(0, len(stream), 65536)]
    frames, streaks = _receipt_streaks(FrameParser(version=Version.V1_2), pieces)
    assert [(f.header("receipt"), f.body) for f in frames] == [
        (str(i), b"%0100d" % i) for i in range(3000)
    ]
    assert sum(len(s.bodies) for s in streaks) >= 3000 - 2 - len(pieces)
    assert len({id(s.headers) for s in streaks}) == 1
    assert streaks[0].headers == (("content-length", "100"), ("destination", "/queue/bench"))
    assert streaks[0].header("receipt") == "2"


@pytest.mark.parametrize("version", [Version.V1_0, Version.V1_1, Version.V1_2])
def test_a_receipt_streak_cut_at_every_byte_gives_the_frames_the_parser_gives(
    version: Version,
) -> None:
    """Thirteen receipt SENDs (an escaped value, a CR before the EOL, a UTF-8 one), a plain SEND,
    four more: split in two at every byte, the same frames as the frame reading -- and
    read whole, receipt streaks do come."""
    numbers = itertools.count()
    frames = [_frame(0, 0, next(numbers), b"abc") for _ in range(5)]
    frames += [_frame(0, last, next(numbers), b"abc") for last in (3, 7, 10)]
    frames += [_frame(0, 0, next(numbers), b"ab") for _ in range(5)]
    frames += [_frame(0, 15, 0, b"abc")] + [_frame(0, 0, next(numbers), b"abc") for _ in range(4)]
    stream = b"".join(frames)
    for cut in range(1, len(stream)):
        pieces = [stream[:cut], stream[cut:]]
        expected = _read(FrameParser(version=version), pieces, streaks=False)
        assert expected[1] is None and len(expected[0]) == len(frames)
        assert _read(FrameParser(version=version), pieces, streaks=True) == expected, cut
    assert _receipt_streaks(FrameParser(version=version), [stream])[1]


@pytest.mark.parametrize("numbers", ["one length", "lengths vary"])
@pytest.mark.parametrize("version", [None, Version.V1_0, Version.V1_1, Version.V1_2])
def test_every_odd_send_in_the_middle_of_a_receipt_streak_gives_what_the_parser_gives(
    version: Version | None, numbers: str
) -> None:
    """Every last line and every lie (``_frame``) on the fifth of nine receipt SENDs of
    one lead, and on the last one (a read's last piece), whole and cut in three.  The
    others' values are of one length (``1000i``: five digits, as ``i\\nx:1`` on the odd
    one -- the strides' way) or of lengths that vary (the pieces' way)."""
    for last, lie, at in itertools.product(range(len(LASTS)), range(4), (4, 8)):
        frames = [
            _frame(0, last, i, b"abc", lie)
            if i == at
            else _frame(0, 0, 10000 + i if numbers == "one length" else i * 10 ** (i % 3), b"abc")
            for i in range(9)
        ]
        stream = b"".join(frames)
        for pieces in ([stream], [stream[:100], stream[100:300], stream[300:]]):
            expected = _read(_parser(version), pieces, streaks=False)
            got = _read(_parser(version), pieces, streaks=True)
            assert got == expected, (LASTS[last], lie, at)


@pytest.mark.parametrize("body", list(HEADY))
def test_bodies_holding_their_own_head_give_the_frames_the_parser_gives(body: bytes) -> None:
    """Receipt SENDs whose bodies hold ``lead + receipt:`` (at the start, at the end,
    twice around what looks like a frame), every fourth one, in 3 reads cut anywhere."""
    frames = [_frame(0, 0, i, body if i % 4 == 3 else b"y" * 80) for i in range(14)]
    stream = b"".join(frames)
    for cut in range(1, len(stream), 7):
        pieces = [stream[:cut], stream[cut : cut + 300], stream[cut + 300 :]]
        expected = _read(FrameParser(version=Version.V1_2), pieces, streaks=False)
        assert expected[1] is None and len(expected[0]) == len(frames)
        assert _read(FrameParser(version=Version.V1_2), pieces, streaks=True) == expected, cut


def test_a_receipt_header_twice_is_not_read_as_a_receipt_streak() -> None:
    """``receipt:first`` in the lead and ``receipt:N`` last: the first counts, so these
    SENDs come as frames (their heads differ), each with both headers."""
    stream = b"".join(_frame(2, 0, i, b"abc") for i in range(6))
    items, error = FrameParser(version=Version.V1_2).feed_streaks_until_error(stream)
    assert error is None and all(isinstance(item, Frame) for item in items)
    assert [f.header("receipt") for f in items] == ["first"] * 6  # type: ignore[union-attr]


# -- the run reader -----------------------------------------------------------------------

_LEAD = (("content-length", "1"), ("destination", "/queue/a"))
#: leads of receipt streaks: stomp.py's, another queue, user headers, a bad destination,
#: a transaction
STREAK_LEADS = [
    _LEAD,
    (("content-length", "1"), ("destination", "/queue/b")),
    (*_LEAD, ("x", "y"), ("persistent", "true")),
    (("content-length", "1"), ("destination", "nowhere")),
    (*_LEAD, ("transaction", "t")),
]

ITEMS = st.lists(
    st.tuples(
        st.integers(0, len(STREAK_LEADS) - 1),
        st.integers(0, 2),  # 0: a receipt streak, 1: a plain streak, 2: frames with receipts
        st.integers(1, 6),  # SENDs
    ),
    max_size=8,
)


def _items(spec: list[tuple[int, int, int]]) -> list[Frame | SendStreak]:
    items: list[Frame | SendStreak] = []
    number = itertools.count()
    for lead, kind, sends in spec:
        headers = STREAK_LEADS[lead]
        receipts = [f"r{next(number)}" for _ in range(sends)]
        bodies = [b"%d" % (len(r) % 10) for r in receipts]
        if kind == 0:
            items.append(SendStreak(Command.SEND, headers, bodies, receipts))
        elif kind == 1:
            items.append(SendStreak(Command.SEND, headers, bodies))
        else:
            items += [
                Frame(Command.SEND, (*headers, ("receipt", r)), b)
                for r, b in zip(receipts, bodies, strict=True)
            ]
    return items


@settings(max_examples=500, deadline=None)
@given(spec=ITEMS, room=st.integers(0, 30), room_bytes=st.integers(0, 30))
def test_a_run_of_receipt_streaks_reads_as_each_send_in_turn(
    spec: list[tuple[int, int, int]], room: int, room_bytes: int
) -> None:
    """The SENDs, receipts and size of each SEND read alone; the items read whole and
    the cut streak's unread SENDs (receipts with them) add up to the SENDs taken."""
    items = _items(spec)
    run = read_send_run(items, room, room_bytes, broker_id="b", connection_id=7, now_ms=0)
    assert _specs(run) == _oracle(_unfolded(items), room, room_bytes, 0)
    read = _unfolded(items[: run.items])
    if run.rest is not None:
        cut = items[run.items]
        assert isinstance(cut, SendStreak)
        head, rest = cut.split(len(cut.bodies) - len(run.rest.bodies))
        assert rest == run.rest and head.frames() + rest.frames() == cut.frames()
        read += head.frames()
    assert len(read) == run.sends


# -- the session --------------------------------------------------------------------------

#: SENDs (lead, last line) a session stream repeats, and what comes between them
SESSION_SENDS = [(0, 0), (0, 0), (0, 3), (0, 6), (1, 0), (2, 0), (4, 0), (0, 15), (0, 14)]
OTHERS = [
    b"\n",
    b"BEGIN\ntransaction:t\n\n\0",
    b"COMMIT\ntransaction:t\nreceipt:c\n\n\0",
    b"SUBSCRIBE\nid:s\ndestination:/queue/z\nreceipt:sub\n\n\0",
]
SESSION_STREAMS = st.lists(
    st.one_of(
        st.tuples(
            st.integers(0, len(SESSION_SENDS) - 1),
            st.integers(1, 10),  # SENDs in a row
            st.integers(-1, 9),  # the one whose body is ``refuse`` (the backend refuses it)
        ),
        st.integers(0, len(OTHERS) - 1),
    ),
    min_size=1,
    max_size=6,
)


def _session_stream(parts: list[tuple[int, int, int] | int]) -> bytes:
    out = []
    number = itertools.count()
    for part in parts:
        if isinstance(part, int):
            out.append(OTHERS[part])
            continue
        send, times, refused = part
        lead, last = SESSION_SENDS[send]
        for i in range(times):
            body = b"refuse" if i == refused else b"b%d" % (i % 10)
            out.append(_frame(lead, last, next(number), body))
    return b"".join(out)


WINDOWS = [(1, 1 << 24), (3, 1 << 24), (4, 9), (1000, 1 << 24)]


@settings(max_examples=400, deadline=None)
@given(
    parts=SESSION_STREAMS,
    version=st.sampled_from([Version.V1_0, Version.V1_1, Version.V1_2]),
    window=st.sampled_from(WINDOWS),
    cuts=st.lists(st.integers(1, 800), max_size=5),
)
def test_a_session_reading_receipt_streaks_answers_as_one_send_at_a_time(
    parts: list[tuple[int, int, int] | int],
    version: Version,
    window: tuple[int, int],
    cuts: list[int],
) -> None:
    """The same SENDs published, the same bytes written back (RECEIPTs, then an ERROR
    naming the refused SEND's receipt), the same state, as a backend taking one SEND at
    a time."""
    stream = _session_stream(parts)
    config = SessionConfig(max_unanswered_sends=window[0], max_unanswered_bytes=window[1])
    streaks = _outcome(_Runs(), version, stream, cuts, config)
    assert streaks == _outcome(_Later(), version, stream, cuts, config)


def test_a_send_refused_mid_run_gets_the_receipts_before_it_then_its_error() -> None:
    """Twenty SENDs with receipts 0..19 in one read, the eighth refused: RECEIPTs 0..6
    in order, then an ERROR with ``receipt-id:7``, nothing after it -- as one by one."""
    frames = [_frame(0, 0, i, b"refuse" if i == 7 else b"ok") for i in range(20)]
    stream = b"".join(frames)
    config = SessionConfig()
    log, out, *_ = _outcome(_Runs(), Version.V1_2, stream, [], config)
    assert [body for _, _, body in log] == [b"ok"] * 7
    receipts = b"".join(b"RECEIPT\nreceipt-id:%d\n\n\0" % i for i in range(7))
    assert out.split(b"\0", 1)[1].startswith(receipts)  # (after CONNECTED)
    error = out[out.index(b"ERROR") :]
    assert b"\nreceipt-id:7\n" in error and error.count(b"\0") == 1
    assert (log, out) == _outcome(_Later(), Version.V1_2, stream, [], config)[:2]


# -- a real listener ----------------------------------------------------------------------

SENDS = 5000


def test_stomp_py_sending_5000_sends_with_receipts_gets_every_receipt_in_order(
    broker: Broker, stomp_client: Connect, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stomp.py producer sends 5000 SENDs, ``receipt=str(i)`` on each, without
    waiting; an ``ack:auto`` consumer: every RECEIPT comes, in order, every message is
    delivered once, in order, and no ERROR."""
    read: list[int] = []
    receipts_of = FrameParser._read_receipts

    def counted(self: FrameParser, frames: list[Any], *args: Any) -> Any:
        before = len(frames)
        got = receipts_of(self, frames, *args)
        read.extend(len(s.bodies) for s in frames[before:])
        return got

    monkeypatch.setattr(FrameParser, "_read_receipts", counted)
    consumer, messages = stomp_client()
    consumer.subscribe("/queue/receipts", id="s", ack="auto")
    assert wait_until(lambda: subscribed(broker, "receipts", 1))
    producer, answers = stomp_client()
    for i in range(SENDS):
        producer.send("/queue/receipts", b"%06d" % i, receipt=str(i))
    assert wait_until(lambda: len(answers.receipts) >= SENDS and len(messages.messages) >= SENDS)
    assert answers.receipts == [str(i) for i in range(SENDS)]
    assert messages.bodies() == [f"{i:06d}" for i in range(SENDS)]
    assert not answers.errors and not messages.errors
    assert sum(read) > 0  # (the listener read some as receipt streaks)
