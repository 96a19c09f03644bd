"""Zero-copy pass-through at the TMQP door: a queue message delivered unchanged leaves as
the octets it arrived as; any change is encoded again, and octets cached by another door
(or forged) are never sent (``broker.engine.tmqp_door``, ``broker.message``)."""

from __future__ import annotations

from broker import tmqp
from broker.engine import tmqp_door
from broker.engine.delivery import PersistentDeliveryHandler
from broker.message import Message
from broker.protocol import MessageType, Tracked
from tests.broker.engine_kit import Kit


def _push(source: str, **fields: object) -> tuple[tmqp.Frame, bytes]:
    frame = tmqp.Frame(
        message_type=MessageType.QUEUE,
        content_type=1,
        target="ch",
        message_id="m1",
        source=source,
        payload=b"p" * 50,
    ).replace(**fields)
    return frame, frame.encode()[0]


def _engine(**queue: object) -> tuple[Kit, str, str]:
    kit = Kit()
    p = kit.connect("p")
    c = kit.connect("c")
    kit.queue(p, "ch", 1, **queue)
    kit.join(c, "ch")
    kit.take(p)
    kit.take(c)
    return kit, p, c


def _delivery(outs: list[object], client_id: str) -> Message:
    (out,) = [o for o in outs if isinstance(o, Tracked) and o.client_id == client_id]
    assert isinstance(out.frame, Message)
    return out.frame


def test_an_unchanged_push_leaves_as_the_octets_received() -> None:
    kit, p, c = _engine()
    frame, data = _push(p)
    m = _delivery(kit.engine.receive(p, frame, kit.now, data), c)
    assert tmqp_door.encode(m) is data  # the very octets: nothing encoded again


def test_a_queued_message_also_leaves_as_received_when_the_consumer_has_room() -> None:
    kit, p, c = _engine()
    kit.engine.clients[c].prefetch["ch"] = 1
    first, first_data = _push(p)
    second, second_data = _push(p, message_id="m2")
    assert _delivery(kit.engine.receive(p, first, kit.now, first_data), c).message_id == "m1"
    outs = kit.engine.receive(p, second, kit.now, second_data)
    assert not [o for o in outs if isinstance(o, Tracked)]  # the window is full: it waits
    m = _delivery(kit.engine.transmitted({c: 1}, kit.now), c)
    assert m.message_id == "m2" and tmqp_door.encode(m) is second_data


def test_a_changed_message_is_encoded_again() -> None:
    kit, p, c = _engine(request_acknowledge=True)
    frame, data = _push("")  # no source: the engine stamps the producer's id
    m = _delivery(kit.engine.receive(p, frame, kit.now, data), c)
    assert m.wire is None
    sent = tmqp.decode([tmqp_door.encode(m)])
    assert sent == frame.replace(source=p, pending_ack=True)


def test_a_push_awaiting_a_response_keeps_no_wire_form() -> None:
    frame, data = _push("p", pending_response=True)
    assert tmqp_door.message_of(frame, data).wire is None
    frame, data = _push("p")
    assert tmqp_door.message_of(frame, data).wire == (tmqp_door.WIRE, data)
    assert tmqp_door.message_of(frame).wire is None


def test_octets_of_another_door_or_forged_ones_are_never_sent() -> None:
    m = Message("m1", "p", "ch", 1, payload=b"real")
    canonical = tmqp_door.frame_of(m).encode()[0]
    for forged in ((object(), b"garbage"), ("tmqp", b"garbage")):
        odd = m._replace(wire=forged)
        assert tmqp_door.encode(odd) == canonical
    # a door's own wire form does not survive a change
    own = tmqp_door.message_of(tmqp_door.frame_of(m), canonical)
    assert own.wire is not None
    changed = own.replace(payload=b"other")
    assert changed.wire is None
    assert tmqp.decode([tmqp_door.encode(changed)]).payload == b"other"  # type: ignore[union-attr]


def test_a_typed_publish_with_forged_octets_reaches_a_tmqp_consumer_intact() -> None:
    kit = Kit()
    kit.typed.add("p")
    p = kit.connect("p")
    c = kit.connect("c")
    kit.join(c, "ch")
    kit.take(c)
    for n, forged in enumerate(((tmqp_door.WIRE.name, b"lie"), (tmqp_door.WIRE, b"lie"))):
        # (distinct ids: the queue takes a repeated id as a duplicate, broker.engine.queue.dedupe)
        hostile = Message(f"m{n}", p, "ch", 0, payload=b"true", wire=forged)
        outs = kit.route(kit.engine.publish(p, hostile, kit.now))
        (got,) = [o.frame for o in outs if o.client_id == c]
        assert got.payload == b"true" and got.message_id == f"m{n}"


def test_a_stored_message_keeps_no_door_octets() -> None:
    kit = Kit(handlers={"persistent": PersistentDeliveryHandler()})
    p = kit.connect("p")
    kit.queue(p, "ch", 1, message_delivery_handler="persistent")
    frame, data = _push(p)
    kit.engine.receive(p, frame, kit.now, data)  # no consumer: it waits, saved
    (stored,) = kit.engine.store.iterate(("ch", 1))
    assert stored.message.wire is None
    assert stored.message == tmqp_door.message_of(frame)
