"""The octets path's per-push check (``broker.engine.octets_run``) against the record
decoder, sans-IO: a push the engine delivers as its octets must be one that
``tmqp.decode_message_records`` reads, with the run's first push's flags, source, target
and content type; and the engine's output with the octets path must be what the record
path gives for the same pushes (the octets path first, the rest through
``Engine.receive_pushes``, as the server serves a run).

The frames: a valid push of the run's shape, then seeded damage -- an octet changed
(each position, random values), octets cut off or added, another id length or payload
length, the ids of the window again -- 3,000 of them.
"""

from __future__ import annotations

import random

import pytest

from broker import tmqp
from broker.client.frames import join_frame
from broker.engine.engine import Engine
from broker.engine.tmqp_door import WIRE, encode, shape_of
from broker.message import Message
from broker.protocol import MessageType, Outgoing, Tracked
from tests.broker.engine_kit import Kit

SOURCE = "p"


def push(mid: str, body: bytes, **kw: object) -> bytes:
    fields: dict[str, object] = {
        "message_type": MessageType.QUEUE,
        "message_id": mid,
        "source": SOURCE,
        "target": "ch",
        "content_type": 1,
        "payload": body,
    }
    fields.update(kw)
    return tmqp.encode_frame(**fields)[0]  # type: ignore[arg-type]


def damaged(rng: random.Random, i: int, good_share: float = 0.0) -> bytes:
    """A push of the run's shape (at least ``good_share`` of them), or one damaged one
    way or another."""
    good = push(f"m{i}", bytes([i % 256]) * rng.randint(0, 60))
    kind = rng.randrange(9)
    if kind == 0 or rng.random() < good_share:
        return good
    if kind == 1:  # one octet changed
        at = rng.randrange(len(good))
        return good[:at] + bytes([rng.randrange(256)]) + good[at + 1 :]
    if kind == 2:  # cut short
        return good[: rng.randrange(len(good))]
    if kind == 3:  # octets added
        return good + bytes(rng.randrange(256) for _ in range(rng.randint(1, 3)))
    if kind == 4:  # the id length told otherwise
        return good[:2] + bytes([rng.randrange(256)]) + good[3:]
    if kind == 5:  # the payload length told otherwise
        return good[:7] + bytes([rng.randrange(256)]) + good[8:]
    if kind == 6:  # an id seen before (a duplicate when the queue remembers ids)
        return push(f"m{rng.randrange(i + 1)}", b"again")
    if kind == 7:  # another shape: flags, a wait, headers, another queue or source
        return rng.choice(
            (
                push(f"m{i}", b"h", high_priority=True),
                push(f"m{i}", b"a", pending_ack=True),
                push(f"m{i}", b"f", first_acquirer=True),
                push(f"m{i}", b"x", headers=(("X", "y"),)),
                push(f"m{i}", b"q", content_type=2),
                push(f"m{i}", b"s", source="q"),
                push(f"m{i}", b"t", ttl=3),
                push(f"m{i}", b"w" * 300),
            )
        )
    return push("", b"no id")


def test_every_push_the_octets_path_takes_decodes_to_the_runs_shape() -> None:
    rng = random.Random(18)
    first = push("m-first", b"first")
    shape = shape_of(first)
    assert shape is not None
    m0 = shape[0]
    kit = Kit(auto_transmit=False)
    kit.connect("c")
    kit.connect("p")
    kit.queue("c", "ch", 1)
    kit.join("c", "ch")
    taken_any = 0
    for i in range(3000):
        data = damaged(rng, i)
        first = push(f"first-{i}", b"first")  # (a new id: the queue may remember ids)
        taken, outs = kit.engine.receive_push_octets("p", [first, data], kit.now, {"c"})
        if taken < 2:
            continue  # (the first always goes: it is the shape)
        taken_any += 1
        ms, bad = tmqp.decode_message_records([data], Message, WIRE)
        assert not bad, data
        m = ms[0]
        assert (m.source, m.target, m.content_type, m.high_priority, m.first_acquirer) == (
            m0.source,
            m0.target,
            m0.content_type,
            m0.high_priority,
            m0.first_acquirer,
        )
        assert (m.wants_ack, m.ttl, m.headers) == (m0.wants_ack, m0.ttl, m0.headers)
        assert [o.frame for o in outs] == [first, data]
        kit.engine.transmitted({"c": 2}, kit.now)
    assert taken_any > 300


def _serve(engine: Engine, datas: list[bytes], octets: bool, now: float) -> list[Outgoing]:
    """A run as the server serves it: the octets path where it takes pushes (one frame
    the records' where it stops after some), the record path for the rest; frames that
    do not decode left out (the server answers those itself)."""
    out: list[Outgoing] = []
    rest = datas
    while octets and rest:
        taken, outs = engine.receive_push_octets(SOURCE, rest, now, {"c"})
        out += outs
        rest = rest[taken:]
        if not taken or not rest:
            break
        ms, _bad = tmqp.decode_message_records(rest[:1], Message, WIRE)
        out += engine.receive_pushes(SOURCE, ms, now)
        rest = rest[1:]
    ms, _bad = tmqp.decode_message_records(rest, Message, WIRE)
    out += engine.receive_pushes(SOURCE, ms, now)
    return out


def _seen(out: list[Outgoing]) -> list[tuple[str, bytes, bool]]:
    """Each output as (client, octets, tracked): a delivery's octets as the server sends
    them (``bytes``: as they came; a message: encoded)."""
    seen = []
    for o in out:
        frame = o.frame
        if type(frame) is bytes:
            data = frame
        elif isinstance(frame, Message):
            data = encode(frame)
        else:
            data = tmqp.encode(frame)[0]
        seen.append((o.client_id, data, type(o) is Tracked))
    return seen


@pytest.mark.parametrize(
    ("options", "window"),
    [
        ({}, 0),
        ({"use_message_id": True, "duplicate_window": 50}, 0),
        ({"message_size_limit": 30}, 0),
        ({}, 40),
    ],
)
def test_the_octets_path_gives_what_the_record_path_gives(
    options: dict[str, object], window: int
) -> None:
    """Runs of damaged and valid pushes into a queue (duplicates remembered, a size
    limit, a small window): the same output, octet for octet and in order, and the same
    queue afterwards, with the octets path as without it."""
    got = {}
    for octets in (True, False):
        rng = random.Random(7)
        kit = Kit(auto_transmit=False)
        kit.connect("c")
        kit.connect("p")
        kit.queue("c", "ch", 1, **options)
        if window:
            kit.route(kit.engine.receive("c", join_frame("j", "ch", window), kit.now))
        else:
            kit.join("c", "ch")
        seen = []
        as_octets = 0
        unreported = 0  # tracked deliveries not reported taken yet
        i = 0
        for _run in range(60):
            datas = []
            for _ in range(rng.randint(1, 60)):
                datas.append(damaged(rng, i, 0.8))
                i += 1
            out = _serve(kit.engine, datas, octets, kit.now)
            as_octets += sum(1 for o in out if type(o.frame) is bytes)
            seen += _seen(out)
            unreported += sum(1 for o in out if type(o) is Tracked)
            while unreported and rng.random() < 0.7:  # the transport takes them (or not yet)
                more = kit.engine.transmitted({"c": unreported}, kit.now)
                seen += _seen(more)
                unreported = sum(1 for o in more if type(o) is Tracked)
        got[octets] = (seen, kit.info("c", "ch", 1))
        assert (as_octets > 100) if octets else not as_octets
    assert got[True][0] == got[False][0]
    assert got[True][1] == got[False][1]
