"""``encode_<message>_head``: the frame before a trailing chunk's content.

A sender reads a file chunk straight into a buffer behind this head (``filemq.server``),
so head + content must be, octet for octet, the frame ``encode`` makes: checked for
every message of every model that gets one (generated values, both FILEMQ dialects),
against vectors built by hand from the spec, and for the errors (a size the 4-octet
length cannot hold, a bad field named as ``encode`` names it).  Messages whose chunk is
not the frame's end (more fields or frames after it) get no head encoder.
"""

from __future__ import annotations

import struct
import types
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from filemq import fmq_msg, fmq_msg_czmq
from tests.zproto.support import ALL_MODELS, codec, fields_of, message_strategy
from zproto.encoder import head_chunk
from zproto.errors import EncodeError
from zproto.model import Message, Protocol

CODECS: list[tuple[Protocol, types.ModuleType]] = [codec(m, n) for m, n in ALL_MODELS]
WITH_HEAD = [
    pytest.param(module, msg, id=f"{proto.name}.{msg.class_name}")
    for proto, module in CODECS
    for msg in proto.messages
    if head_chunk(msg) is not None
]


def test_the_models_with_a_trailing_chunk_get_one_and_the_others_none() -> None:
    got = {
        (proto.name, msg.class_name)
        for proto, module in CODECS
        for msg in proto.messages
        if hasattr(module, f"encode_{msg.ident}_head")
    }
    assert got == {
        ("fmq_msg", "Cheezburger"),
        ("fmq_msg_czmq", "Cheezburger"),
        ("c_tools_example", "Defaults"),  # (its BINARY has fields and frames after the chunk)
    }
    assert "encode_cheezburger_head" in fmq_msg.__all__


@pytest.mark.parametrize(("module", "msg"), WITH_HEAD)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_head_and_chunk_are_the_encoded_frame(
    module: types.ModuleType, msg: Message, data: st.DataObject
) -> None:
    cls = getattr(module, msg.class_name)
    value = data.draw(message_strategy(msg, cls))
    fields = fields_of(value)
    chunk_field = head_chunk(msg)
    assert chunk_field is not None
    chunk = fields.pop(chunk_field.ident)
    head = getattr(module, f"encode_{msg.ident}_head")(len(chunk), **fields)
    assert isinstance(head, bytes)
    assert [head + chunk] == module.encode(value)


def _hand_built(
    filename: bytes, name_length: str, headers: dict[bytes, bytes], size: int
) -> bytes:
    """CHEEZBURGER up to its chunk's content, from spec 35 (and czmq's longstr names)."""
    out = b"\xaa\xa3\x08" + struct.pack(">QB", 7, 1)  # signature, id, sequence, operation
    out += struct.pack(name_length, len(filename)) + filename
    out += struct.pack(">QB", 1 << 33, 0)  # offset, eof
    out += struct.pack(">I", len(headers))
    for key, value in headers.items():
        out += struct.pack(">B", len(key)) + key + struct.pack(">I", len(value)) + value
    return out + struct.pack(">I", size)


@pytest.mark.parametrize(("module", "name_length"), [(fmq_msg, ">B"), (fmq_msg_czmq, ">I")])
def test_cheezburger_head_matches_octets_built_by_hand(module: Any, name_length: str) -> None:
    size = 1 << 20
    head = module.encode_cheezburger_head(
        size, 7, 1, "dir/é.bin", 1 << 33, 0, {"sha1": "ab" * 20, "k": ""}
    )
    expected = _hand_built(
        "dir/é.bin".encode(), name_length, {b"sha1": b"ab" * 20, b"k": b""}, size
    )
    assert head == expected
    assert module.encode_cheezburger_head(0) == module.encode(module.Cheezburger())[0]


@pytest.mark.parametrize("module", [fmq_msg, fmq_msg_czmq])
@pytest.mark.parametrize("size", [-1, 1 << 32, 1 << 70])
def test_a_size_the_length_cannot_hold_is_refused(module: Any, size: int) -> None:
    with pytest.raises(EncodeError, match=r"Cheezburger\.chunk: size .* out of range"):
        module.encode_cheezburger_head(size, filename="a")


@pytest.mark.parametrize("module", [fmq_msg, fmq_msg_czmq])
@pytest.mark.parametrize(
    "bad",
    [{"operation": 256}, {"sequence": -1}, {"filename": "x" * 300}, {"headers": {"k": 1}}],
)
def test_a_bad_field_is_named_as_encode_names_it(module: Any, bad: dict[str, Any]) -> None:
    if module is fmq_msg_czmq and "filename" in bad:
        bad = {"filename": "\ud800"}  # (a longstr holds 300 octets: not UTF-8 instead)
    with pytest.raises(EncodeError) as by_encode:
        module.encode(module.Cheezburger(**bad))
    with pytest.raises(EncodeError) as by_head:
        module.encode_cheezburger_head(0, **bad)
    assert str(by_head.value) == str(by_encode.value)
