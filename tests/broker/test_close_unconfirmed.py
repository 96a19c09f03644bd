"""What a client sent before ``close()`` returned is stored, or ``close()`` says it may not be.

Pushes without ``ack`` get no answer: the broker's answer to the goodbye (TERMINATE 0
"goodbye") and the PONGs to the client's PINGs are what prove them read
(``broker.client.confirm``).  Adversarial cases: a broker that reads slowly (a producer's
own PING waits behind its pushes: it took the broker for dead and dropped what its socket
held -- the loaded-CI loss of ``test_server_sessions``), a broker stalled through the
client's whole linger, and the session taken over by its owner's new connection while its
pushes wait.  Real server, engine and clients; the broker's slowness is its engine's (the
server thread is busy there), and every wait is a deadline polled for.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
import zmq.asyncio

from broker import tmqp
from broker.client.aio import AsyncClient
from broker.client.blocking import Client, UnconfirmedSends
from broker.engine.engine import Engine
from broker.protocol import GREETING, ConnectionInfo, Header, MessageType
from broker.server.server import Server, ServerOptions
from tests.broker.kernel import beyond_socket_buffers
from tests.polling import wait_until

Ctx = zmq.Context[zmq.Socket[bytes]]
#: The server's high-water mark here (messages per connection and way).
HWM = 64


class SlowEngine:
    """An ``Engine`` whose pushes cost ``per_push`` seconds each, and that holds the
    server's thread while ``open`` is clear (a broker stalled mid-drain)."""

    def __init__(self, per_push: float = 0.0) -> None:
        self.engine = Engine()
        self.per_push = per_push
        self.open = threading.Event()
        self.open.set()
        self.held = threading.Event()  # the server's thread waits in here

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def _take(self, pushes: int) -> None:
        if not self.open.is_set():
            self.held.set()
            self.open.wait(120)
        if self.per_push:
            time.sleep(self.per_push * pushes)  # the engine's cost, not a synchronisation

    def receive(self, client_id: str, frame: tmqp.Frame, now: float, data: Any = None) -> Any:
        if frame.message_type == MessageType.QUEUE:
            self._take(1)
        return self.engine.receive(client_id, frame, now, data)

    def receive_batch(self, client_id: str, items: Any, now: float) -> Any:
        self._take(len(items))
        return self.engine.receive_batch(client_id, items, now)


@pytest.fixture
def slow(zctx: Ctx, request: pytest.FixtureRequest) -> Iterator[tuple[Server, SlowEngine]]:
    """A server on a ``SlowEngine`` (``per_push`` from the parameter, else 0) that PINGs
    every 0.2 s, reads 64 messages per drain and buffers ``HWM`` per connection (its
    libzmq I/O thread reads on while its own thread is stalled)."""
    engine = SlowEngine(getattr(request, "param", 0.0))
    options = ServerOptions(
        endpoint="tcp://127.0.0.1:*", ping_interval=0.2, peer_timeout=60.0, batch=64, hwm=HWM
    )
    srv = Server(engine, options, context=zctx)  # type: ignore[arg-type]
    srv.start()
    try:
        yield srv, engine
    finally:
        engine.open.set()
        srv.stop()


def _stored(client: Client, channel: str) -> int:
    return int(client.queue_info(channel, 1)["Messages"])


@pytest.mark.parametrize("slow", [0.0025], indirect=True)
def test_a_producer_whose_broker_reads_slowly_keeps_its_session(
    zctx: Ctx, slow: tuple[Server, SlowEngine]
) -> None:
    # 2,000 pushes at 2.5 ms each: the broker reads for 5 s, twice the producer's
    # peer_timeout, and the producer's PING waits behind them all.  Before the fix the
    # broker sent nothing to a peer it kept hearing from; the producer took it for dead
    # and dropped what its socket held (a third of the pushes), close() said nothing.
    srv, _engine = slow
    assert srv.endpoint is not None
    count = 2_000
    with Client(srv.endpoint, context=zctx, timeout=10) as consumer:
        consumer.create_queue("slow", 1, {"Status": 3})  # pull: kept until pulled
        producer = Client(srv.endpoint, context=zctx, threaded=False, timeout=10,
                          peer_timeout=2.5, ping_interval=0.5, linger=30)  # fmt: skip
        producer.connect()
        for i in range(count):
            producer.push("slow", 1, b"%d" % i)

        def all_stored() -> bool:
            producer.poll(0.05)  # a poll-on-call client's timers run in its calls
            return _stored(consumer, "slow") == count

        done = wait_until(all_stored, 60)
        producer.close()  # raises UnconfirmedSends if its session was lost meanwhile
        assert done, _stored(consumer, "slow")


def _push_beyond_the_kernel(producer: Client, channel: str) -> int:
    """Push 64 KiB messages until they overflow the connection's kernel buffers and the
    server's pipe: the rest waits in the client's socket while the broker does not read."""
    payload = b"x" * 65536
    count = beyond_socket_buffers() // len(payload) + HWM + 1
    for _ in range(count):
        producer.push(channel, 1, payload)
    return count


@pytest.mark.parametrize("threaded", [False, True], ids=["poll-on-call", "threaded"])
def test_close_reports_what_a_stalled_broker_did_not_read(
    zctx: Ctx, slow: tuple[Server, SlowEngine], threaded: bool
) -> None:
    # The broker's thread stalls on the first push and stays stalled through the whole
    # linger: close() can no longer hand the rest over.  Before the fix it returned as if
    # all was well and the pushes still in the socket were dropped.
    srv, engine = slow
    assert srv.endpoint is not None
    with Client(srv.endpoint, context=zctx, timeout=10) as consumer:
        consumer.create_queue("stalled", 1, {"Status": 3})
        producer = Client(srv.endpoint, context=zctx, threaded=threaded, timeout=10, linger=0.5)
        producer.connect()
        engine.open.clear()
        count = _push_beyond_the_kernel(producer, "stalled")
        assert wait_until(engine.held.is_set, 30), "the broker never read a push"
        reported: UnconfirmedSends | None = None
        try:
            producer.close()
        except UnconfirmedSends as exc:
            reported = exc
        engine.open.set()
        if reported is None:  # then nothing may be missing
            assert wait_until(lambda: _stored(consumer, "stalled") == count, 30), (
                f"close() said nothing, yet {_stored(consumer, 'stalled')} of {count} stored"
            )
        else:
            assert 0 < reported.count <= count
            assert "did not answer the goodbye" in str(reported), reported


def _raw_takeover(zctx: Ctx, endpoint: str, client_id: str, secret: str | None) -> Any:
    """A raw DEALER greeting and sending connection info for ``client_id`` (with the
    session's secret: its owner resuming; without: an impostor), answers unread."""
    sock = zctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(endpoint)
    props = {Header.SESSION_SECRET: secret} if secret is not None else {}
    info = ConnectionInfo(client_id=client_id, properties=props).to_frame("takeover")
    sock.send(GREETING)
    sock.send(tmqp.encode(info)[0])
    return sock


@pytest.mark.parametrize("owner", [True, False], ids=["owner-resumes", "impostor"])
def test_a_session_taken_over_while_its_pushes_wait_is_reported_at_close(
    zctx: Ctx, slow: tuple[Server, SlowEngine], owner: bool
) -> None:
    # While the broker is stalled with the producer's pushes unread, a new connection
    # claims its client id: with the session's secret (its owner resuming elsewhere) it
    # takes the session over, and what the old connection sent after that is turned
    # away ("handshake required"); the old connection's close then reads TERMINATE 0
    # "session resumed...", not the goodbye.  Before the fix any TERMINATE counted as
    # the goodbye.  Without the secret the newcomer is refused and nothing changes.
    srv, engine = slow
    assert srv.endpoint is not None
    with Client(srv.endpoint, context=zctx, timeout=10) as consumer:
        consumer.create_queue("taken", 1, {"Status": 3})
        producer = Client(srv.endpoint, context=zctx, threaded=False, timeout=10, linger=10)
        producer.connect()
        assert producer.client_id is not None
        secret = producer.session_secret if owner else "not-the-secret"
        engine.open.clear()
        count = 4_000  # 63 drains of 64: the takeover's two frames come early in them
        for i in range(count):
            producer.push("taken", 1, b"%d" % i)
        assert wait_until(engine.held.is_set, 30), "the broker never read a push"
        newcomer = _raw_takeover(zctx, srv.endpoint, producer.client_id, secret)
        try:
            engine.open.set()
            reported: UnconfirmedSends | None = None
            try:
                producer.close()
            except UnconfirmedSends as exc:
                reported = exc
            if reported is None:
                assert wait_until(lambda: _stored(consumer, "taken") == count, 30), (
                    f"close() said nothing, yet {_stored(consumer, 'taken')} of {count} stored"
                )
            else:
                assert owner, f"an impostor's refusal made the producer doubt: {reported}"
                assert "session resumed" in str(reported), reported
        finally:
            newcomer.close(linger=0)


def test_the_async_client_reports_what_a_stalled_broker_did_not_read(
    zctx: Ctx, slow: tuple[Server, SlowEngine]
) -> None:
    # The same stall as above for ``AsyncClient`` (its own driver of the session core).
    srv, engine = slow
    assert srv.endpoint is not None
    endpoint = srv.endpoint
    payload = b"x" * 65536
    count = beyond_socket_buffers() // len(payload) + HWM + 1

    async def produce() -> UnconfirmedSends | None:
        actx = zmq.asyncio.Context.shadow(zctx.underlying)
        producer = AsyncClient(endpoint, context=actx, timeout=10, linger=0.5)
        await producer.connect()
        engine.open.clear()
        for _ in range(count):
            await producer.push("stalled-aio", 1, payload)
        while not engine.held.is_set():
            await asyncio.sleep(0.01)  # polled: the broker reads its first push
        try:
            await producer.close()
        except UnconfirmedSends as exc:
            return exc
        return None

    with Client(endpoint, context=zctx, timeout=10) as consumer:
        consumer.create_queue("stalled-aio", 1, {"Status": 3})
        try:
            reported = asyncio.run(asyncio.wait_for(produce(), 120))
        finally:
            engine.open.set()
        if reported is None:
            assert wait_until(lambda: _stored(consumer, "stalled-aio") == count, 30), (
                f"close() said nothing, yet {_stored(consumer, 'stalled-aio')} of {count} stored"
            )
        else:
            assert 0 < reported.count <= count
            assert "did not answer the goodbye" in str(reported), reported


def test_a_lost_session_is_reported_only_for_pushes_not_confirmed_before_it(
    zctx: Ctx, slow: tuple[Server, SlowEngine]
) -> None:
    # A broker stalled past the producer's peer_timeout is taken for dead: the session is
    # lost and what the socket held dropped.  Pushes confirmed before (a PONG answered a
    # later PING) are not reported; pushes sent into the stall are.
    srv, engine = slow
    assert srv.endpoint is not None
    with Client(srv.endpoint, context=zctx, timeout=10) as consumer:
        consumer.create_queue("lost", 1, {"Status": 3})
        producer = Client(srv.endpoint, context=zctx, threaded=False, timeout=10,
                          peer_timeout=1.0, ping_interval=0.2, linger=10)  # fmt: skip
        producer.connect()
        for i in range(100):
            producer.push("lost", 1, b"%d" % i)

        def confirmed() -> bool:
            producer.poll(0.05)
            return producer.unconfirmed == 0

        assert wait_until(confirmed, 30), producer.unconfirmed
        engine.open.clear()  # the next push stalls the broker
        for i in range(100, 150):
            producer.push("lost", 1, b"%d" % i)
        assert wait_until(engine.held.is_set, 30), "the broker never read a push"
        first = producer.client_id

        def lost() -> bool:
            producer.poll(0.05)  # its timers: silence past peer_timeout loses the session
            return not producer.connected

        assert wait_until(lost, 30), "the session outlived a broker stalled past its timeout"
        engine.open.set()
        assert wait_until(lambda: (producer.poll(0.05), producer.connected)[1], 30)
        assert producer.client_id == first  # resumed with its secret
        with pytest.raises(UnconfirmedSends) as caught:
            producer.close()
        assert caught.value.count == 50, caught.value
        assert "the session was lost" in str(caught.value)
