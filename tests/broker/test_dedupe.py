"""Duplicate suppression by message id (UseMessageId, DuplicateWindow/DuplicateWindowTime):
a producer retrying after a lost acknowledge makes no duplicate; against live brokers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

from broker.client.blocking import Client, RemoteError
from broker.engine.engine import Engine
from broker.protocol import ResultCode
from broker.server.server import Server, ServerOptions
from tests.broker.test_durable_serve import Broker
from tests.polling import WAIT, wait_until

Ctx = zmq.Context[zmq.Socket[bytes]]
MakeClient = Callable[..., Client]
PULL = {"Status": "Pull"}


@pytest.fixture
def make_client(zctx: Ctx) -> Iterator[MakeClient]:
    made: list[Client] = []
    with Server(Engine(), ServerOptions(endpoint="tcp://127.0.0.1:*"), context=zctx) as srv:
        assert srv.endpoint is not None
        endpoint = srv.endpoint

        def make(**kw: Any) -> Client:
            kw.setdefault("timeout", 10.0)
            client = Client(endpoint, context=zctx, **kw).connect()
            made.append(client)
            return client

        yield make
        for client in made:
            client.close()


def held(c: Client, channel: str, queue: int) -> list[bytes]:
    return [bytes(b.message.payload) for b in c.browse(channel, queue, 0)]


def test_a_retried_acknowledged_push_is_acknowledged_and_kept_once(
    make_client: MakeClient,
) -> None:
    c = make_client()
    c.create_queue("orders", 1, PULL)
    assert c.push("orders", 1, "first", ack=True, message_id="order-42") == "order-42"
    # the retry: same id (the payload does not matter), acknowledged as a success
    assert c.push("orders", 1, "retry", ack=True, message_id="order-42") == "order-42"
    c.push("orders", 1, "other", ack=True, message_id="order-43")
    assert held(c, "orders", 1) == [b"first", b"other"]
    assert c.queue_bounds("orders", 1).last == 2  # the duplicate took no number
    assert c.queue_info("orders", 1)["DuplicateMessages"] == 1


def test_a_repeated_id_without_ack_is_dropped_too(make_client: MakeClient) -> None:
    producer, consumer = make_client(), make_client()
    producer.create_queue("feed", 1, {"Status": "Push"})
    consumer.join("feed")
    for payload in ("a", "again", "b", "end"):
        producer.push("feed", 1, payload, message_id="a" if payload == "again" else payload)
    got = []  # (up to "end", pushed last: a queue delivers in order, no quiet spell waited for)
    while (m := consumer.receive(timeout=WAIT)) is not None and bytes(m.payload) != b"end":
        got.append(bytes(m.payload))
    assert m is not None, got
    assert got == [b"a", b"b"]


def test_use_message_id_off_keeps_every_push(make_client: MakeClient) -> None:
    c = make_client()
    c.create_queue("raw", 1, {**PULL, "UseMessageId": False})
    for _ in range(3):
        c.push("raw", 1, "same", ack=True, message_id="x")
    assert held(c, "raw", 1) == [b"same"] * 3


def test_the_window_keeps_the_latest_ids_only(make_client: MakeClient) -> None:
    c = make_client()
    c.create_queue("w", 1, {**PULL, "DuplicateWindow": 2})
    for mid in ("a", "b", "c", "a", "c"):  # "a" was pushed out by b and c; "c" was not
        c.push("w", 1, mid, ack=True, message_id=mid)
    assert held(c, "w", 1) == [b"a", b"b", b"c", b"a"]


def test_an_id_is_forgotten_after_the_window_time(make_client: MakeClient) -> None:
    c = make_client()
    c.create_queue("t", 1, {**PULL, "DuplicateWindowTime": 50})
    c.push("t", 1, "one", ack=True, message_id="same")

    def taken_again() -> bool:
        c.push("t", 1, "later", ack=True, message_id="same")
        return len(held(c, "t", 1)) == 2

    assert wait_until(taken_again)


def test_a_refused_push_is_not_remembered(make_client: MakeClient) -> None:
    """A retry of a push the queue refused (full) must be taken once there is room."""
    c = make_client()
    c.create_queue("small", 1, {**PULL, "MessageLimit": 1, "AllowRelease": True})
    c.push("small", 1, "one", ack=True, message_id="one")
    with pytest.raises(RemoteError) as err:
        c.push("small", 1, "two", ack=True, message_id="two")
    assert err.value.code == ResultCode.LIMIT_EXCEEDED
    assert c.release("small", 1, 1) == 1
    c.push("small", 1, "two", ack=True, message_id="two")
    assert held(c, "small", 1) == [b"two"]


def test_duplicates_are_suppressed_across_kill_9(served: Broker, zctx: Ctx) -> None:
    options = {"Status": "Pull", "MessageDeliveryHandler": "persistent", "Retain": True}
    with Client(served.endpoint, context=zctx, timeout=10) as c:
        c.create_queue("idem", 1, options)
        for i in range(5):
            c.push("idem", 1, f"row{i}", ack=True, message_id=f"batch-1/row-{i}")
        c.join("idem")
        assert len(c.pull("idem", 1, count=2)) == 2  # consumed, retained (readable)
        c.create_channel("barrier")  # durable before its ack: so is what came before
    served.kill()  # the producer never heard some acks: it retries them all
    served.start()
    with Client(served.endpoint, context=zctx, timeout=10) as c:
        for i in range(6):
            c.push("idem", 1, f"row{i}", ack=True, message_id=f"batch-1/row-{i}")
        got = c.browse("idem", 1, 0)
        assert [(b.sequence, bytes(b.message.payload)) for b in got] == [
            (i + 1, f"row{i}".encode()) for i in range(6)
        ]
