"""A SEND taken by its destination but not by a copy of it (a durable subscription whose
store refused the save) gets an ERROR naming both, never a RECEIPT: as a RabbitMQ
publisher is nacked when one of the queues its message was routed to refused it.  The
message stays where it was taken (the subscription keeps the unsaved copy in memory: at
least once).  Alone and in a run of pipelined SENDs (``Engine.publish_many``: the run
stops there), over a real listener and engine whose store has room for two messages."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from broker.engine.delivery import PersistentDeliveryHandler
from broker.engine.engine import Engine
from broker.stomp.frames import Command
from tests.broker.full_disk import FullDisk
from tests.stomp.test_listener import Raw
from tests.stomp.test_send_failures import _assert_refused_at_r2, _raw
from tests.stomp.two_doors import Broker

Ctx = zmq.Context[zmq.Socket[bytes]]
#: The ERROR's reason for a SEND the topic took and the subscription did not save.
NOT_COPIED = "taken by /topic/news/0, not by /dsub/keep/0"


@pytest.fixture
def kept(zctx: Ctx) -> Iterator[Broker]:
    handlers = {"persistent": PersistentDeliveryHandler()}
    b = Broker(zctx, Engine(store=FullDisk(room=2), handlers=handlers))
    yield b
    b.stop()


def _subscribed(b: Broker) -> Raw:
    """A reader of durable subscription ``keep`` on ``/topic/news`` (auto ack)."""
    reader = _raw(b)
    reader.send(
        b"SUBSCRIBE\nid:keep\npersistent:true\ndestination:/topic/news\nreceipt:sub\n\n\x00"
    )
    assert reader.next().command is Command.RECEIPT
    return reader


def _send(i: int) -> str:
    return f"SEND\ndestination:/topic/news\nreceipt:r{i}\n\nm{i}\x00"


def _bodies(reader: Raw, b: Broker, count: int) -> list[bytes]:
    """The next ``count`` messages ``reader`` gets, then a marker sent after them by a
    new producer: nothing else came between."""
    bodies = [reader.next().body for _ in range(count)]
    marker = _raw(b)
    marker.send(b"SEND\ndestination:/topic/news\n\nmarker\x00")
    assert reader.next().body == b"marker"
    marker.close()
    return bodies


def test_a_run_of_sends_stops_with_an_error_where_a_durable_copy_was_not_saved(
    kept: Broker,
) -> None:
    reader = _subscribed(kept)
    producer = _raw(kept)
    producer.send("".join(_send(i) for i in range(6)).encode())  # one run into the topic
    assert producer.closed_by_server()
    _assert_refused_at_r2(producer.frames, NOT_COPIED)
    assert _bodies(reader, kept, 3) == [b"m0", b"m1", b"m2"]  # m3..m5 never went in
    reader.close()


def test_a_lone_send_whose_durable_copy_was_not_saved_gets_an_error(kept: Broker) -> None:
    reader = _subscribed(kept)
    producer = _raw(kept)
    answers = []
    for i in range(3):  # one at a time: each waits for its answer
        producer.send(_send(i).encode())
        answers.append(producer.next())
    _assert_refused_at_r2(answers, NOT_COPIED)
    assert producer.closed_by_server()
    assert _bodies(reader, kept, 3) == [b"m0", b"m1", b"m2"]
    reader.close()
