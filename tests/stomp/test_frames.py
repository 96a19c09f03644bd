"""The STOMP frame codec: vectors written by hand from the 1.0/1.1/1.2 specs, limits,
split input, and a serialize/parse round trip over random frames."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.stomp.errors import EncodeError, FrameError, LimitExceeded
from broker.stomp.frames import (
    ALL_COMMANDS,
    Command,
    Frame,
    FrameParser,
    Limits,
    Version,
    make_frame,
    parse_all,
    serialize,
    serialize_escaped,
    serialize_receipt,
    serialize_receipts,
)

SEND_WITH_NULS = b"SEND\ndestination:/queue/a\ncontent-length:5\n\na\x00b\x00c\x00"


def feed_all(parser: FrameParser, data: bytes) -> list[Frame]:
    return parser.feed(data)


def test_connect_with_crlf_line_ends_is_read_before_the_version_is_known() -> None:
    data = b"CONNECT\r\naccept-version:1.2\r\nhost:localhost\r\n\r\n\x00"
    (frame,) = FrameParser().feed(data)
    assert frame == Frame(Command.CONNECT, (("accept-version", "1.2"), ("host", "localhost")))


def test_connect_headers_are_not_unescaped_even_on_1_2() -> None:
    parser = FrameParser(version=Version.V1_2)
    (frame,) = parser.feed(b"CONNECT\nlogin:a\\cb\n\n\x00")
    assert frame.header("login") == "a\\cb"


def test_escapes_1_1_and_1_2() -> None:
    raw = b"SEND\nk\\cey:v\\nal\\\\ue\n\n\x00"
    for version in (Version.V1_1, Version.V1_2):
        (frame,) = FrameParser(version=version).feed(raw)
        assert frame.headers == (("k:ey", "v\nal\\ue"),)
    (frame,) = FrameParser(version=Version.V1_2).feed(b"SEND\nk:a\\rb\n\n\x00")
    assert frame.header("k") == "a\rb"


def test_backslash_r_is_undefined_on_1_1_and_fatal() -> None:
    with pytest.raises(FrameError, match="undefined escape"):
        FrameParser(version=Version.V1_1).feed(b"SEND\nk:a\\rb\n\n\x00")


def test_undefined_escape_is_fatal_and_parser_stays_broken() -> None:
    parser = FrameParser(version=Version.V1_2)
    with pytest.raises(FrameError, match=r"undefined escape sequence \\t"):
        parser.feed(b"SEND\nk:a\\tb\n\n\x00")
    with pytest.raises(FrameError):
        parser.feed(b"SEND\n\n\x00")


def test_1_0_does_not_unescape_and_keeps_cr() -> None:
    (frame,) = FrameParser(version=Version.V1_0).feed(b"SEND\nk:a\\nb\r\n\n\x00")
    assert frame.header("k") == "a\\nb\r"


def test_repeated_headers_are_kept_and_the_first_wins() -> None:
    (frame,) = FrameParser(version=Version.V1_2).feed(b"SEND\nfoo:World\nfoo:Hello\n\n\x00")
    assert frame.header("foo") == "World"
    assert frame.headers == (("foo", "World"), ("foo", "Hello"))


def test_value_may_contain_colons_after_the_first() -> None:
    (frame,) = FrameParser(version=Version.V1_0).feed(b"SEND\nurl:http://x:80/\n\n\x00")
    assert frame.header("url") == "http://x:80/"


def test_content_length_body_with_nuls() -> None:
    (frame,) = FrameParser().feed(SEND_WITH_NULS)
    assert frame.body == b"a\x00b\x00c"


def test_body_not_followed_by_nul_is_refused() -> None:
    with pytest.raises(FrameError, match="not followed by NUL"):
        FrameParser().feed(b"SEND\ncontent-length:2\n\nabc\x00")


@pytest.mark.parametrize("value", ["-1", "x", "1e3", " 3", "99999999999999999999999"])
def test_bad_content_length(value: str) -> None:
    with pytest.raises(FrameError):
        FrameParser().feed(b"SEND\ncontent-length:" + value.encode() + b"\n\nabc\x00")


def test_heartbeats_between_frames_are_skipped_and_counted() -> None:
    parser = FrameParser()
    frames = parser.feed(b"\n\r\n" + SEND_WITH_NULS + b"\n\n" + SEND_WITH_NULS + b"\r\n")
    assert len(frames) == 2
    assert parser.heartbeats == 5
    assert parser.idle


def test_a_stream_split_at_every_byte_gives_the_same_frames() -> None:
    stream = b"\n" + SEND_WITH_NULS + b"SEND\r\nk:v\r\n\r\nbody\x00\r\n" + SEND_WITH_NULS
    whole = FrameParser().feed(stream)
    assert len(whole) == 3
    parser = FrameParser()
    pieces: list[Frame] = []
    for i in range(len(stream)):
        pieces.extend(parser.feed(stream[i : i + 1]))
    assert pieces == whole
    for cut in range(1, len(stream)):
        parser = FrameParser()
        assert parser.feed(stream[:cut]) + parser.feed(stream[cut:]) == whole


def test_one_gib_content_length_is_refused_before_any_body_byte() -> None:
    parser = FrameParser()
    head = b"SEND\ndestination:/queue/a\ncontent-length:1073741824\n\n"
    with pytest.raises(LimitExceeded) as info:
        parser.feed(head)
    assert info.value.limit == "max_body"
    assert parser.buffered == 0


def test_a_body_without_content_length_is_refused_once_it_crosses_the_limit() -> None:
    parser = FrameParser(Limits(max_body=1000))
    parser.feed(b"SEND\n\n" + b"x" * 1000)
    assert parser.buffered == 1000
    with pytest.raises(LimitExceeded, match="max_body"):
        parser.feed(b"x")


def test_a_body_over_the_limit_is_refused_even_when_its_nul_came_with_it() -> None:
    parser = FrameParser(Limits(max_body=10))
    assert parser.feed(b"SEND\n\n0123456789\x00")[0].body == b"0123456789"
    with pytest.raises(LimitExceeded, match="max_body"):
        parser.feed(b"SEND\n\n0123456789A\x00")


def test_a_content_length_over_the_limit_is_refused_when_the_whole_frame_came_in_one_read() -> (
    None
):
    """(The head and body read in one step: the limit holds there too.)"""
    parser = FrameParser(Limits(max_body=10))
    ok = b"SEND\ncontent-length:10\n\n0123456789\x00"
    assert parser.feed(ok + ok)[1].body == b"0123456789"
    with pytest.raises(LimitExceeded, match="max_body"):
        parser.feed(b"SEND\ncontent-length:11\n\n0123456789A\x00")


def test_a_long_header_line_is_refused_before_its_end_arrives() -> None:
    parser = FrameParser(Limits(max_header_length=100))
    parser.feed(b"SEND\n" + b"k:" + b"v" * 98)
    with pytest.raises(LimitExceeded, match="max_header_length"):
        parser.feed(b"v")


def test_a_one_mib_header_line_is_refused_at_the_default_limit() -> None:
    parser = FrameParser()
    with pytest.raises(LimitExceeded, match="max_header_length"):
        parser.feed(b"SEND\nk:" + b"v" * (1024 * 1024) + b"\n\n\x00")


def test_too_many_headers() -> None:
    parser = FrameParser(Limits(max_headers=3))
    parser.feed(b"SEND\na:1\nb:2\nc:3\n")
    with pytest.raises(LimitExceeded, match="max_headers"):
        parser.feed(b"d:4\n")


def test_100k_headers_are_refused_at_the_default_limit() -> None:
    with pytest.raises(LimitExceeded, match="max_headers"):
        FrameParser().feed(b"SEND\n" + b"h:v\n" * 100_000 + b"\n\x00")


def test_nul_in_a_header_line() -> None:
    with pytest.raises(FrameError, match="NUL"):
        FrameParser().feed(b"SEND\nk:a\x00b\n\n\x00")


def test_header_without_colon_and_invalid_utf8() -> None:
    with pytest.raises(FrameError, match="without ':'"):
        FrameParser().feed(b"SEND\nnocolon\n\n\x00")
    with pytest.raises(FrameError, match="UTF-8"):
        FrameParser().feed(b"SEND\nk:\xff\n\n\x00")


def test_unknown_command_and_server_command_from_a_client() -> None:
    with pytest.raises(FrameError, match="unknown command"):
        FrameParser().feed(b"HELLO\n\n\x00")
    with pytest.raises(FrameError, match="unexpected command MESSAGE"):
        FrameParser().feed(b"MESSAGE\n\n\x00")


def test_garbage_without_newline_is_refused_after_a_short_command_line() -> None:
    parser = FrameParser()
    with pytest.raises(FrameError, match="command line longer"):
        parser.feed(bytes(range(11, 256)) * 4)  # no LF: never a complete line


def test_serialize_vectors() -> None:
    frame = Frame(Command.MESSAGE, (("a:b", "x\ny\\z\r"),), b"hi")
    assert serialize(frame, Version.V1_2) == b"MESSAGE\na\\cb:x\\ny\\\\z\\r\n\nhi\x00"
    assert serialize(frame, Version.V1_1) == b"MESSAGE\na\\cb:x\\ny\\\\z\r\n\nhi\x00"
    with pytest.raises(EncodeError):
        serialize(frame, Version.V1_0)
    connected = Frame(Command.CONNECTED, (("version", "1.2"),))
    assert serialize(connected, Version.V1_2) == b"CONNECTED\nversion:1.2\n\n\x00"


def test_serialize_refuses_nul_body_without_length_and_wrong_length() -> None:
    with pytest.raises(EncodeError, match="content-length"):
        serialize(Frame(Command.MESSAGE, (), b"a\x00"))
    with pytest.raises(EncodeError, match="does not match"):
        serialize(Frame(Command.MESSAGE, (("content-length", "3"),), b"a"))


# -- property: serialize then parse gives the frame back -----------------------------------

_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=12
)


@st.composite
def frames(draw: st.DrawFn, version: Version) -> Frame:
    command = draw(st.sampled_from(sorted(ALL_COMMANDS, key=str)))
    raw = version is Version.V1_0 or command in (Command.CONNECT, Command.STOMP, Command.CONNECTED)
    if raw:
        name_st = _text.filter(
            lambda s: not ({":", "\n", "\r"} & set(s)) and s != "content-length"
        )
        value_st = _text.filter(lambda s: "\n" not in s and not s.endswith("\r"))
        if version is not Version.V1_0:
            value_st = value_st.filter(lambda s: "\r" not in s)
            name_st = name_st.filter(lambda s: "\r" not in s)
    else:
        name_st = _text.filter(lambda s: s != "content-length")
        value_st = _text
        if version is Version.V1_1:
            # a raw CR is part of a 1.1 value; only a trailing CR before LF would be lost
            value_st = value_st.filter(lambda s: not s.endswith("\r"))
            name_st = name_st.filter(lambda s: "\r" not in s)
    headers = draw(st.lists(st.tuples(name_st, value_st), max_size=6))
    body = draw(st.binary(max_size=64))
    if draw(st.booleans()) or b"\0" in body:
        headers.insert(draw(st.integers(0, len(headers))), ("content-length", str(len(body))))
    if any(name == "" and value == "" for name, value in headers):
        headers = [(n, v) for n, v in headers if (n, v) != ("", "")]
    return Frame(command, tuple(headers), body)


@pytest.mark.parametrize("version", list(Version))
def test_round_trip_random_frames(version: Version) -> None:
    @settings(max_examples=150, deadline=None)
    @given(st.lists(frames(version), min_size=1, max_size=4), st.integers(1, 7))
    def check(batch: list[Frame], step: int) -> None:
        stream = b"".join(serialize(f, version) for f in batch)
        parser = FrameParser(commands=ALL_COMMANDS, version=version)
        got: list[Frame] = []
        for i in range(0, len(stream), step):
            got.extend(parser.feed(stream[i : i + step]))
        assert got == batch
        assert parse_all(stream, version) == batch

    check()


@pytest.mark.parametrize("version", [Version.V1_0, Version.V1_1, Version.V1_2])
@pytest.mark.parametrize("receipt", ["r-1", "a:b\\c", "line\nbreak", "cr\r", "näme", "nul\0"])
def test_serialize_receipt_is_serialize_of_a_receipt_frame(version: Version, receipt: str) -> None:
    frame = make_frame(Command.RECEIPT, [("receipt-id", receipt)])
    try:
        expected: bytes | type[Exception] = serialize(frame, version)
    except EncodeError:
        expected = EncodeError
    if expected is EncodeError:
        with pytest.raises(EncodeError):
            serialize_receipt(receipt, version)
    else:
        assert serialize_receipt(receipt, version) == expected


@pytest.mark.parametrize("version", [Version.V1_0, Version.V1_1, Version.V1_2])
def test_serialize_receipts_is_serialize_receipt_of_each_in_order(version: Version) -> None:
    ids = ["r-1", None, "a:b\\c", "näme", None, "7", "back\\slash", "co:lon"]
    if version is not Version.V1_0:  # (1.0 has no escapes: EncodeError for these)
        ids[3:3] = ["line\nbreak", "cr\r"]
    expected = b"".join(serialize_receipt(r, version) for r in ids if r is not None)
    assert serialize_receipts(ids, version) == expected
    assert serialize_receipts([], version) == b"" == serialize_receipts([None], version)
    with pytest.raises(EncodeError):  # (a NUL: nothing written, not the ids before it)
        serialize_receipts(["ok", "nul\0"], version)


@settings(max_examples=300, deadline=None)
@given(
    ids=st.lists(st.one_of(st.none(), st.text(alphabet="ab7\\:\n\r\0é", max_size=4)), max_size=6),
    version=st.sampled_from([Version.V1_0, Version.V1_1, Version.V1_2]),
)
def test_serialize_receipts_of_any_ids_is_serialize_receipt_of_each(
    ids: list[str | None], version: Version
) -> None:
    """Runs of plain ids (one join), ids to escape among them, NULs, empty ids."""
    try:
        expected: bytes | None = b"".join(
            serialize_receipt(r, version) for r in ids if r is not None
        )
    except EncodeError:
        expected = None
    if expected is None:
        with pytest.raises(EncodeError):
            serialize_receipts(ids, version)
    else:
        assert serialize_receipts(ids, version) == expected


def test_parsed_destinations_are_cached_per_connection_and_errors_are_not() -> None:
    from broker.stomp.destinations import parse_destinations
    from broker.stomp.errors import DestinationError

    def parse(header: str, conn: int) -> str:
        (d,) = parse_destinations(header, broker_id="b", connection_id=conn, allow_wildcards=False)
        return d.name

    # a temporary destination is the sending connection's own, cache or not
    assert parse("/temp-queue/x", 1) != parse("/temp-queue/x", 2)
    assert parse("/temp-queue/x", 1) == parse("/temp-queue/x", 1)
    for _ in range(2):  # refused every time, not remembered as anything else
        with pytest.raises(DestinationError):
            parse("/queue/a.*", 1)


# -- the parser's fast path (a whole header block at once) reads what the slow one does --

FAST_CASES = [
    b"SEND\ndestination:/queue/a\ncontent-length:3\n\nabc\x00",
    b"SEND\ndestination:/queue/a\nk:a\\cb\\nc\\\\d\nk:second\nempty:\n:novalue\n\nbody\x00",
    b"SEND\ndestination:/queue/a\nx:y:z\n\n\x00\n\nSEND\ndestination:/queue/b\n\nq\x00",
    b"SUBSCRIBE\nid:1\ndestination:/queue/\xc3\xa9t\xc3\xa9\n\n\x00",
    b"SEND\r\ndestination:/queue/crlf\r\n\r\nc\x00",
]


@pytest.mark.parametrize("data", FAST_CASES)
def test_whole_and_byte_by_byte_parses_are_the_same(data: bytes) -> None:
    whole = FrameParser(version=Version.V1_2).feed(data)
    split = FrameParser(version=Version.V1_2)
    pieces: list[Frame] = []
    for byte in data:
        pieces.extend(split.feed(bytes([byte])))
    assert whole == pieces and whole


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"SEND\na:1\nb:2\nc:3\nd:4\n\n\x00", "max_headers"),
        (b"SEND\nlong:" + b"v" * 40 + b"\n\n\x00", "max_header_length"),
        (b"SEND\nlong:" + "é".encode() * 15 + b"\n\n\x00", "max_header_length"),
        (b"SEND\nno colon\n\n\x00", "without ':'"),
        (b"SEND\nk:\xff\n\n\x00", "UTF-8"),
        (b"SEND\nk:a\\qb\n\n\x00", "undefined escape"),
        (b"FLY\nk:v\n\n\x00", "unknown command"),
        (b"SEND\ncontent-length:99999\n\n\x00", "max_body"),
    ],
)
def test_a_whole_bad_header_block_gets_the_same_error(data: bytes, match: str) -> None:
    limits = Limits(max_headers=3, max_header_length=20, max_body=1000)
    with pytest.raises(FrameError, match=match):
        FrameParser(limits, version=Version.V1_2).feed(data)


@pytest.mark.parametrize("version", [Version.V1_1, Version.V1_2])
def test_serialize_escaped_writes_what_serialize_writes(version: Version) -> None:
    headers = [
        ("subscription", "s:1"),
        ("message-id", "m\n2"),
        ("destination", "/queue/a\\b"),
        ("content-length", "4"),
        ("k\r", "v:\r\n"),
        ("é", "ü"),
    ]
    frame = Frame(Command.MESSAGE, tuple(headers), b"a\x00bc")
    assert serialize_escaped(Command.MESSAGE, headers, frame.body, version) == serialize(
        frame, version
    )
    with pytest.raises(EncodeError):
        serialize_escaped(Command.MESSAGE, [("k", "a\x00b")], b"", version)
