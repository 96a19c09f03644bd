"""A RECEIPT promises that every frame before it was applied (STOMP 1.2, "DISCONNECT":
the client may close once the receipt came).  On the engine the listener hands ACKs to
the engine thread without waiting for them, so these tests hold that thread still:
the test *is* the engine thread (it runs the door's operations itself, ``pump``) and
the clients speak raw frames over real sockets to a real listener."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from broker.stomp.session import SessionState
from tests.polling import wait_until
from tests.stomp.engine_side import Engineside, RawClient, header, send_orders, subscribe

COUNT = 5


@pytest.mark.parametrize("frames", ["one write", "frame by frame"])
def test_the_disconnect_receipt_waits_until_the_acks_before_it_were_applied(
    engine_side: Engineside, held_clients: Callable[[], RawClient], frames: str
) -> None:
    """Regression: the RECEIPT of a DISCONNECT left as soon as the listener read it,
    while the ACKs before it still waited for the engine thread: a kill in between
    redelivered acknowledged messages to the next subscriber after the client was told
    its work was done.  Here the engine thread stands still until the listener has
    handled the DISCONNECT: no RECEIPT may be readable then; once the ACKs ran it comes,
    and the next subscriber gets none of the acknowledged messages."""
    producer, consumer = held_clients(), held_clients()
    bodies = [f"order-{i}".encode() for i in range(COUNT)]
    send_orders(producer, bodies)
    subscribe(consumer)
    messages = [consumer.next_frame() for _ in bodies]
    assert [m.split(b"\n\n", 1)[1] for m in messages] == bodies
    acks = [b"ACK\nid:" + header(m, b"ack") + b"\n\n\x00" for m in messages]
    goodbye = b"DISCONNECT\nreceipt:bye\n\n\x00"
    if frames == "one write":
        consumer.send(b"".join(acks) + goodbye)
    else:
        for data in [*acks, goodbye]:
            consumer.send(data)
    # the engine thread stands still: wait until the listener handled the DISCONNECT
    assert wait_until(lambda: engine_side.session_state(consumer.id) is not SessionState.CONNECTED)
    assert engine_side.door.pending_ops > 0  # the ACKs wait for the engine thread
    assert not consumer.readable(), "RECEIPT before the ACKs were applied"
    receipt = consumer.next_frame()  # the engine thread runs: the ACKs, then the RECEIPT
    assert receipt.startswith(b"RECEIPT\nreceipt-id:bye")
    queue = engine_side.engine.channels["orders"].queues[0]
    assert not (queue.pending or queue.auto_in_flight)  # nothing unacknowledged
    # the next subscriber: the first message it gets is one sent after the goodbye
    successor = held_clients()
    subscribe(successor)
    send_orders(producer, [b"after"])
    first = successor.next_frame()
    assert first.startswith(b"MESSAGE\n") and first.endswith(b"\n\nafter"), first


def test_an_ack_receipt_waits_until_the_ack_was_applied(
    engine_side: Engineside, held_clients: Callable[[], RawClient]
) -> None:
    """Any RECEIPT, not only DISCONNECT's: an ACK asking for one hears it once applied."""
    producer, consumer = held_clients(), held_clients()
    send_orders(producer, [b"one"])
    subscribe(consumer)
    message = consumer.next_frame()
    consumer.send(b"ACK\nid:" + header(message, b"ack") + b"\nreceipt:acked\n\n\x00")
    backend = engine_side.listener.backend
    # the engine thread stands still: wait until the listener handled the ACK
    assert wait_until(
        lambda: engine_side.listener.call(lambda: not backend.conns[consumer.id].pending)
    )
    assert engine_side.door.pending_ops > 0  # the ACK waits for the engine thread
    assert not consumer.readable(), "RECEIPT before the ACK was applied"
    assert consumer.next_frame().startswith(b"RECEIPT\nreceipt-id:acked")
    queue = engine_side.engine.channels["orders"].queues[0]
    assert not (queue.pending or queue.auto_in_flight)
