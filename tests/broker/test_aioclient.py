"""broker.client.aio.AsyncClient against a live Server + Engine (asyncio.run in sync tests)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.asyncio

from broker import tmqp
from broker.client.aio import AsyncClient
from broker.client.blocking import Kind, Message
from broker.client.errors import (
    AccessRefused,
    ClientClosed,
    ClientError,
    ConnectError,
    RemoteError,
)
from broker.engine.engine import Engine
from broker.protocol import GREETING, ConnectionInfo, EventName, Header, MessageType, ResultCode
from broker.server.server import Server, ServerOptions
from tests.broker.test_client_session import FakeBroker
from tests.broker.test_server_curve import (  # noqa: F401 (fixtures)
    curve_server,
    keys,
    refused_before_the_hello,
)
from tests.dropped_pipe import DEADLINE
from tests.polling import WAIT

Ctx = zmq.Context[zmq.Socket[bytes]]
Main = Callable[[zmq.asyncio.Context, str], Awaitable[None]]


@pytest.fixture
def endpoint(zctx: Ctx) -> Iterator[str]:
    with Server(Engine(), ServerOptions(endpoint="tcp://127.0.0.1:*"), context=zctx) as srv:
        assert srv.endpoint is not None
        yield srv.endpoint


def run(endpoint: str, main: Main) -> None:
    """Run ``main`` on a private asyncio context; fail on leftover tasks or open sockets."""
    ctx = zmq.asyncio.Context()
    leftover_tasks: list[str] = []

    async def guarded() -> None:
        await main(ctx, endpoint)
        others = asyncio.all_tasks() - {asyncio.current_task()}
        leftover_tasks.extend(t.get_name() for t in others)

    try:
        asyncio.run(guarded())
    finally:
        open_sockets = [s for s in ctx._sockets if not s.closed]
        for sock in open_sockets:
            sock.close(linger=0)
        ctx.term()
    assert not leftover_tasks, f"tasks left running: {leftover_tasks}"
    assert not open_sockets, f"{len(open_sockets)} socket(s) left open"


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return True
        await asyncio.sleep(0.01)
    return await check()


def client(ctx: zmq.asyncio.Context, endpoint: str, **kw: Any) -> AsyncClient:
    kw.setdefault("timeout", 5.0)
    return AsyncClient(endpoint, context=ctx, **kw)


def test_connect_learns_the_id_and_close_cleans_up(endpoint: str) -> None:
    async def main(ctx: zmq.asyncio.Context, ep: str) -> None:
        async with client(ctx, ep, name="watcher") as watcher:
            named = await client(ctx, ep, client_id="fixed-id", type="worker").connect()
            anonymous = await client(ctx, ep).connect()
            assert named.client_id == "fixed-id" and named.connected
            assert anonymous.client_id and anonymous.client_id != "fixed-id"

            async def count(n: int) -> bool:
                return len(await watcher.clients()) == n

            assert await until(lambda: count(3))
            await named.close()
            await anonymous.close()
            assert not named.connected
            assert await until(lambda: count(1))  # the broker saw both sessions end
            with pytest.raises(ClientClosed):
                await named.push("q", 1, b"late")
            with pytest.raises(ClientClosed):
                await named.receive(timeout=0)
            await named.close()  # a second close is harmless
            with pytest.raises(ClientError, match="once"):
                await named.connect()

    run(endpoint, main)


def test_push_and_consume(endpoint: str) -> None:
    async def main(ctx: zmq.asyncio.Context, ep: str) -> None:
        async with client(ctx, ep) as consumer, client(ctx, ep) as producer:
            await consumer.create_queue("orders", 1, {"Status": 1})
            await consumer.join("orders")
            ids = [await producer.push("orders", 1, f"order {i}") for i in range(50)]
            await producer.push("orders", 1, b"last", headers={"Trace": "t-1"}, ack=True)
            got: list[Message] = []
            async for message in consumer.consume(timeout=WAIT):
                got.append(message)
                if len(got) == 51:
                    break
            assert [m.payload for m in got[:50]] == [f"order {i}".encode() for i in range(50)]
            assert [m.id for m in got[:50]] == ids
            assert got[50].payload == b"last" and got[50].header("trace") == "t-1"
            first = got[0]
            assert first.kind is Kind.QUEUE and (first.channel, first.queue_id) == ("orders", 1)
            assert first.source == producer.client_id
            await consumer.leave("orders")
            await producer.push("orders", 1, b"unheard", ack=False)
            assert await consumer.receive(timeout=0.2) is None

    run(endpoint, main)


def test_push_with_ack_and_a_refused_push(endpoint: str) -> None:
    async def main(ctx: zmq.asyncio.Context, ep: str) -> None:
        async with client(ctx, ep) as producer:
            await producer.create_queue("acked", 1, {"Status": 3})  # pull: stored, acked
            mid = await producer.push("acked", 1, b"one", ack=True)
            assert mid
            many = await asyncio.gather(
                *(producer.push("acked", 1, f"m{i}", ack=True) for i in range(50))
            )
            assert len(set(many)) == 50
            await producer.update_queue("acked", 1, {"Status": 6})  # stopped: refused
            with pytest.raises(RemoteError) as info:
                await producer.push("acked", 1, b"refused", ack=True)
            assert info.value.code != ResultCode.OK
            info_after = await producer.queue_info("acked", 1)
            assert info_after["Status"] == "Stopped"

    run(endpoint, main)


def test_consumer_ack_and_nack_reach_the_queue(endpoint: str) -> None:
    async def main(ctx: zmq.asyncio.Context, ep: str) -> None:
        async with client(ctx, ep) as consumer, client(ctx, ep) as producer:
            await consumer.create_queue("work", 1, {"Status": 1, "RequestAcknowledge": True})
            await consumer.join("work")
            await producer.push("work", 1, b"job-1")
            await producer.push("work", 1, b"job-2")
            first = await consumer.receive(timeout=WAIT)
            second = await consumer.receive(timeout=WAIT)
            assert first is not None and second is not None and first.needs_ack
            await consumer.ack(first)
            await consumer.nack(second, "cannot")

            async def acked() -> bool:
                info = await consumer.queue_info("work", 1)
                return bool(info["Acks"] == 1 and info["NegativeAcks"] == 1)

            assert await until(acked)

    run(endpoint, main)


def test_hundred_concurrent_direct_requests(endpoint: str) -> None:
    async def main(ctx: zmq.asyncio.Context, ep: str) -> None:
        async with client(ctx, ep, name="calc") as responder, client(ctx, ep) as requester:

            async def serve() -> None:
                async for message in responder.consume():
                    if message.kind is Kind.DIRECT and message.needs_response:
                        await responder.respond(message, message.payload.upper())

            server_task = asyncio.create_task(serve())
            try:
                replies = await asyncio.gather(
                    *(requester.request("@name:calc", f"r{i}") for i in range(100))
                )
                assert [r.payload for r in replies] == [f"R{i}".encode() for i in range(100)]
                assert all(r.source == responder.client_id for r in replies)
                assert responder.client_id is not None
                direct = await requester.request(responder.client_id, b"by id", content_type=7)
                assert direct.payload == b"BY ID"
                with pytest.raises(RemoteError):
                    await requester.request("@name:nobody", b"?", timeout=WAIT)
                assert not requester._pending  # every future was settled and removed
            finally:
                server_task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await server_task

    run(endpoint, main)


def test_admin_create_and_list(endpoint: str) -> None:
    async def main(ctx: zmq.asyncio.Context, ep: str) -> None:
        async with client(ctx, ep, name="admin") as admin:
            await admin.create_channel("billing", {"ClientLimit": 5})
            with pytest.raises(RemoteError) as info:
                await admin.create_channel("billing")
            assert info.value.code == ResultCode.ALREADY_CREATED
            await admin.create_queue("billing", 3, {"Status": 3})
            assert any(c["Name"] == "billing" for c in await admin.channels())
            assert (await admin.channel_info("billing"))["ClientLimit"] == 5
            assert [q["Id"] for q in await admin.queues("billing")] == [3]
            await admin.delete_queue("billing", 3)
            assert await admin.queues("billing") == []
            await admin.delete_channel("billing")
            assert not any(c["Name"] == "billing" for c in await admin.channels())
            assert any(c["Name"] == "admin" for c in await admin.clients())

    run(endpoint, main)


def test_close_fails_outstanding_requests_and_wakes_consumers(endpoint: str) -> None:
    async def main(ctx: zmq.asyncio.Context, ep: str) -> None:
        async with client(ctx, ep, name="mute") as mute:
            requester = await client(ctx, ep).connect()
            request = asyncio.create_task(requester.request("@name:mute", b"never", timeout=30))
            waiting = asyncio.create_task(requester.receive())
            assert await mute.receive(timeout=WAIT) is not None  # the request arrived
            await requester.close()
            with pytest.raises(ClientClosed):
                await request
            with pytest.raises(ClientClosed):
                await waiting

    run(endpoint, main)


def test_no_broker_is_a_connect_error(endpoint: str) -> None:
    async def main(ctx: zmq.asyncio.Context, ep: str) -> None:
        lonely = client(ctx, "tcp://127.0.0.1:1", timeout=0.5)
        started = time.monotonic()
        with pytest.raises(ConnectError, match="no answer"):
            await lonely.connect()
        assert time.monotonic() - started > 0.4  # (never before its timeout; that it gives
        # up at its own timeout is timed with an injected clock: test_client_core)
        assert not lonely.connected

    run(endpoint, main)


def test_a_push_loop_lets_the_other_tasks_run(endpoint: str) -> None:
    """``await push()`` whose frame the socket takes at once must still yield now and
    then: a coroutine pushing in a loop starved every other task of the event loop, the
    clients' own I/O tasks among them (no keep-alive PINGs, nothing read: under load a
    500-push loop took 0.7 s and the broker ended a consumer's session as silent)."""

    async def main(ctx: zmq.asyncio.Context, ep: str) -> None:
        async with client(ctx, ep) as producer:
            await producer.create_queue("busy", 1, {"Status": 1})
            pushed = 0
            seen: list[int] = []

            async def watcher() -> None:
                while True:
                    seen.append(pushed)
                    await asyncio.sleep(0)

            watching = asyncio.ensure_future(watcher())
            await asyncio.sleep(0)
            for _ in range(2000):
                await producer.push("busy", 1, b"x")
                pushed += 1
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
            assert any(0 < n < 2000 for n in seen), sorted(set(seen))[:5]

    run(endpoint, main)


def test_a_consumer_that_stops_reading_keeps_its_session(zctx: Ctx) -> None:
    """A full inbox stops the reader; its PINGs keep the broker from expiring it.

    The broker's peer timeout (3 s) is many of the consumer's PING intervals (0.2 s): at
    load 50-60 this process (broker thread and both clients) went unscheduled for up to
    1.2 s, and with the 0.6 s it had the broker rightly ended sessions it had not heard
    from, 10 runs in 30.  The pause still outlasts the timeout: a consumer that does not
    PING while it does not read is ended."""
    opts = ServerOptions(endpoint="tcp://127.0.0.1:*", ping_interval=1.0, peer_timeout=3.0)
    with Server(Engine(), opts, context=zctx) as srv:
        assert srv.endpoint is not None

        async def main(ctx: zmq.asyncio.Context, ep: str) -> None:
            async with (
                client(ctx, ep) as producer,
                client(ctx, ep, max_inbox=10, ping_interval=0.2) as consumer,
            ):
                await producer.create_queue("slow", 1, {"Status": 1})
                await consumer.join("slow", prefetch=50)
                for i in range(500):
                    await producer.push("slow", 1, b"%d" % i)
                await producer.push("slow", 1, b"500", ack=True)
                await asyncio.sleep(3.5)  # the condition under test: longer than the timeout
                assert consumer.client_id in {c["Id"] for c in await producer.clients()}
                got = []
                async for message in consumer.consume(timeout=WAIT):
                    got.append(int(message.payload))
                    if len(got) == 501:
                        break
                assert got == list(range(501))
                info = await producer.queue_info("slow", 1)
                assert (info["Messages"], info["Deliveries"]) == (0, 501)

        run(srv.endpoint, main)


@pytest.fixture
def curve(request: pytest.FixtureRequest) -> tuple[str, dict[str, Path]]:
    """A CURVE broker's endpoint and the keys (``test_server_curve``'s fixtures)."""
    srv, _engine = request.getfixturevalue("curve_server")
    assert srv.endpoint is not None
    return srv.endpoint, request.getfixturevalue("keys")


def test_curve_session_against_a_curve_server(curve: tuple[str, dict[str, Path]]) -> None:
    endpoint, certs = curve

    async def main(ctx: zmq.asyncio.Context, ep: str) -> None:
        secure = {"server_key": certs["server_pub"], "curve_secret": certs["good_sec"]}
        async with client(ctx, ep, **secure) as consumer, client(ctx, ep, **secure) as producer:
            await consumer.create_queue("secure", 1, {"Status": 1})
            await consumer.join("secure")
            await producer.push("secure", 1, b"secret", ack=True)
            message = await consumer.receive(timeout=WAIT)
            assert message is not None and message.payload == b"secret"
            assert message.source == producer.client_id

    run(endpoint, main)


def test_curve_with_the_wrong_server_key_fails_in_bounded_time(
    curve: tuple[str, dict[str, Path]],
) -> None:
    """The handshake cannot succeed: a ConnectError well before a hang, socket closed."""
    endpoint, certs = curve

    async def main(ctx: zmq.asyncio.Context, ep: str) -> None:
        wrong = client(
            ctx,
            ep,
            server_key=certs["bad_sec"],  # a public key, but not the server's
            curve_secret=certs["good_sec"],
            timeout=3.0,
        )
        with pytest.raises(AccessRefused, match="security handshake"):
            await asyncio.wait_for(wrong.connect(), 10)  # bounded: never a hang
        assert not wrong.connected
        with pytest.raises(ClientError):
            await wrong.push("secure", 1, b"no session")

    run(endpoint, main)


def test_curve_settings_are_checked(curve: tuple[str, dict[str, Path]]) -> None:
    _endpoint, certs = curve

    async def main(ctx: zmq.asyncio.Context, ep: str) -> None:
        with pytest.raises(ValueError, match="both"):
            client(ctx, ep, server_key=certs["server_pub"])
        unreadable = client(
            ctx, ep, server_key=certs["server_pub"], curve_secret=certs["server_pub"]
        )
        with pytest.raises(ConnectError, match="no secret key"):
            await unreadable.connect()

    run("tcp://127.0.0.1:1", main)


def told_curve_is_required(endpoint: str, timeout: float = 3.0) -> None:
    """A plain client of the CURVE broker at ``endpoint``: its connect fails, saying so
    (within ``timeout`` seconds on the client's clock)."""

    async def main(ctx: zmq.asyncio.Context, ep: str) -> None:
        plain = client(ctx, ep, timeout=timeout)
        with pytest.raises(AccessRefused, match="requires CURVE"):
            await asyncio.wait_for(plain.connect(), timeout + 7)

    run(endpoint, main)


def test_plain_async_client_against_a_curve_server_is_told(
    curve: tuple[str, dict[str, Path]],
) -> None:
    told_curve_is_required(curve[0])


def test_plain_async_client_refused_before_its_hello_is_told(
    curve: tuple[str, dict[str, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: the hello's send waited for room in a pipe libzmq had dropped: connect hung
    past its timeout (seen under load)."""
    import broker.client.aio as driver

    refused_before_the_hello(monkeypatch, driver)
    # the dial runs on the client's clock: its connect waits out the whole search
    told_curve_is_required(curve[0], timeout=2 * DEADLINE)


def test_pull_and_events_now_shared_with_the_blocking_client(endpoint: str) -> None:
    async def main(ctx: zmq.asyncio.Context, ep: str) -> None:
        async with client(ctx, ep) as watcher, client(ctx, ep, name="reader") as other:
            joined: list[Message] = []
            await watcher.subscribe(EventName.CLIENT_JOINED, joined.append, channel="news")
            await watcher.subscribe(EventName.MESSAGE_PRODUCED, channel="news", queue_id=1)
            await other.join("news")
            await other.push("news", 1, b"headline", ack=True)
            event = await watcher.receive(timeout=WAIT)
            assert event is not None and event.kind is Kind.EVENT
            assert event.json()["ProducerId"] == other.client_id
            assert len(joined) == 1 and joined[0].json()["Channel"] == "news"
            await watcher.unsubscribe(EventName.MESSAGE_PRODUCED, channel="news", queue_id=1)
            await other.push("news", 1, b"quiet", ack=True)
            assert await watcher.receive(timeout=0.3) is None

            await other.create_queue("jobs", 7, {"Status": 3})
            await other.join("jobs")
            for i in range(3):
                await other.push("jobs", 7, f"job {i}", ack=True)
            first = await other.pull("jobs", 7, count=2)
            assert [m.payload for m in first] == [b"job 0", b"job 1"]
            assert [m.payload for m in await other.pull("jobs", 7, count=5)] == [b"job 2"]
            assert await other.pull("jobs", 7) == []
            with pytest.raises(RemoteError):
                await other.pull("no-such-channel", 7, timeout=WAIT)

    run(endpoint, main)


def test_a_session_the_broker_ends_is_resumed_with_its_channels(zctx: Ctx) -> None:
    """The broker ends the session: the client comes back under its id, joins its
    channels again (with their prefetch), and calls work again."""
    fake = FakeBroker(zctx)
    seen: list[tuple[ConnectionInfo, tmqp.Frame]] = []

    def broker_side() -> None:
        rid, info = fake.accept("fake-1")
        _rid, data = fake.recv()
        join = tmqp.decode((data,))
        assert isinstance(join, tmqp.Frame)
        ack = tmqp.Frame(message_type=MessageType.ACK, message_id=join.message_id)
        fake.send(rid, tmqp.encode(ack)[0])
        bye = tmqp.Frame(message_type=MessageType.TERMINATE, content_type=ResultCode.BUSY)
        fake.send(rid, tmqp.encode(bye)[0])
        rid2, info2 = fake.accept("fake-1")
        _rid, data = fake.recv()
        rejoin = tmqp.decode((data,))
        assert isinstance(rejoin, tmqp.Frame)
        seen.append((info2, rejoin))
        fake.send(rid2, tmqp.encode(rejoin.replace(message_type=MessageType.ACK))[0])
        _rid, data = fake.recv()
        request = tmqp.decode((data,))
        assert isinstance(request, tmqp.Frame)
        answer = tmqp.Frame(
            message_type=MessageType.RESPONSE, message_id=request.message_id, payload=b"[]"
        )
        fake.send(rid2, tmqp.encode(answer)[0])
        assert info.client_id is None  # the first time, the broker names the client

    thread = threading.Thread(target=broker_side)
    thread.start()

    async def main(ctx: zmq.asyncio.Context, ep: str) -> None:
        async with client(ctx, ep, backoff=(0.01, 0.05)) as c:
            await c.join("orders", prefetch=3)

            async def back() -> bool:
                return c.connected and bool(seen)

            assert await until(back)
            assert await c.channels() == []
            assert c.client_id == "fake-1"

    try:
        run(fake.endpoint, main)
        thread.join(10)
        assert not thread.is_alive()
    finally:
        fake.sock.close(linger=0)
    ((info, rejoin),) = seen
    assert info.client_id == "fake-1"
    assert rejoin.target == "orders" and (Header.PREFETCH, "3") in rejoin.headers


def test_close_keeps_every_delivery_on_its_way_beyond_a_full_inbox(endpoint: str) -> None:
    """300 deliveries of a queue without acknowledges reached the consumer (the broker
    counts them done) while its inbox holds 10: ``close`` reads the rest off the socket
    until the broker ends the session, and ``receive`` hands all 300 out after it."""

    async def main(ctx: zmq.asyncio.Context, ep: str) -> None:
        async with client(ctx, ep) as producer:
            await producer.create_queue("held", 1, {"Status": 1})
            consumer = await client(ctx, ep, max_inbox=10).connect()
            await consumer.join("held")
            for i in range(300):
                await producer.push("held", 1, b"%d" % i)

            async def all_sent() -> bool:
                return (await producer.queue_info("held", 1))["SentMessages"] == 300

            assert await until(all_sent, timeout=30)
            await consumer.close()
            got = []
            with pytest.raises(ClientClosed):
                while True:
                    message = await consumer.receive(timeout=0)
                    assert message is not None
                    got.append(int(message.payload))
            assert got == list(range(300))

    run(endpoint, main)


def test_a_hello_read_by_a_stopping_broker_is_said_again(zctx: Ctx) -> None:
    """As the blocking client's test of that name: the reconnect's greeting and
    connection info were read by a broker that then closed its ROUTER unanswered; the
    client says hello again to the broker that comes up on the port, long before its
    peer timeout (the handshake's deadline, which it waited for before)."""
    fake = FakeBroker(zctx)
    brokers = [fake]
    seen: list[ConnectionInfo] = []

    def broker_side() -> None:
        rid, _info = fake.accept("fake-1")
        bye = tmqp.Frame(message_type=MessageType.TERMINATE, content_type=ResultCode.BUSY)
        fake.send(rid, tmqp.encode(bye)[0])
        data = b""
        while data != GREETING:  # the reconnect's hello reaches the stopping broker
            _rid, data = fake.recv()
        fake.recv()  # its connection info
        fake.sock.close(linger=0)  # stopped without answering
        second = FakeBroker.on_its_port(zctx, fake.endpoint)
        brokers.append(second)
        seen.append(second.accept("fake-1")[1])

    thread = threading.Thread(target=broker_side)
    thread.start()

    async def main(ctx: zmq.asyncio.Context, ep: str) -> None:
        async with client(ctx, ep, backoff=(0.01, 0.05), peer_timeout=60.0) as c:

            async def back() -> bool:
                return c.connected and bool(seen)

            assert await until(back, WAIT)
            thread.join(WAIT)

    try:
        run(fake.endpoint, main)
        assert not thread.is_alive()
    finally:
        thread.join(WAIT)
        for broker in brokers:
            broker.sock.close(linger=0)
    assert [info.client_id for info in seen] == ["fake-1"]
