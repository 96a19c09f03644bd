"""Who may use a client id: a live session is never displaced by a newcomer.

A client proves it is the owner of a session with the secret the broker gave it at connect
(``Session-Secret``), or under CURVE with the same public key; authentication (the token)
comes before anything else.  Real server and engine, raw DEALER peers and real clients.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.asyncio

from broker import tmqp
from broker.client.aio import AsyncClient
from broker.client.blocking import Client, ConnectError, UnconfirmedSends
from broker.client.frames import join_frame
from broker.engine.auth import ALL_ACTIONS, TokenAuthorizer
from broker.engine.engine import Engine
from broker.protocol import ConnectionInfo, Header, MessageType, ResultCode, header
from broker.server.server import Server, ServerOptions
from tests.broker.netproxy import TcpProxy
from tests.broker.test_server_transport import PING, PONG, Peer
from tests.polling import wait_until
from zerohub import zmqkit as security
from zerohub.zmqkit import new_certificate

Ctx = zmq.Context[zmq.Socket[bytes]]
SECRET = Header.SESSION_SECRET


def next_frame(peer: Peer, timeout: float = 5.0) -> tmqp.Frame | None:
    """The next frame that is not a PING (None when nothing else comes in time)."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not peer.sock.poll(int(left * 1000)):
            return None
        data = peer.sock.recv()
        if data != PING:
            msg = tmqp.decode([data])
            assert isinstance(msg, tmqp.Frame), msg
            return msg


def hello(peer: Peer, client_id: str, *, token: str | None = None, secret: str | None = None
          ) -> tmqp.Frame:  # fmt: skip
    props = {SECRET: secret} if secret is not None else {}
    peer.send(b"TMQP/2.0")
    peer.frame(ConnectionInfo(client_id=client_id, token=token, properties=props).to_frame("h"))
    assert peer.recv() == b"TMQP/2.0"
    reply = next_frame(peer)
    assert reply is not None, "no answer to the connection info"
    return reply


def serve(zctx: Ctx, engine: Engine | None = None, **kw: Any) -> Server:
    kw.setdefault("ping_interval", 0.2)
    kw.setdefault("peer_timeout", 60.0)  # nobody expires during a test
    options = ServerOptions(endpoint="tcp://127.0.0.1:*", **kw)
    return Server(engine or Engine(), options, context=zctx)


def token_engine() -> Engine:
    grants = {"alice-token": ALL_ACTIONS, "other": ALL_ACTIONS}
    return Engine(authorizer=TokenAuthorizer(grants, anonymous=ALL_ACTIONS))


@pytest.fixture
def server(zctx: Ctx, request: pytest.FixtureRequest) -> Iterator[Server]:
    # the server's ping interval: 0.2 s unless parametrized (indirect=True)
    ping = getattr(request, "param", 0.2)
    with serve(zctx, token_engine(), ping_interval=ping) as srv:
        yield srv


@pytest.fixture
def peers(zctx: Ctx, server: Server) -> Iterator[Callable[[], Peer]]:
    made: list[Peer] = []

    def make() -> Peer:
        assert server.endpoint is not None
        made.append(Peer(zctx, server.endpoint))
        return made[-1]

    yield make
    for p in made:
        p.close()


@pytest.fixture
def bob(zctx: Ctx, server: Server) -> Iterator[Client]:
    assert server.endpoint is not None
    with Client(server.endpoint, context=zctx, client_id="bob", timeout=5) as client:
        yield client


def quiet_alice(peers: Callable[[], Peer]) -> tuple[Peer, str | None]:
    """Alice connected, then quiet for more than the ping interval (the server pinged her).

    Returns her peer and the session secret the broker gave her.
    """
    alice = peers()
    reply = hello(alice, "alice", token="alice-token")
    assert reply.message_type == MessageType.RESPONSE and reply.content_type == ResultCode.OK
    assert alice.recv(timeout=5) == PING  # quiet for a ping interval: the old take-over window
    return alice, header(reply, SECRET)


def assert_alice_still_served(alice: Peer, bob: Client, text: bytes) -> None:
    bob.send("alice", text)
    got = next_frame(alice)
    assert got is not None and got.message_type == MessageType.DIRECT and got.payload == text


@pytest.mark.parametrize("peer_timeout", [3.0, 0.75, 60.0])
def test_the_connect_response_announces_the_peer_timeout(zctx: Ctx, peer_timeout: float) -> None:
    """Clients pace their PINGs from it (a consumer that stops reading must PING before
    the broker's silence limit, which may be shorter than the client's own interval)."""
    with serve(zctx, token_engine(), peer_timeout=peer_timeout) as srv:
        assert srv.endpoint is not None
        peer = Peer(zctx, srv.endpoint)
        try:
            reply = hello(peer, "alice", token="alice-token")
            assert reply.content_type == ResultCode.OK
            assert header(reply, Header.PEER_TIMEOUT_MS) == str(int(peer_timeout * 1000))
            assert header(reply, SECRET)  # beside the secret
        finally:
            peer.close()


@pytest.mark.parametrize(
    ("token", "secret", "code"),
    [
        (None, None, ResultCode.ALREADY_CREATED),  # no proof at all
        ("other", "not-her-secret", ResultCode.ALREADY_CREATED),  # a valid token, wrong secret
        ("refused-token", None, ResultCode.UNAUTHORIZED),  # authentication comes first
    ],
    ids=["no-secret", "wrong-secret", "bad-token"],
)
def test_an_impostor_cannot_take_over_a_quiet_session(
    peers: Callable[[], Peer], bob: Client, token: str | None, secret: str | None, code: int
) -> None:
    alice, _secret = quiet_alice(peers)
    impostor = peers()
    refusal = hello(impostor, "alice", token=token, secret=secret)
    assert refusal.message_type == MessageType.TERMINATE
    assert refusal.content_type == code
    if code == ResultCode.ALREADY_CREATED:
        assert "in use" in (header(refusal, Header.REASON) or "")
    # alice's session is untouched: her direct messages still reach her, none the impostor
    assert_alice_still_served(alice, bob, b"for alice")
    assert next_frame(impostor, 0.2) is None


def test_the_owner_resumes_at_once_with_its_secret(
    peers: Callable[[], Peer], bob: Client, server: Server
) -> None:
    old = peers()
    first = hello(old, "alice", token="alice-token")
    secret = header(first, SECRET)
    assert secret
    new = peers()
    reply = hello(new, "alice", token="alice-token", secret=secret)  # old one still live
    assert reply.message_type == MessageType.RESPONSE and reply.content_type == ResultCode.OK
    assert header(reply, Header.CLIENT_ID) == "alice"
    rotated = header(reply, SECRET)
    assert rotated and rotated != secret  # a new secret for the new session
    bye = next_frame(old)
    assert bye is not None and bye.message_type == MessageType.TERMINATE
    assert_alice_still_served(new, bob, b"to the new session")
    assert next_frame(old, 0.2) is None
    # the used secret is spent: replaying it does not take the session back
    replay = hello(peers(), "alice", token="alice-token", secret=secret)
    assert replay.content_type == ResultCode.ALREADY_CREATED
    assert_alice_still_served(new, bob, b"still the new session")


def test_a_proven_owner_still_needs_a_valid_token(peers: Callable[[], Peer], bob: Client) -> None:
    alice, secret = quiet_alice(peers)
    assert secret, "the broker issues a session secret at connect"
    thief = peers()
    refusal = hello(thief, "alice", token="refused-token", secret=secret)
    assert refusal.content_type == ResultCode.UNAUTHORIZED
    assert_alice_still_served(alice, bob, b"untouched")


def test_the_id_is_free_once_the_old_session_expired(zctx: Ctx) -> None:
    with serve(zctx, ping_interval=0.1, peer_timeout=0.3) as srv:
        assert srv.endpoint is not None
        old, new = Peer(zctx, srv.endpoint), Peer(zctx, srv.endpoint)
        try:
            assert hello(old, "alice").content_type == ResultCode.OK
            # old never answers the PINGs: it expires, and is told so
            bye = next_frame(old, 10)
            assert bye is not None and bye.message_type == MessageType.TERMINATE
            assert hello(new, "alice").content_type == ResultCode.OK  # no proof needed now
        finally:
            old.close()
            new.close()


# A server that pings late: before session secrets, a client losing its connection got
# its id back only once its old session had been quiet for a ping interval.
@pytest.mark.parametrize("server", [30.0], indirect=True, ids=["late-pings"])
def test_blocking_client_resumes_its_session_after_its_connection_dies(
    zctx: Ctx, server: Server, bob: Client
) -> None:
    assert server.endpoint is not None
    proxy = TcpProxy(int(server.endpoint.rsplit(":", 1)[1]))
    alice = Client(proxy.endpoint, context=zctx, client_id="alice", token="alice-token",
                   ping_interval=0.2, peer_timeout=0.6, backoff=(0.01, 0.05),
                   timeout=5)  # fmt: skip
    try:
        alice.connect()
        # the connection dies silently; the broker still holds the session.  What reaches
        # alice from now on can only come over a new connection.
        proxy.freeze()
        got: list[bytes] = []

        def resumed() -> bool:
            bob.send("alice", b"after the break")
            message = alice.receive(timeout=0.1)
            if message is not None:
                got.append(message.payload)
            return bool(got)

        assert wait_until(resumed, 15), "alice never got her session back"
        assert got[0] == b"after the break" and alice.client_id == "alice"
        assert [c["Id"] for c in bob.clients()].count("alice") == 1
    finally:
        alice.close()
        proxy.close()


@pytest.mark.parametrize("server", [30.0], indirect=True, ids=["late-pings"])
def test_async_client_resumes_its_session_after_its_connection_dies(
    server: Server, bob: Client
) -> None:
    assert server.endpoint is not None
    proxy = TcpProxy(int(server.endpoint.rsplit(":", 1)[1]))
    ctx = zmq.asyncio.Context()

    async def main() -> None:
        alice = AsyncClient(proxy.endpoint, context=ctx, client_id="alice", token="alice-token",
                            ping_interval=0.2, peer_timeout=0.6, backoff=(0.01, 0.05),
                            timeout=5)  # fmt: skip
        async with alice:
            await alice.join("news")
            proxy.freeze()
            deadline = time.monotonic() + 15
            got = None
            while got is None and time.monotonic() < deadline:
                bob.send("alice", b"after the break")
                got = await alice.receive(timeout=0.1)
            assert got is not None, "alice never got her session back"
            assert got.payload == b"after the break" and alice.connected
            assert alice.client_id == "alice"
            # she joined her channels again
            assert wait_until(lambda: bob.channel_info("news")["ActiveClients"] == 1)

    try:
        asyncio.run(main())
    finally:
        proxy.close()
        ctx.term()


def test_a_refused_client_id_is_a_clear_connect_error(
    peers: Callable[[], Peer], server: Server, zctx: Ctx
) -> None:
    quiet_alice(peers)
    assert server.endpoint is not None
    impostor = Client(server.endpoint, context=zctx, client_id="alice", timeout=5)
    try:
        with pytest.raises(ConnectError, match="in use"):
            impostor.connect()
    finally:
        impostor.close()


@pytest.fixture
def curve(tmp_path: Path) -> dict[str, Path]:
    allow = tmp_path / "allow"
    allow.mkdir()
    server_pub, server_sec = new_certificate("server", tmp_path / "server")
    keys: dict[str, Path] = {"server_pub": server_pub, "server_sec": server_sec, "allow": allow}
    for name in ("alice", "mallory"):
        pub, sec = new_certificate(name, tmp_path / "clients")
        (allow / f"{name}.key").write_bytes(pub.read_bytes())
        keys[name] = sec
    return keys


def test_under_curve_the_same_key_proves_the_owner(zctx: Ctx, curve: dict[str, Path]) -> None:
    with serve(zctx, curve_secret=str(curve["server_sec"]), allow_dir=str(curve["allow"])) as srv:
        assert srv.endpoint is not None
        made: list[Peer] = []

        def curve_peer(name: str) -> Peer:
            peer = Peer.__new__(Peer)
            peer.sock = zctx.socket(zmq.DEALER)
            peer.sock.linger = 0
            security.configure_client(peer.sock, curve[name], curve["server_pub"])
            peer.sock.connect(srv.endpoint or "")
            made.append(peer)
            return peer

        try:
            old = curve_peer("alice")
            assert hello(old, "alice").content_type == ResultCode.OK
            mallory = hello(curve_peer("mallory"), "alice")  # allowed key, not alice's
            assert mallory.content_type == ResultCode.ALREADY_CREATED
            again = hello(curve_peer("alice"), "alice")  # alice's key, no secret
            assert again.message_type == MessageType.RESPONSE
            assert again.content_type == ResultCode.OK
        finally:
            for p in made:
                p.close()


@pytest.mark.parametrize("server", [30.0], indirect=True, ids=["late-pings"])
def test_a_session_ends_with_its_connection(zctx: Ctx, server: Server, bob: Client) -> None:
    # no PING for 30 s (which would fail to reach it), no expiry for 60 s: only the end of
    # the connection itself can end the session in time
    assert server.endpoint is not None
    alice = zctx.socket(zmq.DEALER)
    alice.linger = 0
    alice.routing_id = b"alice-routing-id"  # a client library with a predictable id
    alice.connect(server.endpoint)
    peer = Peer.__new__(Peer)
    peer.sock = alice
    assert hello(peer, "alice").content_type == ResultCode.OK
    alice.close(linger=0)
    assert wait_until(lambda: "alice" not in [c["Id"] for c in bob.clients()])
    # the same routing id on a new connection does not carry the session on
    again = zctx.socket(zmq.DEALER)
    again.linger = 0
    again.routing_id = b"alice-routing-id"
    again.connect(server.endpoint)
    peer.sock = again
    try:
        direct = tmqp.Frame(message_type=MessageType.DIRECT, target="bob", payload=b"as alice?")
        peer.frame(direct)
        refusal = next_frame(peer)
        assert refusal is not None and refusal.message_type == MessageType.TERMINATE
        assert "handshake required" in (header(refusal, Header.REASON) or "")
        assert bob.receive(timeout=0.2) is None
    finally:
        again.close(linger=0)


def test_what_a_client_sent_before_closing_is_not_lost(zctx: Ctx, server: Server) -> None:
    # The broker hears of the closed connection (its monitor) while the messages sent
    # before the close still wait to be read: the session must outlive them.
    assert server.endpoint is not None
    with Client(server.endpoint, context=zctx, timeout=10) as consumer:
        consumer.create_queue("last-words", 1, {"Status": 3})  # pull: kept until pulled
        # linger: the client's own socket may take its time to hand everything over
        producer = Client(server.endpoint, context=zctx, threaded=False, timeout=10, linger=30)
        producer.connect()
        for i in range(20_000):
            producer.push("last-words", 1, b"%d" % i)
        producer.close()  # TERMINATE after them, then the socket closes

        def all_stored() -> bool:
            return bool(consumer.queue_info("last-words", 1)["Messages"] == 20_000)

        assert wait_until(all_stored, 30), consumer.queue_info("last-words", 1)["Messages"]


class StallingClock:
    """A monotonic clock that, once ``stall`` is on, jumps ``step`` seconds per reading:
    the server thread of a loaded machine, stalled between any two of its steps."""

    def __init__(self, step: float) -> None:
        self.step = step
        self.stall = False
        self.offset = 0.0

    def __call__(self) -> float:
        if self.stall:
            self.offset += self.step
        return time.monotonic() + self.offset


def _close_after_pushing_to_a_stalled_server(
    zctx: Ctx, count: int, *, batch: int, ping_interval: float
) -> Server:
    """A producer pushes ``count`` messages to a pull queue while the server's clock
    stalls 2.5 s per reading, then closes; asserts every message was stored and gives
    back the (stopped) server for further checks."""
    clock = StallingClock(step=2.5)
    options = ServerOptions(
        endpoint="tcp://127.0.0.1:*", batch=batch, ping_interval=ping_interval, peer_timeout=1e6
    )
    srv = Server(Engine(), options, context=zctx, clock=clock)
    endpoint = srv.start()
    try:
        with Client(endpoint, context=zctx, timeout=10) as consumer:
            consumer.create_queue("tail", 1, {"Status": 3})  # pull: kept until pulled
            producer = Client(endpoint, context=zctx, threaded=False, timeout=10, linger=30)
            producer.connect()
            clock.stall = True
            for i in range(count):
                producer.push("tail", 1, b"%d" % i)
            try:
                producer.close()
            except UnconfirmedSends as exc:
                # The goodbye was answered, but the stalled clock's 2.5 s per reading
                # shut the connection down (5 s after the answer, by that clock) before
                # libzmq sent the answer at times: the client cannot tell, so it says
                # so; whether anything is missing is checked below.
                assert "did not answer the goodbye" in str(exc), exc

            def stored() -> int:
                return int(consumer.queue_info("tail", 1)["Messages"])

            assert wait_until(lambda: stored() == count, 30), (stored(), srv.counters)
            # and the closed session did end (only the consumer's is left)
            assert wait_until(lambda: len(srv.peers()) == 1), srv.peers()
    finally:
        srv.stop()
    return srv


def test_a_stalled_server_reads_a_closed_connection_to_its_end(zctx: Ctx) -> None:
    # The connection's end is noticed while its last messages still wait in the ROUTER's
    # pipe; a server stalled longer than the orphan grace between two reads (a small batch
    # each) ended the session after the first read and lost what was still queued.
    _close_after_pushing_to_a_stalled_server(zctx, 3000, batch=16, ping_interval=1e5)


@pytest.mark.slow
def test_a_ping_to_a_closed_connection_does_not_end_its_session_early(zctx: Ctx) -> None:
    # A server stalled between two reads pings the peer it has not heard from for
    # ping_interval.  The peer closed its connection after its last messages: libzmq
    # refuses the PING (EHOSTUNREACH) while those messages still wait to be read.  That
    # refusal ended the session at once, and what was still queued was refused
    # ("handshake required") and lost.
    srv = _close_after_pushing_to_a_stalled_server(zctx, 3000, batch=16, ping_interval=1.0)
    assert srv.counters["refused"] == 0, srv.counters


@pytest.mark.slow
def test_a_stalled_server_does_not_ping_a_producer_whose_messages_wait_unread(
    zctx: Ctx,
) -> None:
    # A server stalled between two reads took a producer whose messages waited unread
    # (in its pipes, in TCP buffers) for a quiet one and pinged it.  The producer had
    # closed after its last messages: its side of the connection ended with the PING
    # unread, which resets the connection (RST), and what the server had not read yet
    # was lost.  A peer is quiet only for as long as the ROUTER was read empty.  25,000
    # messages: more than the two pipes hold, so that some wait in TCP buffers.
    _close_after_pushing_to_a_stalled_server(zctx, 25_000, batch=256, ping_interval=1.0)


@pytest.mark.slow
def test_a_consumer_busy_reading_is_not_taken_for_silent(zctx: Ctx) -> None:
    # A consumer reading a long stream as fast as it can sends nothing: the server PINGs
    # it, and the PING waits behind thousands of deliveries (the pipe, TCP buffers), so
    # the answer comes long after the peer timeout.  The server ended such sessions as
    # silent while they were reading (and what was in flight on a queue without acks was
    # lost).  A peer draining its backlog reads what the server sends: it is alive.  This
    # one answers PINGs as it meets them, like any client, but sends nothing else.  More
    # is queued than the pipes and TCP buffers hold (~20 MB), so the server has a backlog
    # for it all along (a peer that is sent nothing more is proven alive by its client's
    # own PINGs: tests/broker/test_client_core.py).
    total, pad = 40_000, 1000
    with serve(zctx, ping_interval=0.2, peer_timeout=4.0) as srv:
        assert srv.endpoint is not None
        with Client(srv.endpoint, context=zctx, timeout=10.0).connect() as producer:
            producer.create_queue("busy", 1, {"Status": 1})
            for i in range(total):
                producer.push("busy", 1, b"%d" % i + b" " * pad)
            assert wait_until(lambda: producer.queue_info("busy", 1)["Messages"] == total)
            consumer = Peer(zctx, srv.endpoint)
            try:
                reply = hello(consumer, "reader")
                assert reply.content_type == ResultCode.OK, reply
                consumer.frame(join_frame("j", "busy"))
                got: list[int] = []
                # at most ~2,000 a second for 6 s: the first PING waits behind ~20,000
                # deliveries (~10 s), the peer timeout is 4 s; the backlog drains in bursts
                # (libzmq's pipe takes frames again once 1,024 left it), ~1.5 s apart
                while len(got) < 12_000:
                    assert consumer.sock.poll(5000), f"stopped after {len(got)}: {srv.counters}"
                    data = consumer.sock.recv()
                    if data == PING:
                        consumer.send(PONG)
                        continue
                    frame = tmqp.decode([data])
                    assert isinstance(frame, tmqp.Frame), frame
                    if frame.message_type == MessageType.QUEUE:
                        got.append(int(frame.payload))
                        if len(got) % 20 == 0:
                            time.sleep(0.01)
                    else:  # the join's answer; a TERMINATE would end the stream here
                        assert frame.message_type == MessageType.ACK, frame
                assert srv.counters["expired"] == 0, srv.counters
                assert "reader" in srv.peers()
                assert got == list(range(len(got)))
            finally:
                consumer.close()
