"""A consumer whose connection dies just as the listener resumes writing to it (session
21, adv21: the flake of ``test_plain_write_sockets.py::test_a_consumer_reset_while_its_
transport_is_full_leaves_the_rest_to_the_next``, about 1 run in 150 under load).

asyncio calls the protocol's ``resume_writing`` from inside the transport's write
callback, once the buffer drained.  The listener used to write there at once (the held
deliveries, ``flush_all``): when that write failed (the peer had reset meanwhile), the
transport closed itself and the callback it was called from then ran the connection's
teardown a second time (CPython 3.11, gh-156512): asyncio logged an ERROR with a
traceback ("Exception in callback _SelectorSocketTransport._call_connection_lost").  The
listener now writes after that callback returned.

Made deterministic here: the consumer's ``resume_writing`` is wrapped so that, when the
transport has just sent everything it held, the server's socket is shut for writing
before the listener's own ``resume_writing`` runs -- every send fails from then on, as
after a reset that arrived between the two sends.  Real listener, engine and sockets."""

from __future__ import annotations

import logging
import socket
from typing import Any

import pytest

from tests.polling import wait_until
from tests.stomp.test_listener import Raw
from tests.stomp.two_doors import SMALL_OUTBOUND, Broker, numbered, shrink_send_buffers

MAX_OUTBOUND = SMALL_OUTBOUND
COUNT = 3000
BODY = 100


def _cut_at_resume(b: Broker, fired: list[int]) -> None:
    """Wrap every connection's ``resume_writing`` (the consumer is the only one): once,
    when its transport has just sent all it held, shut the server's socket for writing
    first (every send fails from then on)."""

    def wrap() -> None:
        for conn in b.listener.connections.values():
            original = conn.resume_writing
            transport = conn.transport
            assert transport is not None

            def resume(original: Any = original, transport: Any = transport) -> None:
                if not fired and transport.get_write_buffer_size() == 0:
                    fired.append(1)
                    transport.get_extra_info("socket").shutdown(socket.SHUT_WR)
                original()

            conn.resume_writing = resume  # type: ignore[method-assign]

    b.listener.call(wrap)


def test_a_write_that_fails_as_writing_resumes_closes_the_connection_once(
    small: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    consumer = Raw(small.listener.port, rcvbuf=4096)
    producer = Raw(small.listener.port)
    try:
        consumer.connect()
        consumer.send(b"SUBSCRIBE\nid:s\ndestination:/queue/cut\nack:auto\nreceipt:r\n\n\x00")
        assert consumer.next().header("receipt-id") == "r"
        shrink_send_buffers(small.listener)
        fired: list[int] = []
        _cut_at_resume(small, fired)
        producer.connect()
        producer.send(
            b"".join(b"SEND\ndestination:/queue/cut\n\n%s\x00" % numbered(i) for i in range(COUNT))
        )
        while consumer.sock.recv(65536):  # read until the server's side ends (its FIN)
            pass
        assert fired, "the transport never resumed with an empty buffer"
        assert wait_until(lambda: len(small.listener.connections) == 1)  # (the producer)
        assert wait_until(lambda: small.held_deliveries() == 0)
        follower = Raw(small.listener.port)
        try:  # the rest goes to the next consumer, in order, each once
            follower.connect()
            follower.send(b"SUBSCRIBE\nid:f\ndestination:/queue/cut\nack:auto\n\n\x00")
            numbers = []
            while not numbers or numbers[-1] != COUNT - 1:
                numbers.append(int(follower.next().body[:6]))
            assert numbers == sorted(set(numbers))
        finally:
            follower.close()
    finally:
        consumer.close()
        producer.close()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
