"""``ack:auto`` on the broker engine: the engine acknowledges a delivery once the
listener reports it taken (``Engine.acknowledge_taken``), with no acknowledge per
delivery from the listener.  What a client and a waiting producer see must not change:
real listener, real engine, real sockets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from broker.client.blocking import Client
from broker.stomp.engine_mapping import QUEUE_ID
from tests.polling import wait_until
from tests.stomp.two_doors import (
    Broker,
    Recorder,
    subscribed,
)

StompClient = Callable[[], tuple[Any, Recorder]]


@pytest.mark.parametrize("ack", ["auto", "client-individual"])
def test_a_tmqp_batch_of_pushes_reaches_a_stomp_consumer(
    broker: Broker,
    tmqp: Callable[[], Client],
    stomp_client: StompClient,
    ack: str,
) -> None:
    """Regression: pushes a TMQP client sends in one batch (``push_async`` in a burst:
    ``broker.batch``) were handed to the engine past the STOMP door
    (``Engine.receive_batch`` unwrapped), so their deliveries to a STOMP consumer were
    routed as TMQP output and dropped: never delivered, in flight for good (a STOMP
    queue has no acknowledge timeout), the producers never answered."""
    conn, rec = stomp_client()
    conn.subscribe("/queue/burst", id="s", ack=ack)
    assert wait_until(lambda: subscribed(broker, "burst", 1))
    producer = tmqp()
    waiting = [producer.push_async("burst", QUEUE_ID, b"m%d" % i) for i in range(50)]
    assert wait_until(lambda: len(rec.messages) == 50)
    assert rec.bodies() == [f"m{i}" for i in range(50)]
    if ack != "auto":
        for frame in rec.messages:
            conn.ack(frame.headers["ack"])
    for answer in waiting:
        answer.result(10)  # acknowledged (a negative one raises)


@pytest.mark.parametrize("ack", ["auto", "client-individual"])
def test_single_tmqp_pushes_served_as_a_drain_run_reach_a_stomp_consumer(
    broker: Broker,
    stomp_client: StompClient,
    ack: str,
) -> None:
    """As above for pushes a TMQP client sends each alone (``batch=0``): the server hands
    the ones it reads in one drain to the engine as a run (``Engine.receive_pushes``), which
    must pass the STOMP door as ``receive_batch`` does, or the deliveries to a STOMP
    consumer are routed as TMQP output and dropped."""
    conn, rec = stomp_client()
    conn.subscribe("/queue/singles", id="s", ack=ack)
    assert wait_until(lambda: subscribed(broker, "singles", 1))
    producer = Client(broker.endpoint, context=broker.zctx, timeout=10.0, batch=0).connect()
    try:
        waiting = [producer.push_async("singles", QUEUE_ID, b"m%d" % i) for i in range(200)]
        assert wait_until(lambda: len(rec.messages) == 200)
        assert rec.bodies() == [f"m{i}" for i in range(200)]
        if ack != "auto":
            for frame in rec.messages:
                conn.ack(frame.headers["ack"])
        for answer in waiting:
            answer.result(10)  # acknowledged (a negative one raises)
    finally:
        producer.close()
    assert broker.server.counters["run_pushes"] > 1  # (runs were served, not only singles)


def test_an_auto_ack_delivery_answers_a_tmqp_producer_waiting_for_its_acknowledge(
    broker: Broker,
    tmqp: Callable[[], Client],
    stomp_client: StompClient,
) -> None:
    """The queue requests acknowledges: a producer that waits hears of the consumer's
    acknowledge -- for an auto-ack STOMP consumer, once its connection took the
    message; it is consumed for good (a later consumer gets only what came after)."""
    conn, rec = stomp_client()
    conn.subscribe("/queue/relay", id="s", ack="auto")
    assert wait_until(lambda: subscribed(broker, "relay", 1))
    producer = tmqp()
    waiting = [producer.push_async("relay", QUEUE_ID, b"m%d" % i) for i in range(20)]
    for answer in waiting:
        answer.result(10)  # acknowledged (a negative one raises)
    assert wait_until(lambda: len(rec.messages) == 20)
    assert rec.bodies() == [f"m{i}" for i in range(20)]
    conn.disconnect()
    later, rec2 = stomp_client()
    later.subscribe("/queue/relay", id="s2", ack="auto")
    assert wait_until(lambda: subscribed(broker, "relay", 1))
    producer.push("relay", QUEUE_ID, b"marker")
    assert wait_until(lambda: rec2.bodies() == ["marker"])


def test_an_auto_and_a_client_subscription_sharing_a_queue_keep_their_own_modes(
    broker: Broker,
    tmqp: Callable[[], Client],
    stomp_client: StompClient,
) -> None:
    """Two subscriptions of one connection on one queue share its engine consumer and
    take turns: the auto one's deliveries are settled, the client-individual one's wait
    for an ACK -- and come back to the next consumer when the connection ends without
    one.  (The engine must not acknowledge the shared consumer's deliveries by itself.)"""
    conn, rec = stomp_client()
    conn.subscribe("/queue/both", id="auto", ack="auto")
    assert wait_until(lambda: subscribed(broker, "both", 1))
    conn.subscribe("/queue/both", id="mine", ack="client-individual", receipt="joined")
    assert wait_until(lambda: rec.receipts == ["joined"])
    producer = tmqp()
    for i in range(6):
        producer.push("both", QUEUE_ID, b"m%d" % i)
    assert wait_until(lambda: len(rec.messages) == 6)
    by_sub: dict[str, list[str]] = {"auto": [], "mine": []}
    for frame in rec.messages:
        by_sub[frame.headers["subscription"]].append(frame.body)
    assert len(by_sub["auto"]) == 3 and len(by_sub["mine"]) == 3
    conn.disconnect()  # nothing ACKed: the client-individual deliveries go back
    other, rec2 = stomp_client()
    other.subscribe("/queue/both", id="s", ack="auto")
    assert wait_until(lambda: sorted(rec2.bodies()) == sorted(by_sub["mine"]))
    producer.push("both", QUEUE_ID, b"marker")  # and the auto ones never come back
    assert wait_until(lambda: rec2.bodies()[-1:] == ["marker"])
    assert sorted(rec2.bodies()[:-1]) == sorted(by_sub["mine"])
