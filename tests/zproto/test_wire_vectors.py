"""Encodings checked against bytes assembled by hand from the specifications,
independently of the generator."""

from __future__ import annotations

import struct

import pytest

from broker import tmqp
from filemq import fmq_msg


def test_filemq_ohai_bytes() -> None:
    assert fmq_msg.encode(fmq_msg.Ohai()) == [b"\xaa\xa3\x01\x06FILEMQ\x00\x02"]


def test_filemq_cheezburger_bytes() -> None:
    msg = fmq_msg.Cheezburger(
        sequence=7,
        operation=1,
        filename="a/b",
        offset=65536,
        eof=1,
        headers={"SHA1": "ab"},
        chunk=b"xyz",
    )
    expected = (
        b"\xaa\xa3\x08"
        + struct.pack(">QB", 7, 1)
        + b"\x03a/b"
        + struct.pack(">QB", 65536, 1)
        + struct.pack(">I", 1)
        + b"\x04SHA1"
        + struct.pack(">I", 2)
        + b"ab"
        + struct.pack(">I", 3)
        + b"xyz"
    )
    assert fmq_msg.encode(msg) == [expected]
    assert fmq_msg.decode([expected]) == msg


def test_filemq_nom_and_empty_messages() -> None:
    assert fmq_msg.encode(fmq_msg.Nom(credit=1 << 40, sequence=3)) == [
        b"\xaa\xa3\x07" + struct.pack(">QQ", 1 << 40, 3)
    ]
    for cls, ident in [(fmq_msg.OhaiOk, 4), (fmq_msg.HugzOk, 10), (fmq_msg.Kthxbai, 11)]:
        assert fmq_msg.encode(cls()) == [bytes((0xAA, 0xA3, ident))]
        assert fmq_msg.MessageId(ident) == cls.ID


def test_tmqp_literals() -> None:
    assert tmqp.encode(tmqp.Ping()) == [bytes.fromhex("89FF000000000000")]
    assert tmqp.encode(tmqp.Pong()) == [bytes.fromhex("8AFF000000000000")]
    assert tmqp.encode(tmqp.Handshake()) == [b"TMQP/2.0"]
    assert tmqp.decode([b"TMQP/2.0"]) == tmqp.Handshake()
    assert tmqp.decode([bytes.fromhex("89FF000000000000")]) == tmqp.Ping()
    assert tmqp.decode([bytes.fromhex("8AFF000000000000")]) == tmqp.Pong()


def test_tmqp_frame_layout() -> None:
    frame = tmqp.Frame(
        first_acquirer=True,
        high_priority=False,
        message_type=0x11,
        pending_response=False,
        pending_ack=True,
        ttl=16,
        content_type=0x0102,
        message_id="m1",
        source="me",
        target="ch",
        headers=(("Queue-Id", "258"), ("CC", "other")),
        payload=b"hello",
    )
    block = b"Queue-Id:258\r\nCC:other\r\n"
    expected = (
        bytes((0x80 | 0x11, 0x40 | 0x20 | 16, 2, 2, 2))
        + struct.pack("<H", 0x0102)
        + bytes((5,))
        + b"m1mech"
        + struct.pack("<H", len(block))
        + block
        + b"hello"
    )
    assert tmqp.encode(frame) == [expected]
    assert tmqp.decode([expected]) == frame


def test_tmqp_no_header_flag_when_no_headers() -> None:
    raw = tmqp.encode(tmqp.Frame(message_type=0x12, ttl=31))[0]
    assert raw == bytes((0x12, 31, 0, 0, 0, 0, 0, 0))


@pytest.mark.parametrize(
    ("size", "prefix"),
    [
        (0, b"\x00"),
        (252, b"\xfc"),
        (253, b"\xfd" + struct.pack("<H", 253)),
        (65535, b"\xfd" + struct.pack("<H", 65535)),
        (65536, b"\xfe" + struct.pack("<I", 65536)),
    ],
)
def test_tmqp_payload_length_picks_smallest_form(size: int, prefix: bytes) -> None:
    raw = tmqp.encode(tmqp.Frame(payload=b"p" * size))[0]
    assert raw[7 : 7 + len(prefix)] == prefix
    assert len(raw) == 7 + len(prefix) + size
    assert tmqp.decode([raw]).payload == b"p" * size


@pytest.mark.parametrize("size", [0, 252, 253, 4096, 65535, 65536])
def test_tmqp_every_encoder_writes_the_same_octets_at_each_length_form(size: int) -> None:
    """The class, keyword and sender encoders (a producer's pushes) give the octets built
    here by hand, at each edge of the payload length's forms (one octet below 253, then
    253 + u16 up to 65,535: a 4 KiB push's, then 254 + u32)."""
    payload = bytes(range(256)) * (size // 256) + b"q" * (size % 256)
    if size < 253:
        length = bytes((size,))
    elif size <= 0xFFFF:
        length = b"\xfd" + struct.pack("<H", size)
    else:
        length = b"\xfe" + struct.pack("<I", size)
    expected = (
        bytes((0x11, 0x40 | 16, 3, 2, 4))
        + struct.pack("<H", 7)
        + length
        + b"m-1"
        + b"me"
        + b"chan"
        + payload
    )
    fields = {"message_type": 0x11, "pending_ack": True, "source": "me"}
    frame = tmqp.Frame(content_type=7, message_id="m-1", target="chan", payload=payload, **fields)
    sender = tmqp.encode_frame_sender(**fields)
    assert tmqp.encode(frame) == [expected]
    assert tmqp.encode_frame(
        content_type=7, message_id="m-1", target="chan", payload=payload, **fields
    ) == [expected]
    assert sender(7, "m-1", "chan", payload) == [expected]
    assert tmqp.decode([expected]) == frame


def test_tmqp_reader_accepts_non_minimal_lengths_and_header_whitespace() -> None:
    block = b"Key : value \r\nOther:x\r\n"
    raw = (
        bytes((0x11, 0x20 | 16, 0, 0, 0))
        + b"\x00\x00"
        + b"\xfe"
        + struct.pack("<I", 3)  # a u32 length where one octet would do
        + struct.pack("<H", len(block))
        + block
        + b"abc"
    )
    frame = tmqp.decode([raw])
    assert frame.headers == (("Key", "value"), ("Other", "x"))
    assert frame.payload == b"abc"
