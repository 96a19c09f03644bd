"""The listener's SEND path read once per head (session 20), against the general readers.

* ``FrameParser._read_repeats``: a head byte for byte the head before it is read with
  one comparison.  Streams of runs of one head (heads that change mid-run, escapes, CR,
  NUL, bad UTF-8, over-long lines, a content-length that changes or lies, a transaction
  header appearing, a receipt on the last SEND only) must give what each frame gives
  alone, fed whole, byte by byte or cut anywhere.
* ``read_send_run``: a run's header block is read once (the same tuple again, or a
  receipt lead plus its receipt).  On generated runs it must give what
  ``parse_send_control`` of each frame in turn gives, with the session's stops (not a
  SEND, a transaction, a SEND that does not parse, the window's room in SENDs and bytes).
"""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.stomp.errors import StompError
from broker.stomp.frames import Command, Frame, FrameParser, Limits, Version
from broker.stomp.subscription import PublishSpec, SendRun, parse_send_control, read_send_run

# -- the parser ---------------------------------------------------------------------------

# heads (without the empty line): three of one lead that differ in their last line, and
# hostile ones that start like them
HEADS = [
    b"SEND\ncontent-length:3\ndestination:/queue/a",
    b"SEND\ncontent-length:3\ndestination:/queue/b",
    b"SEND\ncontent-length:3\ndestination:/queue/a\\cb",
    b"SEND\ncontent-length:3\ndestination:/queue/a\r",
    b"SEND\ncontent-length:3\ndestination:/queue/\0a",
    b"SEND\ncontent-length:3\ndestination:/queue/\xc3",
    b"SEND\ncontent-length:3\ndestination:/queue/\xc3\xa9",
    b"SEND\ncontent-length:3\ndestination:" + b"z" * 70,
    b"SEND\ncontent-length:3\ndestination:/queue/a\ntransaction:t1",
    b"SEND\ncontent-length:3\ntransaction:t1",
    b"SEND\ncontent-length:2\ndestination:/queue/a",
    b"SEND\ncontent-length:x\ndestination:/queue/a",
    b"SEND\ndestination:/queue/a\nreceipt:1",
    b"SEND\ndestination:/queue/a\nreceipt:2",
    b"SEND\ndestination:/queue/a\ncontent-length:3",
    b"SEND\ndestination:/queue/a\ncontent-length:03",
    b"SEND\ndestination:/queue/a",
    b"ACK\nid:1",
]
# bodies: what content-length 3 says, shorter, longer (no NUL where it says), with a NUL
BODIES = [b"abc", b"ab", b"abcd", b"a\0c", b""]

RUNS = st.lists(
    st.tuples(
        st.integers(0, len(HEADS) - 1),
        st.integers(1, 5),  # how many times in a row
        st.integers(0, len(BODIES) - 1),
        st.booleans(),  # the run's last frame has its own body (index + 1)
    ),
    min_size=1,
    max_size=6,
)


def _frames(runs: list[tuple[int, int, int, bool]]) -> list[bytes]:
    out = []
    for head, times, body, odd_last in runs:
        for i in range(times):
            chosen = (body + 1) % len(BODIES) if odd_last and i == times - 1 else body
            out.append(HEADS[head] + b"\n\n" + BODIES[chosen] + b"\0")
    return out


def _parser(version: Version | None) -> FrameParser:
    # a 64-byte header line limit: the long destination goes over it
    return FrameParser(limits=Limits(max_header_length=64), version=version)


def _outcome(parser: FrameParser, pieces: list[bytes]) -> tuple[list[Frame], str | None, bool]:
    out: list[Frame] = []
    for piece in pieces:
        got, error = parser.feed_until_error(piece)
        out += got
        if error is not None:
            return out, f"{type(error).__name__}: {error}", False
    return out, None, parser.idle


def _expected(frames: list[bytes], version: Version | None) -> tuple[bytes, tuple[object, ...]]:
    """The stream up to the first frame that fails or is left unfinished (what follows it
    would be read as its body), and what a parser that saw nothing before gives for each
    of its frames."""
    out: list[Frame] = []
    for kept, data in enumerate(frames, 1):
        got, error, idle = _outcome(_parser(version), [data])
        out += got
        if error is not None or not idle:
            return b"".join(frames[:kept]), (out, error, idle)
    return b"".join(frames), (out, None, True)


@settings(max_examples=300, deadline=None)
@given(
    runs=RUNS,
    version=st.sampled_from([None, Version.V1_0, Version.V1_1, Version.V1_2]),
    cuts=st.lists(st.integers(1, 400), max_size=4),
)
def test_runs_of_repeated_heads_give_what_each_frame_gives_alone(
    runs: list[tuple[int, int, int, bool]], version: Version | None, cuts: list[int]
) -> None:
    stream, expected = _expected(_frames(runs), version)
    assert _outcome(_parser(version), [stream]) == expected
    one_by_one = [stream[i : i + 1] for i in range(len(stream))]
    assert _outcome(_parser(version), one_by_one) == expected
    bounds = [0, *sorted(set(cuts)), len(stream)]
    pieces = [stream[a:b] for a, b in itertools.pairwise(bounds) if b > a]
    assert _outcome(_parser(version), pieces) == expected


def test_every_head_after_a_run_of_another_gives_what_it_gives_alone() -> None:
    """Every pair of heads: four of one (the last two read by the comparison), two of the
    other, one of the first again, each over the body its content-length says, under
    every version (the random test above seldom builds such long runs)."""
    for version, (a, b) in itertools.product(
        [None, Version.V1_0, Version.V1_2], itertools.product(range(len(HEADS)), repeat=2)
    ):
        stream, expected = _expected(
            _frames([(a, 4, 0, False), (b, 2, 0, False), (a, 1, 0, False)]), version
        )
        assert _outcome(_parser(version), [stream]) == expected, (version, HEADS[a], HEADS[b])


def test_a_repeated_head_whose_body_has_no_nul_where_it_says_is_refused_as_alone() -> None:
    """Five heads alike (the last ones read by the comparison), then the same head over a
    body one byte longer than its content-length: the error a fresh parser gives."""
    head = b"SEND\ncontent-length:3\ndestination:/queue/a\n\n"
    good = head + b"abc\0"
    bad = head + b"abcd\0"
    frames, error = FrameParser(version=Version.V1_2).feed_until_error(good * 5 + bad + good)
    assert [f.body for f in frames] == [b"abc"] * 5
    alone = FrameParser(version=Version.V1_2).feed_until_error(bad)[1]
    assert error is not None and alone is not None and str(error) == str(alone)


def test_a_receipt_on_the_last_send_only_is_read_after_a_run_of_equal_heads() -> None:
    head = b"SEND\ncontent-length:1\ndestination:/queue/a\n"
    stream = (head + b"\nx\0") * 4 + head + b"receipt:9\n\ny\0" + (head + b"\nz\0") * 2
    got = FrameParser(version=Version.V1_2).feed(stream)
    assert [(f.headers, f.body) for f in got] == [
        ((("content-length", "1"), ("destination", "/queue/a")), b"x")
    ] * 4 + [
        ((("content-length", "1"), ("destination", "/queue/a"), ("receipt", "9")), b"y"),
        ((("content-length", "1"), ("destination", "/queue/a")), b"z"),
        ((("content-length", "1"), ("destination", "/queue/a")), b"z"),
    ]


# -- the run reader -----------------------------------------------------------------------


def _flat(run: SendRun) -> tuple[list[PublishSpec], list[str | None], int]:
    """A run as each SEND's spec, its receipts and its size (what the oracle gives)."""
    assert run.sends == sum(len(s.bodies) for s in run.streaks)
    return [spec for streak in run.streaks for spec in streak.specs()], run.receipts, run.size


# header blocks: receipt leads and their receipts, the same in other orders, repeats,
# user headers, transactions, bad or empty destinations, ttl (which reads the clock)
_LEAD = (("content-length", "3"), ("destination", "/queue/a"))
BLOCKS: list[tuple[tuple[str, str], ...]] = [
    _LEAD,
    (*_LEAD, ("receipt", "1")),
    (*_LEAD, ("receipt", "2")),
    (*_LEAD, ("receipt", "")),
    (("destination", "/queue/a"), ("receipt", "3")),
    (("destination", "/queue/b"), ("receipt", "4")),
    (("destination", "/queue/a,/topic/t"), ("receipt", "5")),
    (("receipt", "6"), ("destination", "/queue/a")),
    (("receipt", "0"), ("destination", "/queue/a"), ("receipt", "7")),
    (("destination", "/queue/a"), ("destination", "/queue/b"), ("receipt", "8")),
    (*_LEAD, ("content-length", "4"), ("receipt", "9")),
    (*_LEAD, ("transaction", "t"), ("receipt", "10")),
    (*_LEAD, ("transaction", "t")),
    (("content-length", "3"), ("receipt", "11")),
    (("destination", ""), ("receipt", "12")),
    (("destination", "nowhere"), ("receipt", "13")),
    (("destination", "/queue/a.*"), ("receipt", "14")),
    (*_LEAD, ("x", "y"), ("receipt", "15")),
    (*_LEAD, ("persistent", "true"), ("receipt", "16")),
    (*_LEAD, ("persistent", "maybe"), ("receipt", "17")),
    (*_LEAD, ("ttl", "5")),
    (*_LEAD, ("reply-to", "/temp-queue/r"), ("receipt", "18")),
    (("x", "1"), ("receipt", "19")),
    (("receipt", "20"),),
    (),
]
COMMANDS = [Command.SEND] * 6 + [Command.ACK, Command.BEGIN]

SENDS = st.lists(
    st.tuples(
        st.integers(0, len(BLOCKS) - 1),
        st.booleans(),  # the block's own tuple (shared), or an equal copy
        st.integers(0, len(COMMANDS) - 1),
        st.integers(0, 4),  # body size
    ),
    max_size=30,
)


def _copy(block: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """An equal tuple that is not the same object (nor are its pairs)."""
    return tuple((f"{name} "[:-1], f"{value} "[:-1]) for name, value in block)


def _oracle(
    frames: list[Frame], room: int, room_bytes: int, now_ms: int
) -> tuple[list[PublishSpec], list[str | None], int]:
    """The session's run loop before session 20: ``parse_send_control`` of every SEND
    (its receipts as ``read_send_run`` gives them: no list when none was asked)."""
    specs: list[PublishSpec] = []
    receipts: list[str | None] = []
    size = 0
    for frame in frames:
        if frame.command is not Command.SEND or len(specs) >= room or size >= room_bytes:
            break
        try:
            spec, receipt, transaction = parse_send_control(
                frame, broker_id="b", connection_id=7, now_ms=now_ms
            )
        except StompError:
            break
        if transaction is not None:
            break
        specs.append(spec)
        receipts.append(receipt)
        size += len(spec.body)
    return specs, receipts if any(r is not None for r in receipts) else [], size


@settings(max_examples=500, deadline=None)
@given(
    sends=SENDS,
    room=st.integers(0, 40),
    room_bytes=st.integers(0, 80),
    now_ms=st.integers(0, 10**6),
)
def test_a_run_reads_as_parse_send_control_of_each_send_in_turn(
    sends: list[tuple[int, bool, int, int]], room: int, room_bytes: int, now_ms: int
) -> None:
    frames = [
        Frame(COMMANDS[command], BLOCKS[block] if shared else _copy(BLOCKS[block]), b"x" * size)
        for block, shared, command, size in sends
    ]
    got = read_send_run(frames, room, room_bytes, broker_id="b", connection_id=7, now_ms=now_ms)
    assert _flat(got) == _oracle(frames, room, room_bytes, now_ms)


def test_every_block_after_a_run_of_another_reads_as_parse_send_control_of_each() -> None:
    """Every pair of header blocks, shared tuples or equal copies: two of one, two of the
    other, one of the first again (the random test above seldom puts a block right
    after a receipt lead that shares its lead)."""
    for (a, b), shared in itertools.product(
        itertools.product(range(len(BLOCKS)), repeat=2), [True, False]
    ):
        blocks = [BLOCKS[i] if shared else _copy(BLOCKS[i]) for i in (a, a, b, b, a)]
        frames = [Frame(Command.SEND, block, b"xyz") for block in blocks]
        got = read_send_run(frames, 10, 100, broker_id="b", connection_id=7, now_ms=5)
        assert _flat(got) == _oracle(frames, 10, 100, 5), (BLOCKS[a], BLOCKS[b])


def test_runs_with_a_receipt_per_send_and_one_head_read_as_each_send_alone() -> None:
    """The two runs a producer sends (stomp.py's heads, through the parser), then a SEND
    whose lead changed, then one with a transaction (the run ends before it)."""
    lead = b"SEND\ncontent-length:1\ndestination:/queue/a\n"
    stream = b"".join(lead + b"receipt:%d\n\nx\0" % i for i in range(5))
    stream += (lead + b"\ny\0") * 4
    stream += b"SEND\ncontent-length:1\ndestination:/queue/b\nreceipt:9\n\nz\0"
    stream += lead + b"transaction:t\n\nw\0"
    frames = FrameParser(version=Version.V1_2).feed(stream)
    got = _flat(read_send_run(frames, 100, 1000, broker_id="b", connection_id=7, now_ms=0))
    assert got == _oracle(frames, 100, 1000, 0)
    specs, receipts, size = got
    assert receipts == ["0", "1", "2", "3", "4", None, None, None, None, "9"]
    assert [s.body for s in specs] == [b"x"] * 5 + [b"y"] * 4 + [b"z"] and size == 10
    assert [s.destinations[0].stomp for s in specs] == ["/queue/a"] * 9 + ["/queue/b"]
