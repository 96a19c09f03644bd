"""``entries = "N"`` on a binary model: ``decode_entries(payload, limit)`` decodes a run
of length-prefixed whole frames, each where it lies when in its simplest shape, and
gives exactly what ``decode((entry,))`` of each entry gives (TMQP: delivery batches,
``broker.batch``).  Checked against entries built by hand (octets from the spec, not
from our encoder), against the general codec generated with ``fast=False`` and against
damaged runs."""

from __future__ import annotations

import struct
import types
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker import tmqp
from tests.zproto.support import fields_of, general_codec, tmqp_frames
from zproto.errors import DecodeError
from zproto.model import ModelError, load

GENERAL = general_codec(Path(tmqp.__file__).with_suffix(".xml"))


def _run(*frames: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(f)) + f for f in frames)


def _outcome(module: types.ModuleType, payload: bytes, limit: int = 1024) -> Any:
    try:
        got = module.decode_entries(payload, limit)
    except DecodeError as exc:
        return "error", exc.reason
    return [(type(m).__name__, list(fields_of(m).items())) for m in got]


def _each(module: types.ModuleType, frames: list[bytes]) -> Any:
    return [
        (type(m).__name__, list(fields_of(m).items()))
        for m in (module.decode([f]) for f in frames)
    ]


def test_hand_built_entries_decode_to_their_fields() -> None:
    # a QUEUE frame (type 0x02), pending ack (options 0x40 | ttl 16), id "a1", source
    # "s", target "ch", content type 7, payload "hi"; then a PING (8 fixed octets)
    queue = bytes([0x02, 0x40 | 16, 2, 1, 2, 7, 0, 2]) + b"a1" + b"s" + b"ch" + b"hi"
    ping = bytes.fromhex("89FF000000000000")
    first, second = tmqp.decode_entries(_run(queue, ping), 10)
    assert isinstance(first, tmqp.Frame) and isinstance(second, tmqp.Ping)
    assert (first.message_type, first.pending_ack, first.ttl, first.content_type) == (
        2,
        True,
        16,
        7,
    )
    assert (first.message_id, first.source, first.target, first.payload) == (
        "a1",
        "s",
        "ch",
        b"hi",
    )
    assert tmqp.decode_entries(b"", 10) == []


def _wide(payload: bytes, length: bytes, flags: int = 0x40 | 16, tail: bytes = b"") -> bytes:
    """A QUEUE frame by hand (id "a1", source "s", target "ch", content type 7) whose
    payload length is ``length`` (a variable-length number as octets)."""
    return bytes([0x02, flags, 2, 1, 2, 7, 0]) + length + b"a1" + b"s" + b"ch" + tail + payload


#: QUEUE frames by hand with their payload length in its three-octet form (253, then two
#: octets little-endian: the 4 KiB pushes), and near misses, each with what it must be.
WIDE_ENTRIES = [
    _wide(b"\x5a" * 4096, b"\xfd\x00\x10"),  # 4,096 octets
    _wide(b"\x00" * 65535, b"\xfd\xff\xff"),  # the most the form holds
    _wide(b"hi", b"\xfd\x02\x00"),  # a short length in the long form: decode takes it
    _wide(b"\x01" * 300, b"\xfe\x2c\x01\x00\x00"),  # the five-octet form (decode's)
    _wide(b"x" * 300, b"\xfd\x2c\x01", 0x60 | 16, b"\x05\x00k:v\r\n"),  # with headers
]


def test_entries_with_three_octet_payload_lengths_decode_as_each_entry_alone() -> None:
    (only,) = tmqp.decode_entries(_run(WIDE_ENTRIES[0]), 10)
    assert isinstance(only, tmqp.Frame) and only.payload == b"\x5a" * 4096
    assert (only.message_id, only.source, only.target, only.pending_ack) == ("a1", "s", "ch", True)
    payload = _run(*WIDE_ENTRIES)
    assert _outcome(tmqp, payload) == _each(tmqp, WIDE_ENTRIES)
    assert _outcome(tmqp, payload) == _outcome(GENERAL, payload)
    # one octet short, one too many, a bad UTF-8 id: the general codec's verdict
    for bad in (
        WIDE_ENTRIES[0][:-1],
        WIDE_ENTRIES[0] + b"!",
        WIDE_ENTRIES[0].replace(b"a1", b"\xff1"),
    ):
        assert _outcome(tmqp, _run(bad)) == _outcome(GENERAL, _run(bad))


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\x01\x00", "entry 0: length cut short at octet 0"),
        (_run(b"\x89\xff" + bytes(6)) + b"\x05\x00\x00\x00ab", "entry 1: 5 octets, 2 left"),
        (_run(*[bytes.fromhex("89FF000000000000")] * 3), "more than 2 entries"),
        (_run(bytes.fromhex("89FF000000000000"), b"\x02\x00"), "entry 1: "),
    ],
)
def test_a_damaged_run_is_a_decode_error_naming_the_entry(payload: bytes, reason: str) -> None:
    for module in (tmqp, GENERAL):
        with pytest.raises(DecodeError) as err:
            module.decode_entries(payload, 2)
        assert err.value.reason.startswith(reason)


def test_only_bytes_are_entries() -> None:
    with pytest.raises(DecodeError):
        tmqp.decode_entries(bytearray(b"\x00\x00\x00\x00"), 2)  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames=st.lists(tmqp_frames(), max_size=6), data=st.data())
def test_entries_decode_as_each_entry_alone_and_as_the_general_codec(
    frames: list[bytes], data: st.DataObject
) -> None:
    payload = _run(*frames)
    assert _outcome(tmqp, payload) == _each(tmqp, frames)
    spans: list[int] = []
    tmqp.decode_entries(payload, 1024, spans)
    assert [payload[a:b] for a, b in zip(spans[::2], spans[1::2], strict=True)] == frames
    assert _outcome(GENERAL, payload) == _outcome(tmqp, payload)
    # damaged: the fast and the general codec still agree, errors included
    raw = bytearray(payload)
    if raw:
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw[pos] = data.draw(st.integers(0, 255))
        cut = data.draw(st.integers(0, len(raw)))
        damaged = bytes(raw[:cut])
        assert _outcome(GENERAL, damaged, 4) == _outcome(tmqp, damaged, 4)


@pytest.mark.parametrize("attrs", ['dialect="binary" entries="3"', 'entries="4"'])
def test_entries_is_2_or_4_on_a_binary_model(tmp_path: Path, attrs: str) -> None:
    path = tmp_path / "t.xml"
    path.write_text(f'<class name="t" {attrs}><message name="m">'
                    '<field name="a" type="number" size="1"/></message></class>')  # fmt: skip
    with pytest.raises(ModelError, match="entries"):
        load(path)


def test_each_entry_that_leaves_the_inline_path_is_decoded_on_its_own() -> None:
    """``decode_entries`` decodes the simplest shape inline, in a loop run once per entry:
    an entry that breaks out of it at any check (bad UTF-8 in each string, a header
    block, a three-octet length, a payload length one octet off) right after one decoded
    inline must be its own verdict, never the entry before's frame."""
    good = tmqp.encode(
        tmqp.Frame(message_type=1, content_type=7, message_id="id", source="src", target="q")
    )[0]
    headed = tmqp.encode(tmqp.Frame(message_type=1, message_id="h", headers=(("k", "v"),)))[0]
    leaving = [
        good.replace(b"id", b"\xffd"),
        good.replace(b"src", b"s\xffc"),
        good.replace(b"idsrcq", b"idsrc\xff"),
        headed,
        WIDE_ENTRIES[0],
    ]
    for other in leaving:
        for frames in ([good, other], [good, other, good]):
            payload = _run(*frames)
            assert _outcome(tmqp, payload) == _outcome(GENERAL, payload)
            if _outcome(tmqp, payload)[0] != "error":
                assert _outcome(tmqp, payload) == _each(tmqp, frames)
    short = good[:-1] + b""  # the head's payload length one octet more than the entry holds
    payload = _run(good, short)
    assert _outcome(tmqp, payload) == _outcome(GENERAL, payload)
    assert _outcome(tmqp, payload)[0] == "error"


def test_decode_of_a_frame_with_a_three_octet_length_is_the_general_codecs() -> None:
    """``decode`` reads a frame whose payload length takes the three-octet form (a 4 KiB
    delivery, a batch of deliveries) where it lies before asking the general decoder:
    every such frame, whole or damaged, decodes as the general codec decodes it."""

    def verdict(module: types.ModuleType, frame: bytes) -> Any:
        try:
            m = module.decode([frame])
        except DecodeError as exc:
            return "error", exc.reason
        return type(m).__name__, list(fields_of(m).items())

    frames = list(WIDE_ENTRIES)
    frames.append(
        tmqp.encode(
            tmqp.Frame(message_type=0x10, content_type=261, payload=_run(*WIDE_ENTRIES[2:3]) * 40)
        )[0]
    )
    for whole in list(frames):
        frames += [whole[:-1], whole + b"!", whole[:9], whole.replace(b"a1", b"\xff1", 1)]
    for frame in frames:
        assert verdict(tmqp, frame) == verdict(GENERAL, frame)
    assert verdict(tmqp, frames[0])[0] == "Frame"
