"""Decoders that read the head's bits fields as one number give what the old ones gave.

Session 16 (issue 15): a decoder's plan reads TMQP's two flag octets as one little-endian
``H`` (``zproto.shape.merge_bits``), the key of the remembered base states, where it read
two octets and joined them (``flags << 8 | options``).  The old generated codec is made
here again (the model generated with ``merge_bits`` a no-op) and both decode the same
seeded frames: valid ones of every flag value and length form, the same mutated (an octet
changed, cut short, one octet more) and random octets.  Every decoder of the module must
give the same message or the same ``DecodeError`` reason: ``decode``,
``decode_message_records`` (taken and refused), ``decode_entries`` and ``decode_run``.
"""

from __future__ import annotations

import random
import types
from pathlib import Path
from typing import Any

import pytest

from broker import tmqp
from broker.engine.tmqp_door import WIRE
from broker.message import Message
from tests.zproto.support import load_module
from zproto import shape
from zproto.codegen import PythonGenerator
from zproto.errors import DecodeError
from zproto.model import load

MODEL = Path(tmqp.__file__).with_suffix(".xml")
SEED = 16
FRAMES = 3000


@pytest.fixture(scope="module")
def old(monkeypatch_module: pytest.MonkeyPatch) -> types.ModuleType:
    """TMQP's codec as generated before session 16: each flag octet on its own."""
    monkeypatch_module.setattr(shape, "merge_bits", lambda plan: None)
    source = PythonGenerator(load(MODEL), MODEL.name).generate()
    assert "k_bits" not in source and "bits_flags << 8 | bits_options" in source
    return load_module(source, "_test_tmqp_unkeyed")


@pytest.fixture(scope="module")
def monkeypatch_module() -> Any:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def _frame(rng: random.Random) -> bytes:
    """A valid frame: random flags (header block or not), ids, lengths of every form."""
    headers = () if rng.random() < 0.7 else (("K", "v" * rng.randrange(4)),)
    text = ["", "a", "c-7f3a9e21-12", "é", "\u6f22x", "ascii-" * 5]
    payload = bytes(rng.randrange(256) for _ in range(rng.choice((0, 1, 100, 252, 253, 300))))
    return tmqp.encode_frame(
        first_acquirer=rng.random() < 0.5,
        high_priority=rng.random() < 0.5,
        message_type=rng.randrange(64),
        pending_response=rng.random() < 0.5,
        pending_ack=rng.random() < 0.5,
        ttl=rng.randrange(32),
        content_type=rng.randrange(65536),
        message_id=rng.choice(text),
        source=rng.choice(text),
        target=rng.choice(text),
        headers=headers,
        payload=payload,
    )[0]


def _mutated(rng: random.Random, data: bytes) -> bytes:
    kind = rng.randrange(4)
    if kind == 0 and data:
        at = rng.randrange(len(data))
        return data[:at] + bytes([rng.randrange(256)]) + data[at + 1 :]
    if kind == 1:
        return data[: rng.randrange(len(data) + 1)]
    if kind == 2:
        return data + bytes([rng.randrange(256)])
    return bytes(rng.randrange(256) for _ in range(rng.randrange(40)))


def frames() -> list[bytes]:
    rng = random.Random(SEED)
    out = []
    for _ in range(FRAMES):
        data = _frame(rng)
        out.append(data if rng.random() < 0.4 else _mutated(rng, data))
    return out


def _outcome(module: types.ModuleType, data: bytes) -> Any:
    """The message as its class name and fields (the two modules' classes differ)."""
    try:
        m = module.decode((data,))
    except DecodeError as exc:
        return ("DecodeError", exc.reason)
    return (type(m).__name__, *(getattr(m, name) for name in m.__match_args__))


def test_decode_gives_the_old_message_or_the_old_error(old: types.ModuleType) -> None:
    sample = frames()
    outcomes = [(_outcome(tmqp, d), _outcome(old, d)) for d in sample]
    assert all(new == before for new, before in outcomes)
    decoded = sum(new[0] == "Frame" for new, _ in outcomes)
    assert 1000 < decoded < FRAMES  # (both kinds tested: messages and errors)


def test_records_take_and_refuse_the_same_frames(old: types.ModuleType) -> None:
    sample = frames()
    for start in range(0, FRAMES, 64):
        run = sample[start : start + 64]
        assert tmqp.decode_message_records(run, Message, WIRE) == (
            old.decode_message_records(run, Message, WIRE)
        )


def _entries(module: types.ModuleType, payload: bytes) -> Any:
    try:
        frames = module.decode_entries(payload, 1024)
    except DecodeError as exc:
        return ("DecodeError", exc.reason)
    return [module.encode(f) for f in frames]


def test_entries_and_runs_decode_the_same(old: types.ModuleType) -> None:
    sample = frames()
    for start in range(0, FRAMES, 16):
        run = sample[start : start + 16]
        payload = b"".join(len(d).to_bytes(4, "little") + d for d in run)
        assert _entries(tmqp, payload) == _entries(old, payload)
        ends = []
        for d in run:
            ends.append((ends[-1] if ends else 3) + len(d))
        buf = b"pad" + b"".join(run)
        new_frames, new_bad = tmqp.decode_run(buf, 3, ends)
        old_frames, old_bad = old.decode_run(buf, 3, ends)
        assert new_bad == old_bad
        assert [tmqp.encode(f) for f in new_frames] == [old.encode(f) for f in old_frames]
        assert [(f.message_id, f.ttl, f.pending_ack) for f in new_frames] == [
            (f.message_id, f.ttl, f.pending_ack) for f in old_frames
        ]


def test_the_flag_octets_by_hand() -> None:
    """An independent vector: flags 0x91 (first acquirer, type 17), options 0x50
    (pending ack, ttl 16), no lengths, content type 0x0102, payload 'ab'."""
    data = bytes([0x91, 0x50, 0, 0, 0, 0x02, 0x01, 2]) + b"ab"
    m = tmqp.decode((data,))
    assert isinstance(m, tmqp.Frame)
    assert (m.first_acquirer, m.high_priority, m.message_type) == (True, False, 17)
    assert (m.pending_response, m.pending_ack, m.ttl) == (False, True, 16)
    assert (m.content_type, m.payload, m.headers) == (0x0102, b"ab", ())
    ((r,), bad) = tmqp.decode_message_records([data], Message, WIRE)
    assert bad == []
    assert (r.first_acquirer, r.high_priority, r.wants_ack, r.ttl) == (True, False, True, 16)
