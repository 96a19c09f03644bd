"""The second adversary review (session 22, adv22b): a TMQP producer's message whose id
holds a line feed, consumed by a STOMP 1.0 client (1.0 has no escapes: no header can
hold an LF), against a real listener and engine over loopback sockets.

Writing its MESSAGE raised ``EncodeError`` in the listener (a traceback in the log): it
was never written nor reported, so it sat in the consumer's window for good (with the
deliveries handed over in the same batch) -- what session 21 (adv21) fixed for an id
holding NUL, on every version.  Now, on 1.0, such a message carries the id the listener
makes for an id STOMP cannot carry (``tag-N``, as for NUL); a 1.0 ACK names it by that
id; the 1.1/1.2 MESSAGE escapes the LF as before.  A TMQP channel whose name holds LF,
matched by a 1.0 wildcard subscription, alike: its MESSAGE's destination goes with the
LF URL-encoded."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from broker.client.blocking import Client
from broker.stomp.engine_mapping import QUEUE_ID
from broker.stomp.frames import SERVER_COMMANDS, Command, FrameParser, Version
from tests.polling import wait_until
from tests.stomp.test_listener import Raw
from tests.stomp.two_doors import Broker, Ctx

IDS = ["ok-1", "line\nfeed", "ok-2"]


@pytest.fixture
def admin(broker: Broker, zctx: Ctx) -> Iterator[Client]:
    client = Client(broker.endpoint, context=zctx, timeout=10.0).connect()
    yield client
    client.close()


@pytest.mark.parametrize("ack", ["auto", "client"])
def test_a_tmqp_id_holding_lf_reaches_a_1_0_consumer_and_is_settled(
    broker: Broker, admin: Client, ack: str
) -> None:
    consumer = Raw(broker.listener.port)
    consumer.parser = FrameParser(commands=SERVER_COMMANDS, version=Version.V1_0)
    try:
        consumer.send(b"CONNECT\naccept-version:1.0\n\n\x00")
        assert consumer.next().command is Command.CONNECTED
        consumer.send(
            b"SUBSCRIBE\nid:s\ndestination:/queue/lf\nack:%s\nreceipt:r\n\n\x00" % ack.encode()
        )
        assert consumer.next().header("receipt-id") == "r"
        for i, message_id in enumerate(IDS):
            admin.push("lf", QUEUE_ID, b"m%d" % i, message_id=message_id)
        got = [consumer.next() for _ in IDS]
        assert [bytes(f.body) for f in got] == [b"m0", b"m1", b"m2"]
        ids = [str(f.header("message-id")) for f in got]
        assert ids[0::2] == ["ok-1", "ok-2"]
        assert ids[1].startswith("tag-") and "\n" not in ids[1]
        if ack == "client":  # (1.0 ACKs name the message id: each one acknowledged)
            for message_id in ids:
                consumer.send(b"ACK\nmessage-id:%s\n\n\x00" % message_id.encode())
        queue = broker.engine.channels["lf"].queues[QUEUE_ID]
        assert wait_until(
            lambda: broker.listener.call(
                lambda: queue.message_count == 0 and not (queue.pending or queue.auto_in_flight)
            )
        )
    finally:
        consumer.close()


def test_a_1_1_consumer_gets_the_lf_escaped(broker: Broker, admin: Client) -> None:
    consumer = Raw(broker.listener.port)
    try:
        consumer.send(b"CONNECT\naccept-version:1.1\nhost:localhost\n\n\x00")
        assert consumer.next().command is Command.CONNECTED
        consumer.send(b"SUBSCRIBE\nid:s\ndestination:/queue/lf\nreceipt:r\n\n\x00")
        assert consumer.next().header("receipt-id") == "r"
        admin.push("lf", QUEUE_ID, b"m", message_id=IDS[1])
        frame = consumer.next()
        assert frame.header("message-id") == IDS[1]  # (Raw reads 1.2: \n unescaped)
    finally:
        consumer.close()


def test_a_tmqp_channel_named_with_lf_reaches_a_1_0_wildcard_subscriber(
    broker: Broker, admin: Client
) -> None:
    """A TMQP channel ``w.x\\ny`` matched by a 1.0 ``/queue/w.*``: its MESSAGE's
    destination raised alike (the message stuck in flight); it now goes with the LF
    URL-encoded, as STOMP names write other characters."""
    consumer = Raw(broker.listener.port)
    consumer.parser = FrameParser(commands=SERVER_COMMANDS, version=Version.V1_0)
    try:
        consumer.send(b"CONNECT\naccept-version:1.0\n\n\x00")
        assert consumer.next().command is Command.CONNECTED
        consumer.send(b"SUBSCRIBE\nid:s\ndestination:/queue/w.*\nack:client\nreceipt:r\n\n\x00")
        assert consumer.next().header("receipt-id") == "r"
        channels = ["w.a", "w.x\ny", "w.b"]
        for channel in channels:
            admin.push(channel, QUEUE_ID, channel.encode(), message_id=f"id-{channel[2]}")
        got = [consumer.next() for _ in channels]
        assert [bytes(f.body) for f in got] == [c.encode() for c in channels]
        assert [f.header("destination") for f in got] == [
            "/queue/w.a",
            "/queue/w.x%0Ay",
            "/queue/w.b",
        ]
        for frame in got:
            consumer.send(b"ACK\nmessage-id:%s\n\n\x00" % str(frame.header("message-id")).encode())
        queues = [broker.engine.channels[c].queues[QUEUE_ID] for c in channels]
        assert wait_until(
            lambda: broker.listener.call(
                lambda: all(q.message_count == 0 and not q.pending for q in queues)
            )
        )
    finally:
        consumer.close()
