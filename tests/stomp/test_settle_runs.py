"""A read's ACKs and NACKs go to the engine as one settle operation per run of them
(``EngineBackend._submit_settles``): the outcome must be that of each frame in turn,
whatever follows in the same read (an UNSUBSCRIBE, a DISCONNECT)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.stomp.engine_side import Engineside, RawClient, header, send_orders, subscribe


def body(frame: bytes) -> bytes:
    return frame.split(b"\n\n", 1)[1]


@pytest.mark.parametrize("then", [b"UNSUBSCRIBE\nid:s\n\n\x00", b"DISCONNECT\n\n\x00"])
def test_acks_and_nacks_of_one_read_settle_in_order(
    engine_side: Engineside, held_clients: Callable[[], RawClient], then: bytes
) -> None:
    """ACK m0, NACK m1, ACK m2, ACK m2 again (ignored), NACK m0 (already settled: ignored),
    then an UNSUBSCRIBE or a DISCONNECT, all in one write: the next subscriber gets m1
    (its redelivery) and m3, m4 (never settled), and neither m0 nor m2."""
    producer, consumer = held_clients(), held_clients()
    bodies = [f"m{i}".encode() for i in range(5)]
    send_orders(producer, bodies)
    subscribe(consumer)
    frames = [consumer.next_frame() for _ in bodies]
    assert [body(f) for f in frames] == bodies
    ack = [header(f, b"ack") for f in frames]

    def settle(command: bytes, i: int) -> bytes:
        return command + b"\nid:" + ack[i] + b"\n\n\x00"

    consumer.send(
        settle(b"ACK", 0)
        + settle(b"NACK", 1)
        + settle(b"ACK", 2)
        + settle(b"ACK", 2)
        + settle(b"NACK", 0)
        + then
        + b"SEND\ndestination:/queue/orders\nreceipt:r\n\nlast\x00"  # (after a DISCONNECT:
    )  # not read at all; after an UNSUBSCRIBE: queued behind the others)
    successor = held_clients()
    subscribe(successor)
    expected = {b"m1", b"m3", b"m4"} | ({b"last"} if then.startswith(b"UNSUB") else set())
    got = {body(successor.next_frame()) for _ in expected}
    assert got == expected
    # nothing more: a marker sent now is the next frame the successor reads
    send_orders(producer, [b"marker"])
    assert body(successor.next_frame()) == b"marker"
    assert engine_side.engine.channels["orders"].queues[0].acks == 2
