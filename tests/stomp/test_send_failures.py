"""A SEND the broker fails to take gets an ERROR, never a RECEIPT: a receipt follows
only a message the broker holds (a ``persistent:true`` one: holds in its store).  Alone
or in a run of pipelined SENDs (``Engine.publish_many``: the run stops there, nothing
after it takes effect), over a real listener and engine.  The failures come from the
engine's real collaborators, not a patched engine: an authorizer whose policy lookup
raises, a store whose disk is full."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from broker.engine.auth import Action, Authorizer
from broker.engine.engine import Engine
from broker.message import Message
from broker.protocol import ConnectionInfo
from broker.stomp.frames import Command, Frame
from tests.broker.full_disk import FullDisk
from tests.polling import wait_until
from tests.stomp.test_listener import Raw
from tests.stomp.two_doors import Broker

Ctx = zmq.Context[zmq.Socket[bytes]]


class PolicyDown(Exception):
    """The authorizer's policy service could not be reached."""


class FlakyPolicy(Authorizer):
    """Allows everything, but its ``fail_at``-th push check (counted from 0) raises, as
    an authorizer backed by an outside policy service does when that service is down."""

    def __init__(self, fail_at: int) -> None:
        self.fail_at = fail_at
        self.pushes = 0
        self.lock = threading.Lock()

    def allows(
        self,
        client: Any,
        action: Action,
        channel: str | None = None,
        queue: int | None = None,
        target: str | None = None,
    ) -> bool:
        if action is not Action.PUSH or channel != "p":
            return True
        with self.lock:
            n = self.pushes
            self.pushes += 1
        if n == self.fail_at:
            raise PolicyDown("policy service unreachable")
        return True


@pytest.fixture
def flaky(zctx: Ctx) -> Iterator[Broker]:
    b = Broker(zctx, Engine(authorizer=FlakyPolicy(fail_at=2)))
    yield b
    b.stop()


@pytest.fixture
def full(zctx: Ctx) -> Iterator[Broker]:
    b = Broker(zctx, Engine(store=FullDisk(room=2)))
    yield b
    b.stop()


def _raw(b: Broker) -> Raw:
    raw = Raw(b.listener.port)
    raw.connect()
    return raw


def _send(i: int, persistent: bool = False, queue: str = "p") -> str:
    extra = "persistent:true\n" if persistent else ""
    return f"SEND\ndestination:/queue/{queue}\n{extra}receipt:r{i}\n\nm{i}\x00"


def _consumed(b: Broker, count: int, queue: str = "p") -> list[bytes]:
    """What a consumer that joins now receives: ``count`` messages, then (a marker sent
    after them through the same queue) nothing else before the marker."""
    consumer = _raw(b)
    consumer.send(f"SUBSCRIBE\nid:s\ndestination:/queue/{queue}\nreceipt:sub\n\n\x00".encode())
    assert consumer.next().command is Command.RECEIPT
    bodies = [consumer.next().body for _ in range(count)]
    consumer.send(f"SEND\ndestination:/queue/{queue}\n\nmarker\x00".encode())
    assert consumer.next().body == b"marker"
    consumer.close()
    return bodies


def _assert_refused_at_r2(got: list[Frame], why: str = "internal error") -> None:
    assert [f.command for f in got] == [Command.RECEIPT, Command.RECEIPT, Command.ERROR]
    assert [f.header("receipt-id") for f in got] == ["r0", "r1", "r2"]
    assert why in str(got[2].header("message"))


@pytest.fixture
def flaky_first(zctx: Ctx) -> Iterator[Broker]:
    b = Broker(zctx, Engine(authorizer=FlakyPolicy(fail_at=0)))
    yield b
    b.stop()


def test_a_run_stops_with_an_error_at_the_send_the_broker_failed_to_take(
    flaky_first: Broker,
) -> None:
    """The authorizer is asked once per run into one queue (``Engine.publish_many``):
    its failure refuses the run's first SEND; those before it (another queue's run in
    the same read) were taken, none after it takes effect."""
    producer = _raw(flaky_first)
    burst = [_send(i, queue="o") for i in range(2)] + [_send(i) for i in range(2, 6)]
    producer.send("".join(burst).encode())  # one read: runs into /queue/o, /queue/p
    assert producer.closed_by_server()
    _assert_refused_at_r2(producer.frames)
    assert _consumed(flaky_first, 2, queue="o") == [b"m0", b"m1"]
    assert _consumed(flaky_first, 0) == []  # m3..m5 never went in
    assert flaky_first.engine.errors == 1


def test_a_lone_send_the_broker_failed_to_take_gets_an_error(flaky: Broker) -> None:
    """Each SEND waits for its answer: each is a run of one."""
    producer = _raw(flaky)
    answers = []
    for i in range(3):  # one at a time: each waits for its answer
        producer.send(_send(i).encode())
        answers.append(producer.next())
    _assert_refused_at_r2(answers)
    assert producer.closed_by_server()
    assert _consumed(flaky, 2) == [b"m0", b"m1"]


def test_publish_many_counts_a_push_that_raised_as_refused_not_taken() -> None:
    engine = Engine(authorizer=FlakyPolicy(fail_at=0))
    client_id, _ = engine.connect(ConnectionInfo(client_id="c"), 0.0)
    for name in ("o", "p"):
        engine.create_channel(name)
        engine.create_queue(name, 0)
    targets = ["o", "p", "p"]  # a run into o, then one into p whose check raises
    messages = [
        Message(f"id{i}", client_id, t, 0, payload=b"m%d" % i) for i, t in enumerate(targets)
    ]
    out, taken, refused = engine.publish_many(client_id, messages, 0.0)
    assert (taken, refused) == (1, "internal error")
    assert engine.channels["o"].queues[0].message_count == 1
    assert engine.channels["p"].queues[0].message_count == 0
    assert engine.errors == 1
    assert out == []  # the refusal's response is the third item, not in the output


def test_a_persistent_run_stops_with_an_error_where_the_store_refused_a_message(
    full: Broker,
) -> None:
    producer = _raw(full)
    producer.send("".join(_send(i, persistent=True) for i in range(6)).encode())
    assert producer.closed_by_server()
    _assert_refused_at_r2(producer.frames, "not saved")
    # m2 stays queued in memory (no receipt: at least once); m3..m5 never went in
    assert _consumed(full, 3) == [b"m0", b"m1", b"m2"]
    assert wait_until(lambda: len(full.engine.store) == 0)  # (m0, m1 consumed: removed)


def test_a_lone_persistent_send_the_store_refused_gets_an_error(full: Broker) -> None:
    producer = _raw(full)
    answers = []
    for i in range(3):
        producer.send(_send(i, persistent=True).encode())
        answers.append(producer.next())
    _assert_refused_at_r2(answers, "not saved")
    assert producer.closed_by_server()


def test_a_composite_send_the_broker_failed_to_take_gets_an_error(flaky: Broker) -> None:
    """A composite destination goes through ``Engine.publish`` once per destination (not
    a run): a push that raised there is refused as well."""
    producer = _raw(flaky)
    burst = "".join(
        f"SEND\ndestination:/queue/x,/queue/p\nreceipt:r{i}\n\nm{i}\x00" for i in range(4)
    )
    producer.send(burst.encode())
    assert producer.closed_by_server()
    _assert_refused_at_r2(producer.frames)
    assert _consumed(flaky, 2) == [b"m0", b"m1"]
