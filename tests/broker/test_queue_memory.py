"""What a waiting message costs in memory, and that the compact form loses nothing.

A queued message is one ``QueueMessage`` holding the message's fields (no ``Message``
tuple) and no ``Life`` until it is sent, awaited or put back.  Memory is measured with
tracemalloc (allocation sizes are deterministic, unlike RSS or time)."""

from __future__ import annotations

import gc
import tracemalloc

from broker import tmqp
from broker.engine.engine import Engine
from broker.engine.message import QueueMessage
from broker.message import Message
from broker.protocol import ConnectionInfo, MessageType

PAYLOAD = b"x" * 100


def test_a_waiting_100_byte_message_costs_at_most_300_octets_beside_its_payload() -> None:
    engine = Engine()
    cid, _ = engine.connect(ConnectionInfo(client_id="producer-0001"), 0.0)

    def push(i: int) -> None:
        frame = tmqp.Frame(
            message_type=int(MessageType.QUEUE),
            message_id=f"{cid}-{i:010d}",
            source=cid,
            target="orders",
            content_type=1,
            payload=PAYLOAD,
        )
        octets = frame.encode()[0]
        engine.receive(cid, tmqp.decode((octets,)), float(i), octets)

    push(0)  # (creates the channel and its queue)
    count = 5000
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(1, count + 1):
            push(i)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    queue = engine.channels["orders"].queues[1]
    assert queue.message_count == count + 1
    overhead = grown / count - len(PAYLOAD)
    assert overhead <= 300, overhead


def test_the_compact_form_gives_back_every_field_and_the_wire_until_parked() -> None:
    wire = (object(), b"octets")
    message = Message("id-1", "producer", "orders", 7, True, True, True, 200,
                      (("a", "b"),), b"payload", wire)  # fmt: skip
    m = QueueMessage(5, message, None, False)
    assert m.message == message and m.message.wire is wire
    assert (m.ttl, m.high_priority, m.message_id, m.payload) == (200, True, "id-1", b"payload")
    m.park()
    assert m.message == message._replace(wire=None)
    assert m.life is None  # nothing gathered: parked without one
    m.delivered = 2
    assert m.life is not None and m.message.wire is None and m.delivered == 2
    plain = QueueMessage(6, Message(message_id="x"), None, True)
    assert plain.producer_waits and not plain.acked and plain.out is None
