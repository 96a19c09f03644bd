"""broker.fastcodec.decode gives exactly what the generated codec gives, errors included."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker import fastcodec, tmqp
from broker.protocol import MessageType
from zproto.errors import DecodeError

_names = st.text(max_size=20)
_header_keys = st.text(min_size=1, max_size=8).filter(
    lambda k: not any(c in k for c in ":\r\n") and k.strip() == k and k != ""
)
_header_values = st.text(max_size=8).filter(
    lambda v: "\r" not in v and "\n" not in v and v.strip() == v
)
_frames = st.builds(
    tmqp.Frame,
    first_acquirer=st.booleans(),
    high_priority=st.booleans(),
    message_type=st.integers(0, 63),
    pending_response=st.booleans(),
    pending_ack=st.booleans(),
    ttl=st.integers(0, 31),
    content_type=st.integers(0, 0xFFFF),
    message_id=_names,
    source=_names,
    target=_names,
    headers=st.one_of(
        st.just(()), st.lists(st.tuples(_header_keys, _header_values), max_size=3).map(tuple)
    ),
    payload=st.one_of(
        st.binary(max_size=300), st.sampled_from([b"", b"x" * 252, b"y" * 253, b"z" * 70_000])
    ),
)


def _outcome(decoder: Any, data: bytes) -> tuple[str, Any]:
    try:
        msg = decoder(data)
    except DecodeError as exc:
        return "error", exc.signature_ok
    return type(msg).__name__, msg


def _codec(data: bytes) -> Any:
    return tmqp.decode((data,))


def _check(data: bytes) -> None:
    fast = _outcome(fastcodec.decode, data)
    assert fast == _outcome(_codec, data)
    if fast[0] == "Frame":  # same fields, same field order (repr, vars)
        assert vars(fast[1]) == vars(_codec(data))
        assert list(vars(fast[1])) == list(vars(_codec(data)))


@settings(max_examples=300, deadline=None)
@given(_frames)
def test_decodes_every_frame_like_the_codec(frame: tmqp.Frame) -> None:
    data = tmqp.encode(frame)[0]
    assert fastcodec.decode(data) == frame
    _check(data)


@settings(max_examples=300, deadline=None)
@given(_frames, st.data())
def test_damaged_frames_fail_or_decode_like_the_codec(frame: tmqp.Frame, data: Any) -> None:
    raw = bytearray(tmqp.encode(frame)[0])
    for _ in range(data.draw(st.integers(1, 3))):
        what = data.draw(st.sampled_from(["flip", "cut", "grow"]))
        if what == "flip" and raw:
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] = data.draw(st.integers(0, 255))
        elif what == "cut" and raw:
            del raw[data.draw(st.integers(0, len(raw) - 1)) :]
        else:
            raw += data.draw(st.binary(min_size=1, max_size=4))
    _check(bytes(raw))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_random_octets_fail_or_decode_like_the_codec(data: bytes) -> None:
    _check(data)


@pytest.mark.parametrize(
    "data",
    [
        tmqp.encode(tmqp.Ping())[0],
        tmqp.encode(tmqp.Pong())[0],
        tmqp.encode(tmqp.Handshake())[0],
        b"",
        b"\x11\x10",
        # an 8-octet frame that is no literal: everything empty
        tmqp.encode(tmqp.Frame(message_type=MessageType.QUEUE))[0],
    ],
)
def test_literals_and_short_input(data: bytes) -> None:
    _check(data)


def test_invalid_utf8_in_a_string_is_a_decode_error() -> None:
    good = tmqp.encode(tmqp.Frame(message_type=MessageType.QUEUE, message_id="ab", target="c"))[0]
    bad = good[:8] + b"\xff\xfe" + good[10:]
    with pytest.raises(DecodeError):
        fastcodec.decode(bad)
    _check(bad)


def test_common_flag_combinations_are_remembered_not_unbounded() -> None:
    for flags in range(256):
        for options in (0x10, 0x50, 0x90):
            data = bytes((flags, options, 0, 0, 1, 1, 0, 1)) + b"cp"
            _check(data)
    assert len(fastcodec._BASES) <= 1024


def test_plain_queue_frames_skip_the_generic_decoder(monkeypatch: pytest.MonkeyPatch) -> None:
    frame = tmqp.Frame(
        message_type=MessageType.QUEUE, content_type=7, message_id="m1", source="p", target="ch",
        payload=b"x" * 100,
    )  # fmt: skip
    data = tmqp.encode(frame)[0]

    def refuse(frames: Any) -> Any:
        raise AssertionError("generic decoder called")

    monkeypatch.setattr(fastcodec, "_codec_decode", refuse)
    assert fastcodec.decode(data) == frame
    with pytest.raises(AssertionError):  # and anything else goes to the codec
        fastcodec.decode(tmqp.encode(frame.replace(headers=(("k", "v"),)))[0])
