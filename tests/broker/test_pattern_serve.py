"""TMQP pattern joins over real sockets: a Server on an engine, blocking and asyncio
clients (``Client.join_pattern``), and STOMP wildcards beside them on one engine."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator

import pytest
import zmq
import zmq.asyncio

from broker.cli import main
from broker.client.aio import AsyncClient
from broker.client.blocking import Client, Message, RemoteError
from broker.engine.engine import Engine
from broker.protocol import Header, ResultCode
from broker.server.server import Server, ServerOptions
from tests.broker.rebind import start_on_its_port
from tests.broker.test_aioclient import run
from tests.broker.test_cli import start_serve
from tests.broker.test_patterns import NoSecrets
from tests.polling import WAIT, wait_until
from tests.ports import free_port
from tests.stomp.two_doors import Broker as StompBroker
from tests.stomp.two_doors import Recorder
from zerohub.cli import ExitCode

Ctx = zmq.Context[zmq.Socket[bytes]]
MakeClient = Callable[..., Client]


def _take(client: Client, count: int) -> list[Message]:
    got: list[Message] = []
    while len(got) < count:
        message = client.receive(timeout=WAIT)
        assert message is not None, f"{len(got)} of {count} received"
        got.append(message)
    return got


def _members(server: Server | StompBroker, channel: str) -> int:
    engine = server.engine
    found = engine.channels.get(channel)
    return 0 if found is None else len(found.consumers)


def test_existing_and_new_channels_reach_a_pattern_join(
    make_client: MakeClient, server: Server
) -> None:
    consumer = make_client()
    producer = make_client()
    producer.create_queue("orders.eu", 1, {"Status": 1})
    producer.create_queue("stock.eu", 1, {"Status": 1})
    producer.push("orders.eu", 1, b"waiting before the join", ack=True)
    consumer.join_pattern("orders.*")
    assert _take(consumer, 1)[0].payload == b"waiting before the join"
    producer.push("orders.us", 1, b"a channel made by this push", ack=True)
    producer.push("stock.eu", 1, b"not matched", ack=True)
    producer.push("orders.eu.paris", 1, b"one segment too many", ack=True)
    producer.push("orders.eu", 1, b"marker", ack=True)
    got = [(m.channel, m.payload) for m in _take(consumer, 2)]
    assert got == [("orders.us", b"a channel made by this push"), ("orders.eu", b"marker")]


def test_double_star_and_regex_segments(make_client: MakeClient) -> None:
    consumer = make_client()
    producer = make_client()
    consumer.join_pattern("logs.**")
    consumer.join_pattern("item{[0-9]+}.new")
    for channel in ("logs", "logs.app", "logs.app.db.slow", "item7.new", "item42.new"):
        producer.push(channel, 1, channel.encode(), ack=True)
    for channel in ("logsx", "itemx.new", "item7.old"):
        producer.push(channel, 1, channel.encode(), ack=True)
    producer.push("logs", 1, b"marker", ack=True)
    got = [m.payload for m in _take(consumer, 6)]
    assert got == [
        b"logs",
        b"logs.app",
        b"logs.app.db.slow",
        b"item7.new",
        b"item42.new",
        b"marker",
    ]


def test_leave_pattern_stops_deliveries(make_client: MakeClient, server: Server) -> None:
    consumer = make_client()
    producer = make_client()
    consumer.join_pattern("feed.*", prefetch=5)
    producer.push("feed.a", 1, b"before", ack=True)
    assert _take(consumer, 1)[0].payload == b"before"
    consumer.leave_pattern("feed.*")
    assert _members(server, "feed.a") == 0
    producer.push("feed.a", 1, b"after, old channel", ack=True)
    producer.push("feed.b", 1, b"after, new channel", ack=True)
    consumer.join("marker")
    producer.push("marker", 1, b"marker", ack=True)
    assert _take(consumer, 1)[0].payload == b"marker"  # (nothing of feed.* before it)
    with pytest.raises(RemoteError) as info:
        consumer.leave_pattern("feed.*")
    assert info.value.code == ResultCode.NOT_FOUND


def test_garbage_patterns_are_refused_and_the_client_goes_on(make_client: MakeClient) -> None:
    consumer = make_client()
    too_many = "x." + "{a|b|c|d|e|f}"
    for bad in (
        "a..b",
        "{(a+)+$}",
        "x.{",
        "{" + "a" * 100 + "}",
        too_many,
        "**.{a{2}b{2}c{2}}",
        "a.}",
    ):
        with pytest.raises(RemoteError) as info:
            consumer.join_pattern(bad)
        assert info.value.code == ResultCode.BAD_REQUEST, bad
    consumer.join_pattern("fine.*")
    producer = make_client()
    producer.push("fine.1", 1, b"ok", ack=True)
    assert _take(consumer, 1)[0].payload == b"ok"


def test_a_push_to_a_pattern_is_refused(make_client: MakeClient, server: Server) -> None:
    producer = make_client()
    with pytest.raises(RemoteError, match="cannot name a pattern"):
        producer.push("orders.*", 1, b"x", headers={Header.PATTERN: "yes"}, ack=True)
    assert "orders.*" not in server.engine.channels
    for _ in range(3):  # (pushes that wait for nothing: refused one by one in a run)
        producer.push("orders.*", 1, b"x", headers={Header.PATTERN: "yes"})
    producer.push("orders.ok", 1, b"x", ack=True)  # after them, in order
    assert "orders.*" not in server.engine.channels


def test_more_pattern_joins_than_the_limit_get_482(make_client: MakeClient) -> None:
    consumer = make_client()
    for i in range(16):  # Limits.max_pattern_joins
        consumer.join_pattern(f"p{i}.*")
    with pytest.raises(RemoteError) as info:
        consumer.join_pattern("one.more.*")
    assert info.value.code == ResultCode.LIMIT_EXCEEDED


def test_a_pattern_matching_a_thousand_channels(make_client: MakeClient, server: Server) -> None:
    producer = make_client()
    for i in range(1000):
        producer.create_queue(f"wide.{i}", 1, {"Status": 1})
    consumer = make_client()
    consumer.join_pattern("wide.*")
    assert len(server.engine.clients[consumer.client_id or ""].channels) == 1000
    for i in range(0, 1000, 100):
        producer.push(f"wide.{i}", 1, str(i).encode())
    producer.push("wide.999", 1, b"999", ack=True)
    got = {m.payload for m in _take(consumer, 11)}
    assert got == {str(i).encode() for i in (*range(0, 1000, 100), 999)}
    consumer.leave_pattern("wide.*")
    assert server.engine.clients[consumer.client_id or ""].channels == {}


def test_a_pattern_never_delivers_a_channel_the_client_may_not_join(zctx: Ctx) -> None:
    engine = Engine(authorizer=NoSecrets())
    with Server(engine, ServerOptions(endpoint="tcp://127.0.0.1:*"), context=zctx) as srv:
        assert srv.endpoint is not None
        with (
            Client(srv.endpoint, context=zctx, timeout=WAIT) as consumer,
            Client(srv.endpoint, context=zctx, timeout=WAIT) as producer,
        ):
            producer.create_queue("secret.old", 1, {"Status": 1})
            consumer.join_pattern("*.*")
            for channel in ("secret.old", "secret.new", "public.new"):
                producer.push(channel, 1, channel.encode(), ack=True)
            producer.push("secret.old", 1, b"hidden", ack=True)
            producer.push("public.new", 1, b"marker", ack=True)
            assert [m.payload for m in _take(consumer, 2)] == [b"public.new", b"marker"]
            assert _members(srv, "secret.old") == 0 and _members(srv, "secret.new") == 0


def test_a_pattern_join_survives_a_reconnect(zctx: Ctx) -> None:
    """As plain joins: the broker restarts, the client joins its patterns again."""
    first = Server(Engine(), ServerOptions(endpoint="tcp://127.0.0.1:*"), context=zctx)
    endpoint = first.start()
    consumer = Client(
        endpoint, context=zctx, client_id="patient", backoff=(0.05, 0.2), ping_interval=0.3
    )
    consumer.connect()
    try:
        consumer.join_pattern("again.*")
        first.stop()
        second = Server(Engine(), ServerOptions(endpoint=endpoint), context=zctx)
        start_on_its_port(second)
        try:
            assert wait_until(lambda: consumer.connected, WAIT)
            with Client(endpoint, context=zctx, timeout=WAIT) as producer:
                patterns = second.engine.channel_registry.patterns
                assert wait_until(lambda: "again.*" in patterns.of("patient"))
                producer.push("again.x", 1, b"after restart", ack=True)
                message = consumer.receive(timeout=WAIT)
                assert message is not None and message.payload == b"after restart"
        finally:
            second.stop()
    finally:
        consumer.close()


def test_the_asyncio_client_joins_and_leaves_patterns(zctx: Ctx, server: Server) -> None:
    assert server.endpoint is not None

    async def main(ctx: zmq.asyncio.Context, ep: str) -> None:
        async with (
            AsyncClient(ep, context=ctx, timeout=WAIT) as consumer,
            AsyncClient(ep, context=ctx, timeout=WAIT) as producer,
        ):
            await consumer.join_pattern("aio.**")
            await producer.push("aio.a.b", 1, b"deep", ack=True)
            message = await consumer.receive(timeout=WAIT)
            assert message is not None and message.payload == b"deep"
            await consumer.leave_pattern("aio.**")
            await producer.push("aio.c", 1, b"after", ack=True)
            await consumer.join("marker")
            await producer.push("marker", 1, b"marker", ack=True)
            message = await consumer.receive(timeout=WAIT)
            assert message is not None and message.payload == b"marker"

    run(server.endpoint, main)


# -- STOMP wildcards and TMQP patterns on one engine ------------------------------------


@pytest.fixture
def both(zctx: Ctx) -> Iterator[StompBroker]:
    broker = StompBroker(zctx)
    yield broker
    broker.stop()


def test_stomp_wildcards_and_tmqp_patterns_share_the_channels(both: StompBroker) -> None:
    import stomp

    conn = stomp.Connection12([("127.0.0.1", both.listener.port)])
    rec = Recorder()
    conn.set_listener("rec", rec)
    conn.connect("user", "pw", wait=True)
    try:
        with (
            Client(both.endpoint, context=both.zctx, timeout=WAIT) as tmqp_consumer,
            Client(both.endpoint, context=both.zctx, timeout=WAIT) as producer,
        ):
            conn.subscribe("/topic/prices.*", id="w")
            tmqp_consumer.join_pattern("/topic/prices.*")
            conn.send("/topic/prices.eu", "from stomp", receipt="r1")
            assert wait_until(lambda: rec.receipts == ["r1"])
            producer.push("/topic/prices.us", 0, b"from tmqp", ack=True)
            assert wait_until(lambda: sorted(rec.bodies()) == ["from stomp", "from tmqp"])
            got = sorted(m.payload for m in _take(tmqp_consumer, 2))
            assert got == [b"from stomp", b"from tmqp"]
            destinations = {m.headers["destination"] for m in rec.messages}
            assert destinations == {"/topic/prices.eu", "/topic/prices.us"}
            assert rec.errors == []
    finally:
        conn.disconnect()


# -- the command line ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served_endpoint() -> Iterator[str]:
    port = free_port()
    proc = start_serve("--bind", f"tcp://127.0.0.1:{port}")
    yield f"tcp://127.0.0.1:{port}"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0


def test_broker_consume_pattern(served_endpoint: str, capsys: pytest.CaptureFixture[str]) -> None:
    c = ("--connect", served_endpoint)
    for channel in ("cli.a", "cli.b.c", "other.a"):
        assert main(["admin", *c, "create", channel, "1", "--options", '{"Status": 1}']) == 0
        assert main(["push", *c, channel, "1", channel, "--ack"]) == 0
    capsys.readouterr()
    code = main(["consume", *c, "cli.**", "--pattern", "--count", "2", "--wait", "5"])
    out, err = capsys.readouterr()
    assert code == 0 and sorted(out.split()) == ["cli.a", "cli.b.c"]
    code = main(["consume", *c, "cli.{(a+)+}", "--pattern", "--count", "1", "--wait", "1"])
    out, err = capsys.readouterr()
    assert code == ExitCode.FAILURE and out == ""
    assert len(err.strip().splitlines()) == 1 and "repeated group" in err
