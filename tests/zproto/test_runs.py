"""``runs = "1"`` on a binary model: ``decode_run(buf, at, ends)`` decodes frames lying
back to back (TMQP: a fan-out run's deliveries), refusing by index exactly the frames
``decode`` refuses, and makes the simplest-shape ones lazily (only their payload sliced;
every other field decoded, for the whole run, when one is first read).  Checked against
frames built by hand from the spec, against ``decode`` of each frame alone and against
the general codec generated with ``fast=False``, with damaged runs."""

from __future__ import annotations

import copy
import dataclasses
import gc
import importlib
import pickle
import types
import weakref
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker import tmqp
from tests.zproto.support import CPU_BOUND, fields_of, general_codec, tmqp_frames
from zproto.errors import DecodeError
from zproto.model import ModelError, load

GENERAL = general_codec(Path(tmqp.__file__).with_suffix(".xml"))
PING = bytes.fromhex("89FF000000000000")
pytestmark = CPU_BOUND


def _queue(mid: bytes, source: bytes, target: bytes, payload: bytes, ct: int = 7) -> bytes:
    """A QUEUE frame by hand: type 0x02, pending ack (0x40) | ttl 16, the three string
    lengths, content type (LE), the one-octet payload length, the strings, the payload."""
    head = bytes([0x02, 0x40 | 16, len(mid), len(source), len(target), ct & 255, ct >> 8])
    return head + bytes([len(payload)]) + mid + source + target + payload


def _ends(at: int, frames: list[bytes]) -> list[int]:
    ends = []
    for frame in frames:
        at += len(frame)
        ends.append(at)
    return ends


def _outcome(
    module: types.ModuleType, buf: bytes, at: int, ends: list[int], lazy: bool = True
) -> Any:
    frames, bad = module.decode_run(buf, at, ends, lazy)
    return [list(fields_of(f).items()) for f in frames], bad


def _alone(buf: bytes, at: int, ends: list[int]) -> Any:
    """What ``decode`` of each frame alone gives: the Frames, the others' indexes (all
    from a misplaced end on)."""
    frames: list[Any] = []
    bad: list[int] = []
    for i, end in enumerate(ends):
        if not at <= end <= len(buf):
            bad += range(i, len(ends))
            break
        try:
            msg = tmqp.decode((buf[at:end],))
        except DecodeError:
            msg = None
        if type(msg) is tmqp.Frame:
            frames.append(list(fields_of(msg).items()))
        else:
            bad.append(i)
        at = end
    return frames, bad


def test_hand_built_frames_decode_to_their_fields() -> None:
    one = _queue(b"a1", b"s", b"ch", b"hi")
    two = _queue(b"", "é".encode(), b"x" * 40, b"\x00\xff", ct=300)
    buf = b"HEAD" + one + two
    (first, second), bad = tmqp.decode_run(buf, 4, _ends(4, [one, two]))
    assert bad == []
    assert isinstance(first, tmqp.Frame) and type(second) is tmqp.Frame
    assert first.payload == b"hi" and second.payload == b"\x00\xff"
    assert (first.message_type, first.pending_ack, first.ttl, first.content_type) == (
        2,
        True,
        16,
        7,
    )
    assert (first.message_id, first.source, first.target, first.headers) == ("a1", "s", "ch", ())
    assert (second.message_id, second.source, second.target) == ("", "é", "x" * 40)
    assert second.content_type == 300
    assert type(first) is tmqp.Frame  # (read: a plain Frame now)
    assert tmqp.decode_run(buf, 4, []) == ([], [])


def test_frames_made_lazily_behave_as_decoded_ones() -> None:
    """Equality, hash, repr, pickle, copy, replace and encode read the fields: they give
    what a decoded frame gives, whichever frame of the run is read first."""
    datas = [_queue(b"m%d" % i, b"src", b"chan", b"%03d" % i) for i in range(5)]
    expected = [tmqp.decode((d,)) for d in datas]
    buf = b"".join(datas)
    frames, _ = tmqp.decode_run(buf, 0, _ends(0, datas))
    assert frames[3] == expected[3]  # (the whole run decoded here)
    assert frames == expected
    frames, _ = tmqp.decode_run(buf, 0, _ends(0, datas))
    assert hash(frames[0]) == hash(expected[0])
    frames, _ = tmqp.decode_run(buf, 0, _ends(0, datas))
    assert repr(frames[1]) == repr(expected[1])
    assert pickle.loads(pickle.dumps(frames[2])) == expected[2]
    frames, _ = tmqp.decode_run(buf, 0, _ends(0, datas))
    assert copy.copy(frames[4]) == expected[4]
    assert frames[0].replace(payload=b"z") == expected[0].replace(payload=b"z")
    assert tmqp.encode(frames[1]) == [datas[1]]
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        frames[2].nope  # noqa: B018


_WHOLE_VALUE_READS: list[tuple[str, Any]] = [
    ("==", lambda f, d: f == d),
    ("== reflected", lambda f, d: d == f),
    ("!=", lambda f, d: (f != d) is False),
    ("hash", lambda f, d: hash(f) == hash(d)),
    ("repr", lambda f, d: repr(f) == repr(d)),
    ("pickle", lambda f, d: type(u := pickle.loads(pickle.dumps(f))) is tmqp.Frame and u == d),
    ("copy", lambda f, d: type(c := copy.copy(f)) is tmqp.Frame and c == d),
    ("deepcopy", lambda f, d: copy.deepcopy(f) == d),
    ("replace", lambda f, d: f.replace(ttl=3) == d.replace(ttl=3)),
    ("dataclasses.replace", lambda f, d: dataclasses.replace(f, ttl=3) == d.replace(ttl=3)),
    ("asdict", lambda f, d: dataclasses.asdict(f) == dataclasses.asdict(d)),
    ("encode", lambda f, d: tmqp.encode(f) == tmqp.encode(d) == f.encode()),
]


@pytest.mark.parametrize(
    "read", [r for _, r in _WHOLE_VALUE_READS], ids=[n for n, _ in _WHOLE_VALUE_READS]
)
def test_a_frame_still_waiting_gives_what_a_decoded_one_gives(read: Any) -> None:
    """Each whole-value operation on a frame not read yet (and on its run's neighbour,
    also waiting, on the other side of ``==``): it is decoded first, then a plain Frame;
    its neighbours, not read, keep waiting (each frame is decoded alone)."""
    datas = [_queue(b"m%d" % i, b"src", b"chan", b"%03d" % i) for i in range(3)]
    frames, _ = tmqp.decode_run(b"".join(datas), 0, _ends(0, datas))
    assert all(tmqp.waiting_fields(f) for f in frames)
    assert isinstance(frames[1], tmqp.Frame)
    assert read(frames[1], tmqp.decode((datas[1],)))
    assert [type(f) for f in frames] == [tmqp._FrameLazy, tmqp.Frame, tmqp._FrameLazy]
    others, _ = tmqp.decode_run(b"".join(datas), 0, _ends(0, datas))
    assert frames[0] == others[0] and others[2] != frames[1] and hash(others[2]) == hash(frames[2])


def test_a_run_dropped_unread_is_freed_at_once() -> None:
    """A frame still waiting refers to its run's buffer, not to the other frames: a run
    dropped unread is freed by reference counting, not left to the cyclic collector
    (which walks every frame held to find them, and holds their octets until it runs).
    Before session 13 each frame held the list of its run's frames: a cycle."""
    datas = [_queue(b"m%d" % i, b"src", b"chan", b"%03d" % i) for i in range(4)]
    buf = b"".join(datas)
    gc.disable()
    try:
        frames, _ = tmqp.decode_run(buf, 0, _ends(0, datas))
        assert all(tmqp.waiting_fields(f) for f in frames)
        gone = [weakref.ref(f) for f in frames]
        del frames
        assert [ref() for ref in gone] == [None] * 4
        frames, _ = tmqp.decode_run(buf, 0, _ends(0, datas))
        gone = [weakref.ref(f) for f in frames]
        assert frames[2].message_id == "m2"  # one read, the others still waiting
        del frames
        assert [ref() for ref in gone] == [None] * 4
    finally:
        gc.enable()


def test_non_ascii_octets_anywhere_in_a_run_are_still_checked_frame_by_frame() -> None:
    """A run with a non-ASCII octet (a payload, a flag) is not checked by one
    ``isascii`` of it: each frame's strings are (a non-UTF-8 id is refused by index),
    and frames whose strings are ASCII beside binary payloads are made lazily."""
    binary = _queue(b"id", b"src", b"ch", bytes(range(256))[128:200])
    broken = _queue(b"\xff\xfe", b"src", b"ch", b"p")
    datas = [binary, broken, binary]
    buf = b"".join(datas)
    ends = _ends(0, datas)
    assert tmqp.decode_run(buf, 0, ends)[1] == [1]
    assert _outcome(tmqp, buf, 0, ends) == _alone(buf, 0, ends)
    good, bad = tmqp.decode_run(binary * 3, 0, _ends(0, [binary] * 3))
    assert bad == [] and all(tmqp.waiting_fields(f) for f in good)
    assert [f.payload for f in good] == [bytes(range(128, 200))] * 3


def _generated_modules() -> list[types.ModuleType]:
    names = ["broker.tmqp", "filemq.fmq_msg", "filemq.fmq_msg_czmq"]
    return [importlib.import_module(name) for name in names]


def test_no_message_class_but_the_lazy_one_has_a_getattr_hook() -> None:
    """A class with ``__getattr__`` sends every attribute read of its instances through
    CPython's slow hook (3.11 no longer specializes them to slot reads): only the class
    of frames ``decode_run`` made and left waiting has one (and the class they have while
    a thread decodes them, late13), never a message class or its slots.  The
    regression: fan10 put it on ``_FrameSlots``, slowing every Frame read."""
    hooked = {
        f"{module.__name__}.{base.__name__}"
        for module in _generated_modules()
        for cls in vars(module).values()
        if isinstance(cls, type)
        for base in cls.__mro__
        if "__getattr__" in vars(base)
    }
    assert hooked == {"broker.tmqp._FrameLazy", "broker.tmqp._FrameWaking"}
    assert "__getattr__" not in vars(tmqp.Frame.__mro__[1])  # (its slots: _FrameSlots)
    assert tmqp.Frame not in tmqp._FrameWaking.__mro__  # (no message class under it)
    frames, _ = tmqp.decode_run(_queue(b"i", b"s", b"t", b"p"), 0, [12])
    assert type(frames[0]).__mro__[1] is tmqp.Frame and tmqp.waiting_fields(frames[0])
    assert frames[0].target == "t" and type(frames[0]) is tmqp.Frame


def _damaged() -> list[tuple[str, list[bytes]]]:
    good = _queue(b"id", b"src", b"ch", b"payload")
    return [
        ("payload length past its end", [good, good[:-1], good]),
        ("id not UTF-8", [good, _queue(b"\xff\xfe", b"src", b"ch", b"p"), good]),
        # "é" is C3 A9: split between the id and the source, each half is not UTF-8
        ("a character split between two strings", [_queue(b"a\xc3", b"\xa9b", b"ch", b"p")]),
        (
            "a header block that does not parse",
            [bytes([2, 0x20 | 16, 0, 0, 0, 1, 0, 1, 3, 0]) + b"k\r\nx", good],
        ),
        ("a literal (PING) in the run", [good, PING, good]),
        ("too short for a frame", [good, b"\x02\x10", good]),
    ]


@pytest.mark.parametrize(("name", "datas"), _damaged(), ids=[n for n, _ in _damaged()])
def test_a_frame_decode_refuses_is_refused_by_index(name: str, datas: list[bytes]) -> None:
    buf = b"".join(datas)
    ends = _ends(0, datas)
    assert tmqp.decode_run(buf, 0, ends)[1], name
    assert _outcome(tmqp, buf, 0, ends) == _alone(buf, 0, ends)
    assert _outcome(GENERAL, buf, 0, ends) == _alone(buf, 0, ends)


def test_valid_non_ascii_strings_are_made_lazily_too() -> None:
    datas = [_queue("ü".encode(), "源".encode(), "é".encode(), b"x")] * 3
    frames, bad = tmqp.decode_run(b"".join(datas), 0, _ends(0, datas))
    assert bad == [] and [f.source for f in frames] == ["源"] * 3


def test_frames_from_a_misplaced_end_on_are_refused() -> None:
    good = _queue(b"id", b"src", b"ch", b"payload")
    buf = good * 4
    n = len(good)
    assert tmqp.decode_run(buf, 0, [n, n - 1, 3 * n, 4 * n])[1] == [1, 2, 3]  # backwards
    assert tmqp.decode_run(buf, 0, [n, 2 * n, 5 * n, 6 * n])[1] == [2, 3]  # past the end
    frames, bad = tmqp.decode_run(buf, n, [2 * n, 4 * n, 3 * n])  # two in one, then back
    assert bad == [1, 2] and len(frames) == 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames=st.lists(tmqp_frames(), max_size=6), data=st.data())
def test_a_run_decodes_as_each_frame_alone_and_as_the_general_codec(
    frames: list[bytes], data: st.DataObject
) -> None:
    buf = b"pre" + b"".join(frames)
    ends = _ends(3, frames)
    assert _outcome(tmqp, buf, 3, ends) == _alone(buf, 3, ends)
    assert _outcome(tmqp, buf, 3, ends, lazy=False) == _alone(buf, 3, ends)
    assert _outcome(GENERAL, buf, 3, ends) == _alone(buf, 3, ends)
    # damaged octets, a cut buffer and shifted ends: still what decode says, frame by frame
    raw = bytearray(buf)
    if len(raw) > 3:
        pos = data.draw(st.integers(3, len(raw) - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    damaged = bytes(raw[: data.draw(st.integers(0, len(raw)))])
    shifted = [e + data.draw(st.integers(-2, 2)) for e in ends]
    assert _outcome(tmqp, damaged, 3, shifted) == _alone(damaged, 3, shifted)


@pytest.mark.parametrize("attrs", ['runs="1"', 'dialect="binary" runs="2"'])
def test_runs_is_0_or_1_on_a_binary_model(tmp_path: Path, attrs: str) -> None:
    path = tmp_path / "t.xml"
    path.write_text(f'<class name="t" {attrs}><message name="m">'
                    '<field name="a" type="number" size="1"/></message></class>')  # fmt: skip
    with pytest.raises(ModelError, match="runs"):
        load(path)
