"""The listener acknowledges every read at once (Linux ``TCP_QUICKACK``).

A client with Nagle's algorithm on (stomp.py's) holds its next small frames until its
last segment is acknowledged.  A producer gets no data back from the broker, so the
kernel would keep the acknowledgement for its delayed-ACK timer (40 ms) -- once after
a run's first SEND and again before its last ones.  After a request/response exchange
(CONNECT, CONNECTED) the kernel delays ACKs on that socket ("ping-pong" mode; reading
``TCP_QUICKACK`` says 0); after each read the listener turns that off again, which
sends the ACK due and is what ``TCP_QUICKACK`` then reads as 1.  The producer's socket
is checked once its SEND has been delivered (so it was read) and nothing was written to
it since: nothing can put it back in ping-pong mode.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from broker.stomp.frames import Command
from broker.stomp.memory import MemoryBackend
from broker.stomp.server import StompListener
from tests.stomp.test_listener import Raw, make_listener

pytestmark = pytest.mark.skipif(
    not hasattr(socket, "TCP_QUICKACK"), reason="TCP_QUICKACK is Linux's"
)


@pytest.fixture
def listener() -> Iterator[StompListener]:
    server = make_listener(MemoryBackend())
    yield server
    server.stop()


def quickack_of(listener: StompListener, connection_id: int) -> int:
    """``TCP_QUICKACK`` as the kernel reports it on the listener's side of a connection."""

    def read() -> int:
        transport = listener.connections[connection_id].transport
        assert transport is not None
        sock = transport.get_extra_info("socket")
        return int(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK))

    return listener.call(read)


def test_a_send_is_acknowledged_at_once(listener: StompListener) -> None:
    consumer = Raw(listener)
    consumer.connect()
    consumer.send(b"SUBSCRIBE\nid:s\ndestination:/queue/q\nreceipt:r\n\n\x00")
    assert consumer.next().command is Command.RECEIPT
    producer = Raw(listener)  # Nagle left on, as stomp.py does
    producer.connect()
    ids = listener.call(lambda: sorted(listener.connections))
    for n in range(3):
        producer.send(b"SEND\ndestination:/queue/q\n\nm%d\x00" % n)
        frame = consumer.next()
        assert frame.command is Command.MESSAGE and frame.body == b"m%d" % n
        assert quickack_of(listener, ids[-1]) == 1
    producer.close()
    consumer.close()
