"""Deliveries that reach a consumer's connection after a write to it failed (session 21,
adv21).

A write to a consumer whose peer is gone fails; asyncio closes the transport and calls
the protocol's ``connection_lost`` on a later turn of its loop.  Deliveries the engine
handed over before that turn used to be taken as if the connection could still send
them (the failed transport's buffer is empty: all the room in the world): ``ack:auto``
deliveries reported taken are acknowledged, so they were lost.  They now stay held and
go back to their queue with the connection (up to a window of them: a run of 1000 in
the worst case).  Found while making the flake of ``test_plain_write_sockets.py``'s
reset test deterministic (``test_adversary_resume.py``): there, the follower waited in
vain for the last message in about 1 run of 6."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from tests.polling import WAIT, wait_until
from tests.stomp.engine_side import Engineside, RawClient


def _body(i: int) -> bytes:
    return b"%06d" % i + b"." * 94


@pytest.fixture
def side() -> Iterator[Engineside]:
    made = Engineside()
    yield made
    made.stop()


def test_deliveries_that_arrive_after_a_failed_write_go_back_to_the_queue(
    side: Engineside,
) -> None:
    """A write to a consumer fails (its peer is gone): asyncio closes the transport and
    calls ``connection_lost`` on a later turn of the loop.  Deliveries the engine handed
    over before that turn must not be taken (``ack:auto``: taken is acknowledged, gone):
    they go back to the queue and the next consumer gets every one, in order.  The
    listener is held while the engine publishes, so the deliveries are queued behind the
    failed write and ahead of the teardown."""
    consumer = RawClient(side)
    producer = RawClient(side)
    raws = [consumer, producer]
    try:
        consumer.send(b"SUBSCRIBE\nid:s\ndestination:/queue/late\nack:auto\nreceipt:r\n\n\x00")
        assert consumer.next_frame().startswith(b"RECEIPT\nreceipt-id:r")
        producer.send(
            b"".join(b"SEND\ndestination:/queue/late\n\n%s\x00" % _body(i) for i in range(50))
        )
        assert wait_until(lambda: side.door.pending_ops > 0)  # (read, not published yet)
        held = threading.Event()
        release = threading.Event()

        def hold_then_fail() -> None:
            held.set()
            assert release.wait(WAIT)  # the loop waits while the engine publishes
            conn = side.listener.connections[consumer.id]
            assert conn.transport is not None
            conn.transport.get_extra_info("socket").shutdown(socket.SHUT_WR)
            conn.transport.write(b"\n")  # (a heart-beat EOL) fails: the transport closes
            assert conn.transport.is_closing()

        holder = threading.Thread(target=lambda: side.listener.call(hold_then_fail))
        holder.start()
        try:
            assert held.wait(WAIT)
            assert side.pump(lambda: side.door.pending_ops == 0)  # deliveries posted, queued
        finally:
            release.set()
            holder.join(WAIT)
        assert side.pump(lambda: side.session_state(consumer.id) is None)  # (torn down)
        follower = RawClient(side)
        raws.append(follower)
        follower.send(b"SUBSCRIBE\nid:f\ndestination:/queue/late\nack:auto\n\n\x00")
        bodies = [follower.next_frame().partition(b"\n\n")[2] for _ in range(50)]
        assert bodies == [_body(i) for i in range(50)]
    finally:
        for raw in raws:
            raw.close()
