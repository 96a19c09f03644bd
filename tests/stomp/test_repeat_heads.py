"""The parser's repeated-head path (``FrameParser._repeat_head``): once two heads in a row
start with the same command and header lines, the next head starting with those bytes
has only its last line read.  What it gives must be what a parser that never saw the
earlier frames gives, frame by frame, for well-formed and hostile heads alike (bad
escapes, CR, NUL, no colon, over-long lines, invalid UTF-8, a wrong content-length), fed
whole, byte by byte or cut anywhere, and across a change of the negotiated version."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.stomp.errors import FrameError
from broker.stomp.frames import Command, Frame, FrameParser, Limits, Version

# the leads (command and header lines but the last) the frames share, so that runs repeat
LEADS = [
    b"SEND\ncontent-length:3\ndestination:/queue/a",
    b"SEND\ndestination:/queue/a",
    b"SEND\ndestination:/queue/a\\cb\nx:y",
    b"ACK",
    b"SEND",
]
# last lines: plain, escaped, a content-length first or second, and garbage
LASTS = [
    b"receipt:1",
    b"receipt:22",
    b"content-length:3",
    b"content-length:0",
    b"content-length:x",
    b"name\\c:va\\nlue\\\\",
    b"bad:escape\\t",
    b"dangling\\",
    b"no colon",
    b"cr:1\r",
    b"nul:\0",
    b"utf8:\xc3\xa9",
    b"broken:\xc3",
    b":",
    b"long:" + b"z" * 70,
    b"id:7\nmore:1",
]
BODIES = [b"", b"abc", b"a\0c"]


def _frame(lead: int, last: int, body: int) -> bytes:
    return LEADS[lead] + b"\n" + LASTS[last] + b"\n\n" + BODIES[body] + b"\0"


def _alone(data: bytes, version: Version | None) -> tuple[list[Frame], str | None, bool]:
    """What a parser that saw nothing before gives for ``data`` (one frame's bytes), and
    whether it ended idle (not: a content-length longer than the body, still waiting)."""
    parser = _parser(version)
    frames, error = parser.feed_until_error(data)
    return frames, None if error is None else f"{type(error).__name__}: {error}", parser.idle


def _parser(version: Version | None) -> FrameParser:
    # a 64-byte header line limit: the "long" last line goes over it
    return FrameParser(limits=Limits(max_header_length=64), version=version)


def _expected(
    frames: list[bytes], version: Version | None
) -> tuple[int, tuple[list[Frame], str | None], bool]:
    """How many of ``frames`` the stream keeps (up to the first bad or unfinished one:
    what follows it would be read as its body), what they give, and whether it ends idle."""
    out: list[Frame] = []
    for kept, data in enumerate(frames, 1):
        got, error, idle = _alone(data, version)
        out += got
        if error is not None or not idle:
            return kept, (out, error), error is None and idle
    return len(frames), (out, None), True


def _fed(parser: FrameParser, pieces: list[bytes], idle: bool) -> tuple[list[Frame], str | None]:
    out: list[Frame] = []
    for piece in pieces:
        got, error = parser.feed_until_error(piece)
        out += got
        if error is not None:
            return out, f"{type(error).__name__}: {error}"
    assert parser.idle is idle
    return out, None


FRAMES = st.lists(
    st.tuples(
        st.integers(0, len(LEADS) - 1),
        st.integers(0, len(LASTS) - 1),
        st.integers(0, len(BODIES) - 1),
        st.booleans(),  # a heart-beat after it
    ),
    min_size=1,
    max_size=12,
)


def _stream(frames: list[tuple[int, int, int, bool]], kept: int, idle: bool) -> bytes:
    """The first ``kept`` frames, each with its heart-beat (not after an unfinished last
    one: it would be read as part of it)."""
    return b"".join(
        _frame(lead, last, body) + (b"\n" if beat and (idle or i < kept - 1) else b"")
        for i, (lead, last, body, beat) in enumerate(frames[:kept])
    )


@settings(max_examples=150, deadline=None)
@given(
    frames=FRAMES,
    version=st.sampled_from([None, Version.V1_0, Version.V1_1, Version.V1_2]),
    cuts=st.lists(st.integers(1, 600), max_size=5),
)
def test_a_stream_gives_what_each_frame_gives_alone_however_it_is_cut(
    frames: list[tuple[int, int, int, bool]], version: Version | None, cuts: list[int]
) -> None:
    each = [_frame(lead, last, body) for lead, last, body, _ in frames]
    kept, expected, idle = _expected(each, version)
    stream = _stream(frames, kept, idle)
    assert _fed(_parser(version), [stream], idle) == expected
    one_by_one = [stream[i : i + 1] for i in range(len(stream))]
    assert _fed(_parser(version), one_by_one, idle) == expected
    bounds = [0, *sorted(set(cuts)), len(stream)]
    pieces = [stream[a:b] for a, b in itertools.pairwise(bounds) if b > a]
    assert _fed(_parser(version), pieces, idle) == expected


def test_runs_of_one_lead_are_read_from_it_and_give_each_frame_its_own_last_header() -> None:
    """A receipt per SEND (the last line differs), a content-length last, the empty line
    right after the lead (no last line), then a longer head: each frame as sent."""
    heads = [
        b"SEND\ndestination:/queue/a\nreceipt:1\n\nabc\0",
        b"SEND\ndestination:/queue/a\nreceipt:2\n\nabc\0",
        b"SEND\ndestination:/queue/a\ncontent-length:3\n\na\0c\0",
        b"SEND\ndestination:/queue/a\n\nxy\0",
        b"SEND\ndestination:/queue/a\nreceipt:3\nextra:e\n\n\0",
        b"SEND\ndestination:/queue/a\nreceipt:4\n\n\0",
    ]
    got = FrameParser(version=Version.V1_2).feed(b"".join(heads))
    assert got == [
        Frame(Command.SEND, (("destination", "/queue/a"), ("receipt", "1")), b"abc"),
        Frame(Command.SEND, (("destination", "/queue/a"), ("receipt", "2")), b"abc"),
        Frame(Command.SEND, (("destination", "/queue/a"), ("content-length", "3")), b"a\0c"),
        Frame(Command.SEND, (("destination", "/queue/a"),), b"xy"),
        Frame(
            Command.SEND,
            (("destination", "/queue/a"), ("receipt", "3"), ("extra", "e")),
            b"",
        ),
        Frame(Command.SEND, (("destination", "/queue/a"), ("receipt", "4")), b""),
    ]


def test_a_lead_read_before_the_version_was_negotiated_is_not_reused_after() -> None:
    """Before CONNECT is answered (version None) headers are not unescaped; once the
    session sets 1.2 the same bytes mean ``a:b``, not ``a\\cb``."""
    frame = b"SEND\ndestination:/queue/a\\cb\nreceipt:1\n\n\0"
    parser = FrameParser()
    assert [f.headers[0] for f in parser.feed(frame * 3)] == [("destination", "/queue/a\\cb")] * 3
    parser.version = Version.V1_2
    assert [f.headers[0] for f in parser.feed(frame * 2)] == [("destination", "/queue/a:b")] * 2
    parser.version = Version.V1_0
    assert [f.headers[0] for f in parser.feed(frame)] == [("destination", "/queue/a\\cb")]


def test_a_bad_last_line_after_a_run_is_reported_as_alone_and_breaks_the_parser() -> None:
    good = b"SEND\ndestination:/queue/a\nreceipt:1\n\n\0"
    bad = b"SEND\ndestination:/queue/a\nreceipt\\t:2\n\n\0"
    parser = FrameParser(version=Version.V1_2)
    frames, error = parser.feed_until_error(good * 3 + bad + good)
    assert len(frames) == 3
    assert isinstance(error, FrameError) and "undefined escape sequence" in str(error)
    assert parser.feed_until_error(good) == ([], error)


def test_a_content_length_in_the_last_line_is_not_taken_as_the_leads() -> None:
    """Two heads whose last line is their content-length, then one of the same lead
    whose last line is a receipt: it has no content-length (its body ends at its NUL)."""
    lead = b"SEND\ndestination:/queue/a\n"
    stream = lead + b"content-length:1\n\nx\0" + lead + b"content-length:2\n\nxy\0"
    stream += lead + b"receipt:9\n\nabc\0"
    got = FrameParser(version=Version.V1_2).feed(stream)
    assert [(f.headers[-1], f.body) for f in got] == [
        (("content-length", "1"), b"x"),
        (("content-length", "2"), b"xy"),
        (("receipt", "9"), b"abc"),
    ]


def test_every_last_line_after_a_run_with_its_length_in_the_lead_gives_what_it_gives_alone() -> (
    None
):
    """Every last line and body after two heads that set the lead, when the lead holds the
    content-length (the run loop, ``FrameParser._read_repeats``, reads such frames whole),
    then one more good frame, fed whole: what each frame gives alone, under each version.
    (The random test above seldom puts a hostile last line after such a lead.)"""
    for version, last, body in itertools.product(
        [None, Version.V1_0, Version.V1_1, Version.V1_2], range(len(LASTS)), range(len(BODIES))
    ):
        each = [_frame(0, 0, 1), _frame(0, 1, 1), _frame(0, last, body), _frame(0, 0, 1)]
        kept, expected, idle = _expected(each, version)
        stream = b"".join(each[:kept])
        assert _fed(_parser(version), [stream], idle) == expected, (version, LASTS[last], body)
