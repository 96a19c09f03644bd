"""Decoders never raise anything but DecodeError, on random and mutated input."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker import tmqp
from filemq import fmq_msg, fmq_msg_czmq
from tests.zproto.support import (
    ALL_MODELS,
    CPU_BOUND,
    PROJECT_MODELS,
    codec,
    message_strategy,
)
from zproto.errors import DecodeError

pytestmark = CPU_BOUND

CODECS = [codec(model, module) for model, module in ALL_MODELS]
IDS = [proto.name for proto, _ in CODECS]
#: The mutation runs: the project's codecs in the default run, the test-only models' (the
#: generator's other shapes, 8-19 s each on a loaded machine) in the slow leg.
MUTATED = [
    pytest.param(proto, module, id=proto.name,
                 marks=() if model in PROJECT_MODELS else pytest.mark.slow)
    for (proto, module), model in zip(CODECS, ALL_MODELS, strict=True)
]  # fmt: skip


def _decode_or_error(module, frames) -> None:  # type: ignore[no-untyped-def]
    try:
        module.decode(frames)
    except DecodeError as exc:
        assert isinstance(exc.reason, str) and exc.reason
    # any other exception propagates and fails the test


@pytest.mark.parametrize(("proto", "module"), CODECS, ids=IDS)
@settings(max_examples=300, deadline=None)
@given(frames=st.lists(st.binary(max_size=64), min_size=1, max_size=3))
def test_random_bytes(proto, module, frames) -> None:  # type: ignore[no-untyped-def]
    _decode_or_error(module, frames)


@pytest.mark.parametrize(("proto", "module"), MUTATED)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_valid_messages(proto, module, data) -> None:  # type: ignore[no-untyped-def]
    """Flip, cut, extend and splice the encoding of a valid message."""
    msg = data.draw(st.sampled_from(proto.messages))
    original = data.draw(message_strategy(msg, getattr(module, msg.class_name)))
    frames = list(module.encode(original))
    first = bytearray(frames[0])
    action = data.draw(st.sampled_from(["flip", "truncate", "extend", "set", "insert"]))
    if action == "flip" and first:
        pos = data.draw(st.integers(0, len(first) - 1))
        first[pos] ^= data.draw(st.integers(1, 255))
    elif action == "truncate":
        first = first[: data.draw(st.integers(0, len(first)))]
    elif action == "extend":
        first += data.draw(st.binary(min_size=1, max_size=8))
    elif action == "set" and first:
        pos = data.draw(st.integers(0, len(first) - 1))
        width = min(4, len(first) - pos)
        first[pos : pos + width] = b"\xff" * width
    elif action == "insert":
        pos = data.draw(st.integers(0, len(first)))
        first[pos:pos] = data.draw(st.binary(min_size=1, max_size=4))
    frames[0] = bytes(first)
    if data.draw(st.booleans()):
        frames.append(data.draw(st.binary(max_size=8)))
    _decode_or_error(module, frames)


def test_signature_is_reported() -> None:
    with pytest.raises(DecodeError) as info:
        fmq_msg.decode([b"\xaa\xa2\x01"])
    assert not info.value.signature_ok
    with pytest.raises(DecodeError) as info:
        fmq_msg.decode([b"\xaa\xa3\x02"])  # id 2 does not exist in FILEMQ v2
    assert info.value.signature_ok and info.value.message_id == 2
    with pytest.raises(DecodeError) as info:
        fmq_msg.decode([])
    assert not info.value.signature_ok


@pytest.mark.parametrize(
    ("frame", "what"),
    [
        (b"\xaa\xa3\x01\x06FILEMQ\x00", "truncated number"),
        (b"\xaa\xa3\x01\x07FILEMQ\x00\x02", "string length past the end"),
        (b"\xaa\xa3\x01\x06FILEMQ\x00\x01", "wrong constant version"),
        (b"\xaa\xa3\x01\x06FILEMZ\x00\x02", "wrong constant protocol"),
        (b"\xaa\xa3\x01\x06FILEMQ\x00\x02\x00", "trailing garbage"),
        (b"\xaa\xa3\x04\x00", "trailing garbage after an empty message"),
        (b"\xaa\xa3\x80\x02\xff\xfe", "bad UTF-8"),
        (b"\xaa\xa3\x05\x01/" + b"\xff\xff\xff\xff", "hash count beyond the buffer"),
        (
            b"\xaa\xa3\x05\x01/" + struct.pack(">I", 1) + b"\x01k\x00\x00\x10\x00v",
            "longstr past end",
        ),
        (
            b"\xaa\xa3\x08"
            + b"\x00" * 9
            + b"\x01a"
            + b"\x00" * 9
            + b"\x00" * 4
            + b"\x00\x00\x00\x09ab",
            "chunk past the end",
        ),
    ],
)
def test_malformed_filemq(frame: bytes, what: str) -> None:
    with pytest.raises(DecodeError) as info:
        fmq_msg.decode([frame])
    assert info.value.signature_ok, what


def test_czmq_variant_differs_only_in_path_and_filename() -> None:
    icanhaz = fmq_msg.Icanhaz(path="/a", options={}, cache={})
    compat = fmq_msg_czmq.Icanhaz(path="/a", options={}, cache={})
    assert fmq_msg.encode(icanhaz)[0][3:5] == b"\x02/"
    assert fmq_msg_czmq.encode(compat)[0][3:9] == b"\x00\x00\x00\x02/a"
    assert fmq_msg.encode(fmq_msg.Nom(1, 2)) == fmq_msg_czmq.encode(fmq_msg_czmq.Nom(1, 2))
    with pytest.raises(DecodeError):
        fmq_msg.decode(fmq_msg_czmq.encode(compat))


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\x11",
        b"\x11\x10\x05\x00\x00\x00\x00\x00ab",  # id length 5, only 2 octets
        b"\x11\x10\x00\x00\x00\x00\x00\x05ab",  # payload length 5, only 2 octets
        b"\x11\x10\x00\x00\x00\x00\x00\xfd\x01",  # u16 payload length cut short
        b"\x11\x30\x00\x00\x00\x00\x00\x00",  # has-header without header length
        b"\x11\x30\x00\x00\x00\x00\x00\x00\x05\x00a:b",  # header block past the end
        b"\x11\x30\x00\x00\x00\x00\x00\x00\x04\x00ab\r\n",  # header line without ':'
        b"\x11\x10\x02\x00\x00\x00\x00\x00\xff\xfe",  # bad UTF-8 id
        b"\x11\x10\x00\x00\x00\x00\x00\x00xx",  # trailing octets
        b"\x11\x10\x00\x00\x00\x00\x00\xff" + b"\xff" * 8,  # 2**64-1 payload length
    ],
)
def test_malformed_tmqp(frame: bytes) -> None:
    with pytest.raises(DecodeError):
        tmqp.decode([frame])
