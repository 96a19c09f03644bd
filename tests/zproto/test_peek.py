"""Generated ``peek_<field>`` functions: a leading string of a binary frame, read even
when the frame as a whole does not decode (TMQP answers such a frame with its id)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker import tmqp
from tests.zproto.support import ALL_MODELS, codec, message_strategy
from zproto.errors import DecodeError
from zproto.peek import peekable

FRAME = tmqp.Frame(message_type=0x11, message_id="m-42", source="me", target="orders")

BINARY = []
for _model, _module in ALL_MODELS:
    _proto, _codec = codec(_model, _module)
    if _proto.dialect == "binary":
        for _msg in _proto.messages:
            for _fld in peekable(_msg):
                BINARY.append(
                    pytest.param(_msg, _fld.ident, _codec, id=f"{_proto.name}.{_fld.ident}")
                )


def test_binary_models_have_peek_functions() -> None:
    assert [p.id for p in BINARY if p.id.startswith("tmqp.")] == [
        "tmqp.message_id",
        "tmqp.source",
        "tmqp.target",
    ]
    assert {p.id for p in BINARY} >= {"binary_plain.title", "binary_shapes.name"}


@pytest.mark.parametrize(("msg", "ident", "module"), BINARY)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_peek_reads_what_decode_reads(msg, ident, module, data) -> None:  # type: ignore[no-untyped-def]
    value = data.draw(message_strategy(msg, getattr(module, msg.class_name)))
    (frame,) = module.encode(value)
    peek = getattr(module, f"peek_{ident}")
    assert peek(frame) == getattr(value, ident)
    assert peek(memoryview(frame)) == getattr(value, ident)
    assert peek(bytearray(frame)) == getattr(value, ident)


@pytest.mark.parametrize("payload", [b"", b"x" * 300, b"y" * 70000])
def test_peek_message_id_of_frames_that_fail_to_decode(payload: bytes) -> None:
    """Damage after the id (truncated payload, trailing octets, a target that is not
    UTF-8, a header block that does not parse): decode fails, the id is still read."""
    (wire,) = tmqp.encode(FRAME.replace(payload=payload))
    bad_target = wire.replace(b"orders", b"\xffrders")
    with_header = tmqp.encode(FRAME.replace(headers=(("k", "v"),), payload=payload))[0]
    bad_header = with_header.replace(b"k:v\r\n", b"kv\r\n\r")
    for damaged in (wire[:-1], wire + b"!", bad_target, bad_header):
        with pytest.raises(DecodeError):
            tmqp.decode([damaged])
        assert tmqp.peek_message_id(damaged) == "m-42"
    assert tmqp.peek_source(bad_target) == "me"
    assert tmqp.peek_target(bad_target) is None


def test_peek_gives_none_when_the_field_cannot_be_read() -> None:
    (wire,) = tmqp.encode(FRAME)
    start = wire.index(b"m-42")
    for short in (b"", b"\x11", wire[:7], wire[:start], wire[: start + 3]):
        assert tmqp.peek_message_id(short) is None
    assert tmqp.peek_message_id(wire[: start + 4]) == "m-42"
    not_utf8 = wire.replace(b"m-42", b"m-\xc3(")
    assert tmqp.peek_message_id(not_utf8) is None
    assert tmqp.peek_message_id(12345) is None  # not bytes-like
    # a varlen payload length in its 3-octet form moves the id; cut inside that form
    (long_wire,) = tmqp.encode(FRAME.replace(payload=b"z" * 300))
    assert long_wire[7] == 253 and tmqp.peek_message_id(long_wire[:9]) is None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_peek_never_raises_and_agrees_with_decode(data: bytes) -> None:
    try:
        decoded = tmqp.decode([data])
    except DecodeError:
        decoded = None
    for name in ("message_id", "source", "target"):
        peeked = getattr(tmqp, f"peek_{name}")(data)
        assert peeked is None or isinstance(peeked, str)
        if isinstance(decoded, tmqp.Frame):
            assert peeked == getattr(decoded, name)
