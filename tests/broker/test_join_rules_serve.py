"""TMQP clients' selectors, credit and retained messages on a real server with a STOMP
listener on the same engine, over loopback (``broker.engine.join_rules``,
``broker.engine.retain``); the sans-IO rules: ``test_engine_join_rules.py``."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
import zmq
import zmq.asyncio

from broker.client.aio import AsyncClient
from broker.client.blocking import Client, RemoteError
from broker.engine.delivery import PerMessageDeliveryHandler
from broker.engine.engine import Engine
from broker.engine.options import ChannelQueueOptions
from broker.engine.per_message import PER_MESSAGE
from broker.protocol import Header, QueueStatus
from broker.server.server import Server, ServerOptions
from tests.broker.rebind import start_on_its_port
from tests.polling import WAIT, wait_until
from tests.stomp.two_doors import Broker, subscribed
from zproto.errors import EncodeError

Ctx = zmq.Context[zmq.Socket[bytes]]


def receive_all(client: Client, count: int) -> list[Any]:
    """``count`` messages, each waited for to a generous deadline."""
    got = []
    for _ in range(count):
        message = client.receive(timeout=10)
        assert message is not None, f"only {len(got)} of {count}"
        got.append(message)
    return got


def ruled_channel(client: Client, name: str) -> None:
    """A round-robin queue 0 with acknowledges and the per-message handler."""
    client.create_queue(
        name,
        0,
        {
            "Status": 2,
            "RequestAcknowledge": True,
            "MessageDeliveryHandler": "per-message",
        },
    )


# -- selectors ------------------------------------------------------------------------------


def test_a_tmqp_selector_picks_stomp_sends_by_their_headers(
    broker: Broker, tmqp: Callable[[], Client], stomp_client: Any
) -> None:
    conn, rec = stomp_client()
    conn.send("/queue/orders", "first", headers={"region": "us"}, receipt="r0")
    assert wait_until(lambda: rec.receipts == ["r0"])  # the queue exists, per-message
    eu, anyone = tmqp(), tmqp()
    eu.join("orders", selector="region = 'eu' AND priority > 5")
    anyone.join("orders")
    for i, (region, priority) in enumerate([("eu", 9), ("us", 9), ("eu", 1), ("eu", 7)]):
        headers = {"region": region, "priority": str(priority)}
        conn.send("/queue/orders", f"{region}{priority}", headers=headers, receipt=f"r{i + 1}")
    assert wait_until(lambda: len(rec.receipts) == 5)
    picked = receive_all(eu, 2)
    assert [m.payload for m in picked] == [b"eu9", b"eu7"]
    assert [m.payload for m in receive_all(anyone, 3)] == [b"first", b"us9", b"eu1"]
    for m in picked:
        eu.ack(m)
    assert eu.receive(timeout=0.2) is None and rec.errors == []


def test_a_tmqp_selector_filters_its_copies_of_a_broadcast_channel(
    broker: Broker, tmqp: Callable[[], Client]
) -> None:
    admin = tmqp()
    admin.create_queue("ticks", 0, {"Status": 0, "MessageDeliveryHandler": "per-message"})
    picky, everyone = tmqp(), tmqp()
    picky.join("ticks", selector="symbol IN ('IBM', 'ACME')")
    everyone.join("ticks")
    for symbol in ("IBM", "XYZ", "ACME"):
        admin.push("ticks", 0, symbol.encode(), headers=(("symbol", symbol),))
    assert [m.payload for m in receive_all(everyone, 3)] == [b"IBM", b"XYZ", b"ACME"]
    assert [m.payload for m in receive_all(picky, 2)] == [b"IBM", b"ACME"]


@pytest.mark.parametrize(
    ("selector", "reason"),
    [
        ("region = = 'eu'", "selector: unexpected"),
        ("(" * 200 + "a = 1" + ")" * 200, "nested deeper than 64 levels"),
        ("a = '" + "x" * 60 * 1024 + "'", "longer than 4096"),
        ("\x00\x01 garbage ~~~", "selector: unexpected"),
    ],
)
def test_a_bad_selector_is_refused_with_the_parsers_reason_and_nothing_joined(
    broker: Broker, tmqp: Callable[[], Client], selector: str, reason: str
) -> None:
    client = tmqp()
    ruled_channel(client, "jobs")
    with pytest.raises(RemoteError, match=reason) as refused:
        client.join("jobs", selector=selector)
    assert refused.value.code == 400
    assert not subscribed(broker, "jobs", 1)
    client.join("jobs", selector="kind = 'a'")  # the connection keeps serving
    client.push("jobs", 0, b"a", headers=(("kind", "a"),))
    assert [m.payload for m in receive_all(client, 1)] == [b"a"]


def test_a_like_pattern_built_to_backtrack_does_not_stall_the_broker(
    broker: Broker, tmqp: Callable[[], Client]
) -> None:
    """Session 16's LIKE was a backtracking regex: this selector against this header
    froze the engine thread (every client of the broker) for good; now one scan per
    segment (``tests/broker/test_selector_like.py``)."""
    producer, picky, other = tmqp(), tmqp(), tmqp()
    ruled_channel(producer, "jobs")
    picky.join("jobs", selector="v LIKE '" + "%a" * 30 + "%b'")
    other.join("jobs")
    producer.push("jobs", 0, b"bait", headers=(("v", "a" * 50_000 + "c"),))
    producer.push("jobs", 0, b"hit", headers=(("v", "a" * 40 + "b"),))
    assert [m.payload for m in receive_all(picky, 1)] == [b"hit"]
    assert [m.payload for m in receive_all(other, 1)] == [b"bait"]


def test_a_100_kib_selector_cannot_leave_the_client_and_the_client_goes_on(
    broker: Broker, tmqp: Callable[[], Client]
) -> None:
    client = tmqp()
    ruled_channel(client, "jobs")
    with pytest.raises(EncodeError):  # a TMQP header block holds 64 KiB at most
        client.join("jobs", selector="a = '" + "x" * 100 * 1024 + "'")
    assert not subscribed(broker, "jobs", 1)
    client.join("jobs")
    assert subscribed(broker, "jobs", 1)


def test_a_selector_where_no_queue_applies_it_is_refused(
    broker: Broker, tmqp: Callable[[], Client]
) -> None:
    client = tmqp()
    client.create_queue("plain", 0, {"Status": 2})
    with pytest.raises(RemoteError, match="per-message") as refused:
        client.join("plain", selector="a = 1")
    assert refused.value.code == 406 and not subscribed(broker, "plain", 1)


def test_the_async_client_joins_with_a_selector_and_credit(
    broker: Broker, tmqp: Callable[[], Client]
) -> None:
    producer = tmqp()
    ruled_channel(producer, "async-jobs")

    async def consume() -> list[bytes]:
        async with AsyncClient(broker.endpoint, context=actx, timeout=10.0) as client:
            await client.join("async-jobs", selector="kind = 'b'", credit=(1, 0))
            for kind in "abab":
                await client.push("async-jobs", 0, kind.encode(), headers=(("kind", kind),))
            first = await client.receive(timeout=10)
            assert first is not None
            assert await client.receive(timeout=0.3) is None  # credit 1: the next waits
            await client.ack(first)
            second = await client.receive(timeout=10)
            assert second is not None
            await client.ack(second)
            return [first.payload, second.payload]

    actx = zmq.asyncio.Context()
    try:
        assert asyncio.run(consume()) == [b"b", b"b"]
    finally:
        actx.term()


# -- credit ---------------------------------------------------------------------------------


def test_a_consumer_that_never_acks_holds_at_most_its_credit_while_another_is_served(
    broker: Broker, tmqp: Callable[[], Client]
) -> None:
    producer, hoarder, worker = tmqp(), tmqp(), tmqp()
    ruled_channel(producer, "work")
    hoarder.join("work", credit=(3, 0))
    worker.join("work")
    for i in range(40):
        producer.push("work", 0, b"%d" % i)
    held = receive_all(hoarder, 3)
    done = []
    while len(done) < 37:
        message = worker.receive(timeout=10)
        assert message is not None, f"the worker got {len(done)} of 37"
        worker.ack(message)
        done.append(message)
    assert hoarder.receive(timeout=0.3) is None  # never acked: still three
    assert len({m.payload for m in held + done}) == 40
    channel = broker.engine.channels["work"]
    assert channel.queues[0].information(0, 0)["Messages"] == 0


@pytest.mark.parametrize("credit", [(0, 0), (-1, 5), (True, 1), (1.5, 1)])
def test_nonsense_credit_is_a_clear_error_before_anything_is_sent(
    broker: Broker, tmqp: Callable[[], Client], credit: Any
) -> None:
    client = tmqp()
    ruled_channel(client, "jobs")
    with pytest.raises(ValueError, match="credit"):
        client.join("jobs", credit=credit)
    assert not subscribed(broker, "jobs", 1)


def test_credit_beyond_the_brokers_numbers_is_refused_by_it(
    broker: Broker, tmqp: Callable[[], Client]
) -> None:
    client = tmqp()
    ruled_channel(client, "jobs")
    with pytest.raises(RemoteError, match="Credit") as refused:
        client.join("jobs", credit=(2**64, 1))
    assert refused.value.code == 400 and not subscribed(broker, "jobs", 1)
    client.join("jobs", credit=(2**63 - 1, 2**63 - 1))  # the largest: accepted, bounded
    assert broker.engine.clients[client.client_id or ""].prefetch["jobs"] == (
        broker.engine.config.max_prefetch
    )


# -- retained messages ------------------------------------------------------------------------


def test_a_tmqp_retained_push_is_seen_first_by_a_later_stomp_subscriber(
    broker: Broker, tmqp: Callable[[], Client], stomp_client: Any
) -> None:
    first, rec_first = stomp_client()
    first.subscribe("/topic/prices", id="s")  # makes the broadcast channel
    assert wait_until(lambda: subscribed(broker, "/topic/prices", 1))
    producer = tmqp()
    for i in range(50):  # replaced each time: one kept
        producer.push("/topic/prices", 0, b"%d" % i, headers=((Header.RETAIN, "set"),))
    assert wait_until(lambda: len(rec_first.bodies()) == 50)
    late, rec_late = stomp_client()
    late.subscribe("/topic/prices", id="t")
    assert wait_until(lambda: rec_late.bodies() == ["49"])
    producer.push("/topic/prices", 0, b"live")
    assert wait_until(lambda: rec_late.bodies() == ["49", "live"])
    assert len(broker.engine.channel_registry.retained) == 1


def test_a_stomp_retained_send_is_seen_first_by_a_later_tmqp_joiner(
    broker: Broker, tmqp: Callable[[], Client], stomp_client: Any
) -> None:
    conn, rec = stomp_client()
    conn.send("/topic/news", "old", headers={"retain": "set"}, receipt="a")
    conn.send("/topic/news", "newest", headers={"retain": "set"}, receipt="b")
    assert wait_until(lambda: rec.receipts == ["a", "b"])
    joiner = tmqp()
    joiner.join("/topic/news")
    (kept,) = receive_all(joiner, 1)
    assert kept.payload == b"newest" and ("retain", "set") in kept.headers
    conn.send("/topic/news", "", headers={"retain": "remove"}, receipt="c")
    assert wait_until(lambda: rec.receipts == ["a", "b", "c"])
    assert [m.payload for m in receive_all(joiner, 1)] == [b""]  # the remove's own copy
    other = tmqp()
    other.join("/topic/news")
    assert other.receive(timeout=0.3) is None


def test_retain_on_a_queue_that_is_not_broadcast_is_refused_through_either_door(
    broker: Broker, tmqp: Callable[[], Client], stomp_client: Any
) -> None:
    producer = tmqp()
    ruled_channel(producer, "jobs")
    with pytest.raises(RemoteError, match="Retain only on a Broadcast queue"):
        producer.push("jobs", 0, b"x", ack=True, headers=((Header.RETAIN, "set"),))
    conn, rec = stomp_client()
    conn.send("/queue/jobs", "y", headers={"retain": "set"}, receipt="r")
    assert wait_until(lambda: len(rec.errors) == 1)
    assert "Retain only on a Broadcast queue" in rec.errors[0].headers["message"]
    assert len(broker.engine.channel_registry.retained) == 0


# -- the command line ---------------------------------------------------------------------------


def test_broker_consume_selects_and_a_bad_selector_is_one_line_exit_2(
    broker: Broker, tmqp: Callable[[], Client]
) -> None:
    producer = tmqp()
    ruled_channel(producer, "cli-sel")
    for region in ("us", "eu", "us"):
        producer.push("cli-sel", 0, region.encode(), headers=(("region", region),))
    command = [sys.executable, "-m", "broker", "consume", "--connect", broker.endpoint]
    done = subprocess.run(
        [*command, "cli-sel", "--selector", "region = 'eu'", "--count", "1"],
        capture_output=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, b"eu\n", b"")
    for bad in ("region = = 'eu'", "(" * 100 + "a=1" + ")" * 100):
        done = subprocess.run(
            [*command, "cli-sel", "--selector", bad], capture_output=True, timeout=120
        )
        lines = done.stderr.decode().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and "--selector" in lines[0], lines


def test_a_client_with_a_selector_gets_no_fanout_grant_and_only_its_copies(zctx: Ctx) -> None:
    """On a broker serving broadcast fan-out (``broker.engine.fanout``) a client asks for
    the grant on every JOIN; with a selector it is refused the grant (its copies are
    chosen one by one), the member beside it reads the fan-out socket."""
    handler = PerMessageDeliveryHandler(time.time)
    options = ServerOptions(endpoint="tcp://127.0.0.1:*", fanout="tcp://127.0.0.1:*")
    with Server(Engine(handlers={PER_MESSAGE: handler}), options, context=zctx) as server:
        assert server.endpoint is not None
        made = [Client(server.endpoint, context=zctx, timeout=10.0).connect() for _ in "abc"]
        producer, picky, member = made
        try:
            producer.create_queue("fan", 0, {"Status": 0, "MessageDeliveryHandler": PER_MESSAGE})
            picky.join("fan", selector="n > 7")
            member.join("fan")
            for n in range(10):
                producer.push("fan", 0, b"%d" % n, headers=(("n", str(n)),))
            assert [int(m.payload) for m in receive_all(member, 10)] == list(range(10))
            assert [int(m.payload) for m in receive_all(picky, 2)] == [8, 9]
            assert server.counters["fanout_subscribed"] == 1  # the member alone
        finally:
            for client in made:
                client.close()


def _ruled_engine() -> tuple[Engine, PerMessageDeliveryHandler]:
    """An engine holding channel ``kept``: a round-robin queue 0 with acknowledges and
    the per-message handler (what a durable broker would have recovered)."""
    handler = PerMessageDeliveryHandler(time.time)
    engine = Engine(handlers={PER_MESSAGE: handler})
    engine.create_channel("kept")
    options = ChannelQueueOptions(
        status=QueueStatus.ROUND_ROBIN,
        request_acknowledge=True,
        message_delivery_handler=PER_MESSAGE,
    )
    engine.create_queue("kept", 0, options)
    return engine, handler


def test_a_selector_and_credit_join_survives_a_broker_restart(zctx: Ctx) -> None:
    """The other side restarts: the client joins again on its new session with the same
    selector and credit (``ClientSession`` re-sends every JOIN with what it asked), so
    the new broker filters and counts as the old one did -- a rejoin without its rules
    would hand this consumer every message."""
    engine, _handler = _ruled_engine()
    first = Server(engine, ServerOptions(endpoint="tcp://127.0.0.1:*"), context=zctx)
    endpoint = first.start()
    consumer = Client(
        endpoint, context=zctx, client_id="picky", backoff=(0.05, 0.2), ping_interval=0.3
    )
    consumer.connect()
    try:
        consumer.join("kept", selector="n > 4", credit=(2, 1 << 20))
        first.stop()
        engine, handler = _ruled_engine()
        second = Server(engine, ServerOptions(endpoint=endpoint), context=zctx)
        start_on_its_port(second)
        try:
            assert wait_until(lambda: consumer.connected, WAIT)
            rules = handler.rules
            assert wait_until(lambda: ("kept", "picky") in rules._credits, WAIT)
            assert "picky" in rules._selectors.get("kept", {})
            with Client(endpoint, context=zctx, timeout=WAIT) as producer:
                for n in range(10):
                    producer.push("kept", 0, b"%d" % n, headers=(("n", str(n)),))
                got = []
                for _ in range(5):
                    message = consumer.receive(timeout=WAIT)
                    assert message is not None, got
                    got.append(int(message.payload))
                    consumer.ack(message)
                assert got == [5, 6, 7, 8, 9]
        finally:
            second.stop()
    finally:
        consumer.close()
