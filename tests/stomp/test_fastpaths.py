"""The per-message fast paths give what the general code gives: the MESSAGE encoder
(``Session._encode``) against ``serialize_escaped`` of ``Session._message_headers``, the
parser's one-step frame read against the line-by-line path, ``parse_send``'s one pass."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.stomp.backend import Delivery
from broker.stomp.errors import EncodeError, ProtocolViolation
from broker.stomp.frames import (
    Command,
    Frame,
    FrameParser,
    Version,
    make_frame,
    serialize,
    serialize_escaped,
)
from broker.stomp.session import DESTINATION_LINES, SessionConfig
from broker.stomp.subscription import parse_send, parse_send_control

from .kit import Peer, World

# header text a hostile peer or a TMQP producer may use: escapes, colons, EOLs, NUL
TEXT = st.text(alphabet=st.sampled_from("ab:\\\n\r\0é c-"), max_size=6)
NAMES = st.one_of(
    TEXT,
    st.sampled_from(["subscription", "message-id", "destination", "ack", "content-length"]),
    st.sampled_from(["seq", "who", "when", "again"]),  # the optional headers' names below
)


def _subscribed(
    version: Version, sub_id: str, ack: str, include_seq: str | None, config: SessionConfig
) -> Peer:
    peer = World(config=config).connected(version)
    headers = {"id": sub_id, "destination": "/queue/q", "ack": ack}
    if include_seq is not None:
        headers["include-seq"] = include_seq
    peer.send(Command.SUBSCRIBE, headers)
    assert peer.read() == []  # (no ERROR)
    return peer


@settings(max_examples=100, deadline=None)
@given(
    version=st.sampled_from([Version.V1_1, Version.V1_2]),
    sub_id=st.text(alphabet=st.sampled_from("s1:\\\né"), min_size=1, max_size=4),
    ack=st.sampled_from(["auto", "client", "client-individual"]),
    include_seq=st.sampled_from([None, "seq", "message-id"]),
    adds=st.tuples(st.sampled_from([None, "who"]), st.sampled_from([None, "when", "who"])),
    again=st.sampled_from([None, "again"]),
    message_id=TEXT,
    destination=TEXT,
    headers=st.lists(st.tuples(NAMES, TEXT), max_size=5),
    body=st.binary(max_size=8),
    tag=st.integers(0, 10**6),
    sequence=st.one_of(st.none(), st.integers(0, 10**6)),
    sender=st.one_of(st.none(), TEXT),
    timestamp=st.one_of(st.none(), st.integers(0, 10**13)),
    redeliveries=st.integers(0, 3),
)
def test_the_message_encoder_writes_what_the_general_serializer_writes(
    version: Version,
    sub_id: str,
    ack: str,
    include_seq: str | None,
    adds: tuple[str | None, str | None],
    again: str | None,
    message_id: str,
    destination: str,
    headers: list[tuple[str, str]],
    body: bytes,
    tag: int,
    sequence: int | None,
    sender: str | None,
    timestamp: int | None,
    redeliveries: int,
) -> None:
    config = SessionConfig(
        add_user_header=adds[0], add_timestamp_header=adds[1], add_redeliveries_header=again
    )
    peer = _subscribed(version, sub_id, ack, include_seq, config)
    session = peer.session
    spec = session._subscriptions[sub_id].spec
    delivery = Delivery(
        sub_id,
        tag,
        message_id,
        destination,
        tuple(headers),
        body,
        redeliveries=redeliveries,
        sequence=sequence,
        timestamp_ms=timestamp,
        sender=sender,
    )
    try:
        expected = serialize_escaped(
            Command.MESSAGE, session._message_headers(spec, delivery), body, version
        )
    except EncodeError:
        with pytest.raises(EncodeError):
            session.deliver(delivery)
        return
    for _ in range(2):  # the second time from the encoded head and destination line
        assert session.deliver(delivery)
        assert session.take_output(peer.clock.now) == expected


def test_the_destination_lines_kept_per_subscription_are_bounded() -> None:
    """A wildcard subscription may see any number of destinations: its cache of encoded
    destination lines starts again when full, and every MESSAGE stays right."""
    peer = _subscribed(Version.V1_2, "w", "auto", None, SessionConfig())
    session = peer.session
    sub = session._subscriptions["w"]
    for i in range(3 * DESTINATION_LINES):
        name = f"/queue/d:{i}"
        assert session.deliver(Delivery("w", i, f"m{i}", name, (), b"x"))
        assert len(sub.destination_lines) <= DESTINATION_LINES
        frame = peer.read_one(Command.MESSAGE)
        assert frame.header("destination") == name and frame.header("message-id") == f"m{i}"


FRAME_TEXT = st.text(alphabet=st.sampled_from("ab:\\\n\ré-"), max_size=5)


@settings(max_examples=100, deadline=None)
@given(
    frames=st.lists(
        st.tuples(
            st.lists(st.tuples(FRAME_TEXT.filter(bool), FRAME_TEXT), max_size=4),
            st.binary(max_size=6),  # NULs included: content-length carries them
            st.sampled_from([b"", b"\n", b"\r\n", b"\n\n\r\n"]),  # heart-beats after it
        ),
        min_size=1,
        max_size=4,
    ),
    cuts=st.lists(st.integers(1, 400), max_size=6),
)
def test_frames_read_in_one_step_equal_their_encoding_however_the_stream_is_cut(
    frames: list[tuple[list[tuple[str, str]], bytes, bytes]], cuts: list[int]
) -> None:
    """1.2 frames with escaped headers, bodies holding NULs (content-length) and
    heart-beats between them: fed whole, byte by byte or cut anywhere, the parser gives
    back the frames that were written."""
    sent = [
        make_frame(Command.SEND, [*headers, ("content-length", str(len(body)))], body)
        for headers, body, _ in frames
    ]
    stream = b"".join(
        serialize(frame, Version.V1_2) + beats
        for frame, (_, _, beats) in zip(sent, frames, strict=True)
    )
    whole = FrameParser(version=Version.V1_2).feed(stream)
    assert whole == sent
    parser = FrameParser(version=Version.V1_2)
    assert [f for i in range(len(stream)) for f in parser.feed(stream[i : i + 1])] == sent
    parser = FrameParser(version=Version.V1_2)
    got: list[Frame] = []
    start = 0
    for cut in sorted(set(cuts)):
        got += parser.feed(stream[start:cut])
        start = max(start, cut)
    got += parser.feed(stream[start:])
    assert got == sent and parser.idle


NOT_CARRIED = {"destination", "receipt", "transaction", "content-length", "ttl", "expires"}


def _carried(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """What parse_send carries, said plainly: the first value of each name but the
    frame's own control headers, ``ttl`` and ``expires`` (computed, put back last)."""
    seen: set[str] = set()
    out = []
    for name, value in headers:
        if name in seen:
            continue
        seen.add(name)
        if name not in NOT_CARRIED:
            out.append((name, value))
    return out


@settings(max_examples=100, deadline=None)
@given(
    headers=st.lists(
        st.tuples(
            st.sampled_from(
                # (control headers alone, once each: parse_send's shortcut; "destination"
                # again: a second one, which must not win)
                [
                    *("a", "b", "ttl", "expires", "receipt", "persistent", "reply-to"),
                    *("destination", "transaction", "content-length"),
                ]
            ),
            st.sampled_from(["1", "x", "true", "/queue/r", "/temp-queue/r"]),
        ),
        max_size=6,
    )
)
def test_parse_send_reads_the_first_of_each_header_in_one_pass(
    headers: list[tuple[str, str]],
) -> None:
    frame = make_frame(Command.SEND, [("destination", "/queue/q"), *headers], b"b")
    first = dict(reversed(headers))
    try:
        spec = parse_send(frame, broker_id="b", connection_id=7, now_ms=1000)
    except ProtocolViolation:  # a bad ttl/expires/persistent: that first value is bad
        assert any(
            first.get(n) not in (None, *ok) for n, ok in (("persistent", ("true", "false")),)
        ) or any(not first.get(n, "0").isdigit() for n in ("ttl", "expires"))
        return
    expected = _carried(headers)
    if first.get("reply-to") == "/temp-queue/r":
        expected = [(n, "/queue/temp.b.7.r" if n == "reply-to" else v) for n, v in expected]
    expires = first.get("expires")
    if expires is None and "ttl" in first:
        expires = str(1000 + int(first["ttl"]))
    if expires is not None:
        expected.append(("expires", expires))
    assert list(spec.headers) == expected
    assert spec.persistent is (first.get("persistent") == "true")
    assert [d.stomp for d in spec.destinations] == ["/queue/q"]


CONTROL = st.lists(
    st.tuples(
        st.sampled_from(["destination", "receipt", "transaction", "content-length", "x"]),
        st.sampled_from(["", "/queue/q", "/topic/t", "/queue/a,/queue/b", "/queue/a.*", "7"]),
    ),
    max_size=5,
)


@settings(max_examples=300, deadline=None)
@given(headers=CONTROL)
def test_parse_send_control_gives_parse_send_and_the_first_receipt_and_transaction(
    headers: list[tuple[str, str]],
) -> None:
    """``parse_send_control`` reads the usual SEND (control headers only, none twice, a
    destination) itself: the same spec or error as ``parse_send``, with the first
    ``receipt`` and ``transaction`` (control headers, repeats, empty or missing
    destinations, composites, wildcards, a user header)."""
    frame = make_frame(Command.SEND, headers, b"b")
    kw = {"broker_id": "b", "connection_id": 7, "now_ms": 1000}
    first = dict(reversed(headers))
    try:
        expected = (parse_send(frame, **kw), first.get("receipt"), first.get("transaction"))
    except Exception as exc:
        with pytest.raises(type(exc)) as got:
            parse_send_control(frame, **kw)
        assert str(got.value) == str(exc)
        return
    assert parse_send_control(frame, **kw) == expected
