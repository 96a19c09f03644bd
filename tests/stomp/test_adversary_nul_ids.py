"""A TMQP producer's message whose id or a header holds NUL, consumed over STOMP (session
21, adv21).

STOMP cannot carry NUL in a header.  Such a message made the listener raise
``EncodeError`` in the middle of a hand-over (an ERROR with a traceback in the log): it
was never written nor reported, so it sat in its consumer's window for good, and came
back to the next consumer to do the same (the plain path, ``deliver_plain``, and the
usual one alike).  Now its MESSAGE carries an id the listener makes (``tag-N``), a
header holding NUL is left out, and it is delivered and settled as any other."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from broker.client.blocking import Client
from broker.stomp.engine_mapping import QUEUE_ID
from broker.stomp.frames import Command, Frame
from tests.polling import wait_until
from tests.stomp.test_listener import Raw
from tests.stomp.two_doors import Broker

IDS = ["ok-1", "bad\x00id", "ok-2", "ok-3"]


def _settled(b: Broker, channel: str) -> bool:
    queue = b.engine.channels[channel].queues[QUEUE_ID]
    return queue.message_count == 0 and not (queue.pending or queue.auto_in_flight)


@pytest.mark.parametrize("ack", ["auto", "client-individual"])
def test_a_tmqp_message_whose_id_or_header_holds_nul_is_delivered_over_stomp(
    broker: Broker, tmqp: Callable[[], Client], caplog: pytest.LogCaptureFixture, ack: str
) -> None:
    caplog.set_level(logging.WARNING)
    consumer = Raw(broker.listener.port)
    try:
        consumer.connect()
        consumer.send(
            f"SUBSCRIBE\nid:s\ndestination:/queue/nul\nack:{ack}\nreceipt:r\n\n\x00".encode()
        )
        assert consumer.next().header("receipt-id") == "r"
        producer = tmqp()
        for mid in IDS:
            headers = {"note": "a\x00b", "kept": "yes"} if mid == "ok-3" else None
            producer.push("nul", QUEUE_ID, mid.encode(), message_id=mid, headers=headers)
        got: list[Frame] = [consumer.next() for _ in IDS]
        assert [f.command for f in got] == [Command.MESSAGE] * len(IDS)
        assert [f.body for f in got] == [mid.encode() for mid in IDS]
        ids = [f.header("message-id") or "" for f in got]
        assert ids[0] == "ok-1" and ids[2:] == ["ok-2", "ok-3"]
        assert "\x00" not in ids[1] and ids[1] not in IDS
        assert got[3].header("kept") == "yes" and got[3].header("note") is None
        if ack == "client-individual":
            consumer.send(b"".join(b"ACK\nid:%s\n\n\x00" % f.header("ack").encode() for f in got))
        assert wait_until(lambda: _settled(broker, "nul"))
    finally:
        consumer.close()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
