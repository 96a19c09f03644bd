"""``<record>`` on a binary model: ``decode_<record>_records(datas, cls, wire_key)`` makes
the caller's tuple type straight from whole frames (TMQP's record ``message``: the broker's
``broker.message.Message``), refusing by index exactly the frames ``decode`` refuses or
does not make the general message.  Checked against frames built by hand from the spec,
against ``decode`` of each frame alone (garbage, truncated, damaged, valid frames of every
shape) and against the general codec generated with ``fast=False``."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker import tmqp
from broker.engine.tmqp_door import WIRE, message_of
from broker.message import Message
from tests.zproto.support import CPU_BOUND, general_codec, string_model, tmqp_frames
from tests.zproto.test_entries import WIDE_ENTRIES
from zproto.errors import DecodeError
from zproto.model import ModelError, load

GENERAL = general_codec(Path(tmqp.__file__).with_suffix(".xml"))
PING = bytes.fromhex("89FF000000000000")
KEY = object()
pytestmark = CPU_BOUND

#: The record's fields, as the model names them (tmqp.xml's <record name="message">).
FIELDS = ("message_id", "source", "target", "content_type", "high_priority",
          "first_acquirer", "pending_ack", "ttl", "headers", "payload")  # fmt: skip


class Kept(NamedTuple):
    """A caller's tuple type (any tuple subclass): ten fields and the wire form."""

    a: Any
    b: Any
    c: Any
    d: Any
    e: Any
    f: Any
    g: Any
    h: Any
    i: Any
    j: Any
    wire: Any


def _queue(mid: bytes, source: bytes, target: bytes, payload: bytes, ct: int = 7) -> bytes:
    """A QUEUE frame by hand: type 0x11 with first acquirer (0x80), pending ack (0x40) |
    ttl 9, the three string lengths, content type (LE), the one-octet payload length,
    the strings, the payload."""
    head = bytes([0x80 | 0x11, 0x40 | 9, len(mid), len(source), len(target), ct & 255, ct >> 8])
    return head + bytes([len(payload)]) + mid + source + target + payload


Outcome = tuple[list[tuple[Any, ...]], list[int]]


def _alone(module: types.ModuleType, datas: list[Any]) -> Outcome:
    """What ``decode`` of each frame alone gives: the Frames' fields and the frame as
    given, the indexes of the others."""
    made: list[tuple[Any, ...]] = []
    bad: list[int] = []
    for i, data in enumerate(datas):
        try:
            msg = module.decode((data,))
        except DecodeError:
            msg = None
        if type(msg) is module.Frame:
            made.append((*(getattr(msg, f) for f in FIELDS), (KEY, data)))
        else:
            bad.append(i)
    return made, bad


def _records(module: types.ModuleType, datas: list[Any]) -> Outcome:
    made, bad = module.decode_message_records(datas, Kept, KEY)
    assert all(type(r) is Kept for r in made)
    return [tuple(r) for r in made], bad


def test_hand_built_frames_give_their_fields_in_the_records_order() -> None:
    one = _queue(b"m-1", b"prod", b"orders", b"body", ct=0x0102)
    two = _queue("é".encode(), b"", b"x", b"")
    made, bad = tmqp.decode_message_records([one, two], Kept, KEY)
    assert bad == []
    assert made[0] == Kept("m-1", "prod", "orders", 0x0102, False, True, True, 9, (), b"body",
                           (KEY, one))  # fmt: skip
    assert made[1] == Kept("é", "", "x", 7, False, True, True, 9, (), b"", (KEY, two))
    assert made[0].wire[0] is KEY and made[0].wire[1] is one  # (the octets as given)


def test_the_tmqp_record_is_the_brokers_message() -> None:
    """``broker.message.Message`` made by the record is what ``message_of`` makes of the
    decoded frame (a push that waits for no response keeps its octets as wire form)."""
    datas = [
        tmqp.encode_frame(message_type=0x11, message_id="a", source="s", target="t",
                          content_type=3, high_priority=True, ttl=5, payload=b"x")[0],
        tmqp.encode_frame(message_type=0x11, message_id="b", target="t", pending_ack=True,
                          headers=(("K", "v"),), payload=b"y" * 300)[0],
    ]  # fmt: skip
    made, bad = tmqp.decode_message_records(datas, Message, WIRE)
    assert bad == []
    assert made == [message_of(tmqp.decode((d,)), d) for d in datas]  # type: ignore[arg-type]
    assert all(type(m) is Message for m in made)


def _damaged() -> list[tuple[str, list[Any]]]:
    good = _queue(b"id", b"src", b"ch", b"payload")
    return [
        ("garbage", [good, b"\x11\x00\xff\xff\xff", good]),
        ("payload length past its end", [good, good[:-1], good]),
        ("trailing octets", [good, good + b"!", good]),
        ("id not UTF-8", [good, _queue(b"\xff\xfe", b"src", b"ch", b"p"), good]),
        ("a character split between two strings", [_queue(b"a\xc3", b"\xa9b", b"ch", b"p")]),
        (
            "a header block that does not parse",
            [bytes([0x11, 0x20 | 16, 0, 0, 0, 1, 0, 1, 3, 0]) + b"k\r\nx", good],
        ),
        ("a literal (PING) among them", [good, PING, good]),
        ("too short for a frame", [good, b"\x11\x10", b"", good]),
        ("not bytes", [good, None, 7, "text", good]),
    ]


@pytest.mark.parametrize(("name", "datas"), _damaged(), ids=[n for n, _ in _damaged()])
def test_a_frame_decode_refuses_is_refused_by_index(name: str, datas: list[Any]) -> None:
    assert tmqp.decode_message_records(datas, Kept, KEY)[1], name
    assert _records(tmqp, datas) == _alone(tmqp, datas)
    assert _records(GENERAL, datas) == _alone(tmqp, datas)


def test_frames_in_other_shapes_and_bytes_likes_go_through_decode() -> None:
    """Long lengths (varlen 253: a u16 follows) and a memoryview: ``decode``'s general
    path, the same record."""
    big = tmqp.encode_frame(message_type=0x11, message_id="m", target="t", payload=b"z" * 400)[0]
    assert big[7] == 253
    datas: list[Any] = [big, memoryview(big), bytearray(big)]
    made, bad = _records(tmqp, datas)
    assert (made, bad) == _alone(tmqp, datas) and bad == [] and len(made) == 3


def test_frames_with_three_octet_payload_lengths_are_what_decode_gives() -> None:
    """4 KiB pushes (the payload's length as 253 then a u16) and their near misses: the
    same records as ``decode`` of each, and as the general codec's."""
    big = WIDE_ENTRIES[0]
    datas = [
        *WIDE_ENTRIES,
        big[:-1],
        big + b"!",
        big.replace(b"a1", b"\xff1"),
        _queue(b"i", b"", b"c", b"p"),
    ]
    made, bad = _records(tmqp, datas)
    assert (made, bad) == _alone(tmqp, datas) == _records(GENERAL, datas)
    assert made[0][9] == b"\x5a" * 4096 and bad == [5, 6, 7]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames=st.lists(tmqp_frames(), max_size=6), data=st.data())
def test_records_are_what_decode_gives_frame_by_frame(
    frames: list[bytes], data: st.DataObject
) -> None:
    assert _records(tmqp, frames) == _alone(tmqp, frames)
    assert _records(GENERAL, frames) == _alone(tmqp, frames)
    # each frame damaged: an octet changed, cut short, or random octets
    damaged: list[Any] = []
    for frame in frames:
        raw = bytearray(frame)
        how = data.draw(st.sampled_from(["octet", "cut", "random", "as is"]))
        if how == "octet" and raw:
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
        elif how == "cut":
            raw = raw[: data.draw(st.integers(0, len(raw)))]
        elif how == "random":
            raw = bytearray(data.draw(st.binary(max_size=40)))
        damaged.append(bytes(raw))
    assert _records(tmqp, damaged) == _alone(tmqp, damaged)
    assert _records(GENERAL, damaged) == _alone(tmqp, damaged)


@pytest.mark.parametrize(
    ("model", "match"),
    [
        ('<class name="t"><record name="r" fields="a"/>', "binary"),
        ('<class name="t" dialect="binary"><record name="r" fields="nope"/>', "not a field"),
        ('<class name="t" dialect="binary"><record name="r" fields="n"/>', "not a field"),
        ('<class name="t" dialect="binary"><record name="r" fields="a, a"/>', "twice"),
        ('<class name="t" dialect="binary"><record name="r" fields=""/>', "no field"),
        ('<class name="t" dialect="binary"><record name="r" fields="a" wire="2"/>', "wire"),
        ('<class name="t" dialect="binary"><record fields="a"/>', "name"),
    ],
)
def test_a_record_names_fields_of_the_binary_message(
    tmp_path: Path, model: str, match: str
) -> None:
    with pytest.raises(ModelError, match=match):
        load(string_model(tmp_path, model))
