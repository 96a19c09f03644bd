"""broker.Client against a live Server + Engine: one end-to-end test per client feature."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import zmq

from broker.client.blocking import Client, ConnectError, Kind, Message, RemoteError
from broker.engine.auth import ALL_ACTIONS, TokenAuthorizer
from broker.engine.engine import Engine
from broker.protocol import EventName, ResultCode
from broker.server.server import Server, ServerOptions
from tests.broker.rebind import start_on_its_port
from tests.polling import WAIT, wait_until

Ctx = zmq.Context[zmq.Socket[bytes]]
MakeClient = Callable[..., Client]


@pytest.mark.parametrize("threaded", [True, False], ids=["threaded", "poll-on-call"])
def test_push_and_consume_on_a_push_queue(make_client: MakeClient, threaded: bool) -> None:
    consumer = make_client(threaded=threaded)
    producer = make_client(threaded=threaded)
    consumer.create_queue("orders", 1, {"Status": 1})
    consumer.join("orders")
    for i in range(500):
        producer.push("orders", 1, f"order {i}")
    producer.push("orders", 1, b"last", ack=True)
    got = []
    for message in consumer.consume(timeout=WAIT):
        got.append(message)
        if len(got) == 501:
            break
    assert [m.payload for m in got[:3]] == [b"order 0", b"order 1", b"order 2"]
    assert got[-1].payload == b"last"
    first = got[0]
    assert first.kind is Kind.QUEUE and first.channel == "orders" and first.queue_id == 1
    assert first.source == producer.client_id


def test_push_with_headers_and_priority(make_client: MakeClient) -> None:
    consumer = make_client()
    consumer.join("hdr")
    producer = make_client()
    producer.push("hdr", 2, b"h", headers={"Trace": "t-1"}, high_priority=True, ack=True)
    message = consumer.receive(timeout=WAIT)
    assert message is not None and message.header("trace") == "t-1"
    assert message.frame.high_priority


def test_push_ack_round_trip_and_nack(make_client: MakeClient) -> None:
    client = make_client()
    client.create_queue("acked", 1, {"Status": 3})
    mid = client.push("acked", 1, b"one", ack=True)
    assert mid
    futures = [client.push_async("acked", 1, f"m{i}") for i in range(50)]
    assert all(f.result(WAIT) is not None for f in futures)
    client.update_queue("acked", 1, {"Status": 6})  # stopped: pushes are refused
    with pytest.raises(RemoteError) as info:
        client.push("acked", 1, b"refused", ack=True)
    assert info.value.code != ResultCode.OK


def test_consumer_ack_reaches_the_queue(make_client: MakeClient) -> None:
    consumer = make_client()
    producer = make_client()
    consumer.create_queue("work", 1, {"Status": 1, "RequestAcknowledge": True})
    consumer.join("work")
    producer.push("work", 1, b"job-1")
    producer.push("work", 1, b"job-2")
    first, second = consumer.receive(timeout=WAIT), consumer.receive(timeout=WAIT)
    assert first is not None and second is not None and first.needs_ack
    consumer.ack(first)
    consumer.nack(second, "cannot")
    assert wait_until(lambda: consumer.queue_info("work", 1)["Acks"] == 1)
    assert consumer.queue_info("work", 1)["NegativeAcks"] == 1


def test_pull_queue(make_client: MakeClient) -> None:
    client = make_client()
    client.create_queue("jobs", 7, {"Status": 3})
    client.join("jobs")  # pulling is for the channel's consumers
    for i in range(3):
        client.push("jobs", 7, f"job {i}", ack=True)
    first = client.pull("jobs", 7, count=2)
    assert [m.payload for m in first] == [b"job 0", b"job 1"]
    assert first[0].header("Request-Id") and first[1].header("Index") == "2"
    assert [m.payload for m in client.pull("jobs", 7, count=5)] == [b"job 2"]
    assert client.pull("jobs", 7) == []
    with pytest.raises(RemoteError):
        client.pull("no-such-channel", 7, timeout=WAIT)


@pytest.mark.parametrize("threaded", [True, False], ids=["threaded", "poll-on-call"])
def test_direct_request_and_response(make_client: MakeClient, threaded: bool) -> None:
    server_side = make_client(name="calc", threaded=True)

    def answer(message: Message) -> None:
        if message.kind is Kind.DIRECT and message.needs_response:
            server_side.respond(message, message.payload.upper())

    server_side.on_message(answer)
    requester = make_client(threaded=threaded)
    assert server_side.client_id is not None
    reply = requester.request(server_side.client_id, b"hello", content_type=42)
    assert reply.payload == b"HELLO" and reply.source == server_side.client_id
    assert requester.request("@name:calc", "by name").payload == b"BY NAME"
    futures = [requester.request_async("@name:calc", f"r{i}") for i in range(20)]
    assert [f.result(WAIT).payload for f in futures] == [f"R{i}".encode() for i in range(20)]
    with pytest.raises(RemoteError):
        requester.request("@name:nobody", b"?", timeout=WAIT)


def test_fire_and_forget_direct_message(make_client: MakeClient) -> None:
    receiver = make_client(client_type="worker")
    sender = make_client()
    sender.send("@type:worker", b"note", content_type=5)
    message = receiver.receive(timeout=WAIT)
    assert message is not None and message.kind is Kind.DIRECT
    assert (message.payload, message.content_type) == (b"note", 5)


def test_admin_operations(make_client: MakeClient) -> None:
    admin = make_client(name="admin")
    admin.create_channel("billing", {"ClientLimit": 5})
    with pytest.raises(RemoteError) as info:
        admin.create_channel("billing")
    assert info.value.code == ResultCode.ALREADY_CREATED
    admin.create_queue("billing", 3, {"Status": 3})
    assert any(c["Name"] == "billing" for c in admin.channels())
    assert admin.channel_info("billing")["ClientLimit"] == 5
    queues = admin.queues("billing")
    assert [q["Id"] for q in queues] == [3]
    assert admin.queue_info("billing", 3)["Status"] == "Pull"
    admin.delete_queue("billing", 3)
    with pytest.raises(RemoteError) as info:
        admin.queue_info("billing", 3)
    assert info.value.code == ResultCode.NOT_FOUND
    assert any(c["Name"] == "admin" for c in admin.clients())
    admin.delete_channel("billing")
    assert not any(c["Name"] == "billing" for c in admin.channels())
    stats = admin.stats()
    assert stats["server"]["bad_frames"] == 0 and stats["engine"]["clients"] == 1


def test_events_by_callback_and_inbox(make_client: MakeClient) -> None:
    watcher = make_client()
    joined: list[Message] = []
    watcher.subscribe(EventName.CLIENT_JOINED, joined.append, channel="news")
    watcher.subscribe(EventName.MESSAGE_PRODUCED, channel="news", queue_id=1)
    other = make_client(name="reader")
    other.join("news")
    assert wait_until(lambda: len(joined) == 1)
    assert joined[0].kind is Kind.EVENT and joined[0].json()["Channel"] == "news"
    other.push("news", 1, b"headline", ack=True)
    event = watcher.receive(timeout=WAIT)
    assert event is not None and event.kind is Kind.EVENT
    assert event.json()["ProducerId"] == other.client_id
    watcher.unsubscribe(EventName.MESSAGE_PRODUCED, channel="news", queue_id=1)
    other.push("news", 1, b"quiet", ack=True)
    assert watcher.receive(timeout=0.3) is None


def test_many_clients_concurrently(make_client: MakeClient) -> None:
    consumer = make_client(max_inbox=100_000)
    consumer.create_queue("busy", 1, {"Status": 1})
    consumer.join("busy")
    idle = [make_client(threaded=False) for _ in range(20)]
    producers = [make_client(threaded=i % 2 == 0) for i in range(8)]
    errors: list[BaseException] = []

    def produce(client: Client, n: int) -> None:
        try:
            for i in range(n):
                client.push("busy", 1, f"{client.client_id}:{i}")
            client.push("busy", 1, b"done", ack=True)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(p, 300)) for p in producers]
    for t in threads:
        t.start()
    seen = 0
    for _message in consumer.consume(timeout=10):
        seen += 1
        if seen == 8 * 301:
            break
    for t in threads:
        t.join(10)
    assert not errors
    assert seen == 8 * 301
    assert len(consumer.clients()) == 1 + 20 + 8
    del idle


def test_token_refused_is_a_connect_error(zctx: Ctx) -> None:
    engine = Engine(authorizer=TokenAuthorizer({"good": ALL_ACTIONS}, require_token=True))
    with Server(engine, ServerOptions(endpoint="tcp://127.0.0.1:*"), context=zctx) as srv:
        assert srv.endpoint is not None
        bad = Client(srv.endpoint, context=zctx, token="bad", timeout=WAIT)
        with pytest.raises(ConnectError, match="refused"):  # (not "no answer": a timeout)
            bad.connect()
        with Client(srv.endpoint, context=zctx, token="Bearer good", timeout=WAIT) as good:
            good.create_channel("ok")


def test_no_broker_is_a_connect_error_after_the_timeout(zctx: Ctx) -> None:
    client = Client("tcp://127.0.0.1:1", context=zctx, timeout=0.5)
    started = time.monotonic()
    with pytest.raises(ConnectError, match="no answer"):
        client.connect()
    assert time.monotonic() - started > 0.4  # (never before its timeout; that it gives up
    # at its own timeout is timed with an injected clock: test_client_core)


def test_reconnects_and_rejoins_after_a_broker_restart(zctx: Ctx) -> None:
    first = Server(Engine(), ServerOptions(endpoint="tcp://127.0.0.1:*"), context=zctx)
    endpoint = first.start()
    consumer = Client(
        endpoint, context=zctx, client_id="steady", backoff=(0.05, 0.2), ping_interval=0.3
    )
    consumer.connect()
    try:
        consumer.join("again")
        first.stop()  # the consumer receives TERMINATE and starts reconnecting
        second = Server(Engine(), ServerOptions(endpoint=endpoint), context=zctx)
        start_on_its_port(second)
        try:
            assert wait_until(lambda: consumer.connected, 10)
            with Client(endpoint, context=zctx) as producer:
                assert wait_until(lambda: "steady" in {c["Id"] for c in producer.clients()})
                producer.create_queue("again", 1, {"Status": 1})
                # the consumer re-joined "again" on its own: the push reaches it
                assert wait_until(lambda: producer.channel_info("again")["ActiveClients"] == 1)
                producer.push("again", 1, b"after restart", ack=True)
                message = consumer.receive(timeout=WAIT)
                assert message is not None and message.payload == b"after restart"
            assert consumer.client_id == "steady"
        finally:
            second.stop()
    finally:
        consumer.close()


def test_close_fails_outstanding_requests(zctx: Ctx, server: Server) -> None:
    assert server.endpoint is not None
    requester = Client(server.endpoint, context=zctx).connect()
    with Client(server.endpoint, context=zctx, name="mute") as mute:
        future = requester.request_async("@name:mute", b"never answered", timeout=30)
        assert wait_until(lambda: mute.receive(timeout=0) is not None)
        requester.close()
        with pytest.raises(Exception, match="closed"):
            future.result(WAIT)


def test_a_context_destroyed_under_an_open_client_closes_it_quietly(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """An application (or a test fixture) that destroys its zmq context while a client
    is open: the client's I/O thread ends, its calls fail with ClientClosed, and no
    "client I/O thread failed" traceback is logged (it was, on every failed federation
    test's teardown: ENOTSOCK from the poll)."""
    from broker.client.errors import ClientClosed

    assert server.endpoint is not None
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    client = Client(server.endpoint, context=ctx, timeout=5.0).connect()
    thread = client._thread
    assert thread is not None
    with caplog.at_level("INFO", logger="broker.client.blocking"):
        ctx.destroy(linger=0)
        thread.join(WAIT)
    assert not thread.is_alive()
    with pytest.raises(ClientClosed):
        client.channels()
    failed = [
        r for r in caplog.records if r.levelname == "ERROR" and r.name == "broker.client.blocking"
    ]
    assert failed == [], [r.getMessage() for r in failed]
    assert any("context was terminated" in r.getMessage() for r in caplog.records)
    client.close(timeout=1)
