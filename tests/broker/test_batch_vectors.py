"""The octets of a delivery batch (``broker.batch.deliveries_frame``) and of a batch
payload (``broker.batch.pack``), built by hand from the layout in ``broker.batch`` and
``broker/tmqp.md``: an oracle that does not share the encoder's code (both changed in
session 15 for speed: the payload by a loop, the frame by an encoder made once)."""

from __future__ import annotations

import pytest

from broker import batch, tmqp


def _by_hand_payload(entries: list[bytes]) -> bytes:
    out = b""
    for entry in entries:
        out += len(entry).to_bytes(4, "little") + entry
    return out


def _by_hand_deliveries(payload: bytes) -> bytes:
    """Flags: type SERVER (16), no priority/acquirer bits; options: TTL 16 only; no id,
    source or target; content type 261 (little-endian); the payload length as TMQP's
    varlen (one octet below 253, else 253 and two octets); no header block."""
    size = len(payload)
    length = bytes([size]) if size < 253 else b"\xfd" + size.to_bytes(2, "little")
    return bytes([16, 16, 0, 0, 0]) + (261).to_bytes(2, "little") + length + payload


@pytest.mark.parametrize("count", [0, 1, 2, 13, 300])
def test_pack_lays_out_each_entry_after_its_length(count: int) -> None:
    entries = [bytes([i % 251]) * (i % 7) for i in range(count)]
    assert batch.pack(entries) == _by_hand_payload(entries)
    # any iterable, once through (a generator)
    assert batch.pack(e for e in entries) == _by_hand_payload(entries)


@pytest.mark.parametrize("sizes", [[1], [3, 0, 5], [120] * 13, [2000, 40]])
def test_deliveries_frame_octets(sizes: list[int]) -> None:
    entries = [
        tmqp.encode_frame(message_type=1, content_type=7, target="q", payload=b"p" * n)[0]
        for n in sizes
    ]
    octets = batch.deliveries_frame(entries)
    assert octets == _by_hand_deliveries(_by_hand_payload(entries))
    # and it reads back as the client reads it
    frame = tmqp.decode((octets,))
    assert isinstance(frame, tmqp.Frame)
    assert frame.content_type == batch.DELIVERIES
    assert batch.unpack(frame.payload, 1024) == entries
