"""The ROUTER front end against a scripted engine: handshake, bad frames, keep-alive, timers."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
import zmq.utils.garbage

from broker import tmqp
from broker.engine.engine import ClientRejected, Outgoing
from broker.protocol import (
    GREETING,
    ConnectionInfo,
    Header,
    MessageType,
    ResultCode,
    header,
)
from broker.server.server import Server, ServerError, ServerOptions, salvage_message_id
from tests.polling import WAIT

Ctx = zmq.Context[zmq.Socket[bytes]]
PING = tmqp.encode(tmqp.Ping())[0]
PONG = tmqp.encode(tmqp.Pong())[0]


class ScriptedEngine:
    """Echoes QUEUE frames to their sender, acks what asks for it, records calls."""

    def __init__(self) -> None:
        self.connected: list[str] = []
        self.disconnected: list[str] = []
        self.received: list[tuple[str, tmqp.Frame]] = []
        self.deadline: float | None = None
        self.ticks = 0
        self.count = 0

    def connect(
        self, info: ConnectionInfo, now: float, *, replace: bool = False, federation: bool = False
    ) -> tuple[str, list[Any]]:
        if info.token == "bad":
            raise ClientRejected(ResultCode.UNAUTHORIZED, "token refused")
        if info.client_id in self.connected:
            if not replace:
                raise ClientRejected(ResultCode.ALREADY_CREATED, "id in use")
            self.disconnect(info.client_id, now)
        self.count += 1
        client_id = info.client_id or f"gen-{self.count}"
        self.connected.append(client_id)
        return client_id, []

    def receive(
        self, client_id: str, frame: tmqp.Frame, now: float, data: bytes | None = None
    ) -> list[Any]:
        self.received.append((client_id, frame))
        if frame.payload == b"boom":
            raise RuntimeError("engine bug")
        if frame.message_type == MessageType.QUEUE:
            return [Outgoing(client_id, frame)]
        if frame.payload == b"arm-timer":
            self.deadline = now + 0.05
            return []
        if frame.pending_ack:
            ack = tmqp.Frame(message_type=MessageType.ACK, message_id=frame.message_id)
            return [Outgoing(client_id, ack)]
        return []

    def disconnect(self, client_id: str, now: float) -> list[Any]:
        self.disconnected.append(client_id)
        self.connected.remove(client_id)
        return []

    def transmitted(self, counts: dict[str, int], now: float) -> list[Any]:
        return []  # it sends no Tracked frames

    def tick(self, now: float) -> list[Any]:
        self.ticks += 1
        self.deadline = None
        return [Outgoing(c, tmqp.Frame(message_type=MessageType.EVENT, target="Tick"))
                for c in self.connected]  # fmt: skip

    def next_deadline(self) -> float | None:
        return self.deadline

    def stats(self) -> dict[str, object]:
        return {"clients": len(self.connected)}

    def stats_page(self, after: str | None, budget: int) -> tuple[dict[str, object], None]:
        return self.stats(), None


def options(**kw: Any) -> ServerOptions:
    return ServerOptions(endpoint="tcp://127.0.0.1:*", **kw)


@pytest.fixture
def engine() -> ScriptedEngine:
    return ScriptedEngine()


@pytest.fixture
def server(zctx: Ctx, engine: ScriptedEngine) -> Iterator[Server]:
    srv = Server(engine, options(ping_interval=0.3, peer_timeout=0.9), context=zctx)
    srv.start()
    yield srv
    srv.stop()


class Peer:
    """A raw DEALER speaking TMQP by hand."""

    def __init__(self, ctx: Ctx, endpoint: str) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.connect(endpoint)

    def send(self, *frames: bytes) -> None:
        self.sock.send_multipart(list(frames))

    def frame(self, f: tmqp.Frame) -> None:
        self.send(tmqp.encode(f)[0])

    def recv(self, timeout: float = WAIT) -> bytes:
        assert self.sock.poll(int(timeout * 1000)), "no reply within the deadline"
        return self.sock.recv()

    def recv_frame(self, timeout: float = WAIT) -> tmqp.Frame:
        msg = tmqp.decode([self.recv(timeout)])
        assert isinstance(msg, tmqp.Frame), msg
        return msg

    def silent(self, timeout: float = 0.2) -> bool:
        return not self.sock.poll(int(timeout * 1000))

    def handshake(self, client_id: str | None = None, token: str | None = None) -> tmqp.Frame:
        self.send(GREETING)
        info = ConnectionInfo(client_id=client_id, token=token).to_frame("hello")
        self.frame(info)
        assert self.recv() == GREETING
        return self.recv_frame()

    def close(self) -> None:
        self.sock.close(linger=0)


@pytest.fixture
def peers(zctx: Ctx, server: Server) -> Iterator[Any]:
    made: list[Peer] = []

    def make() -> Peer:
        assert server.endpoint is not None
        made.append(Peer(zctx, server.endpoint))
        return made[-1]

    yield make
    for p in made:
        p.close()


def test_handshake_assigns_an_id_and_routes_frames(peers: Any, engine: ScriptedEngine) -> None:
    p = peers()
    reply = p.handshake()
    assert reply.message_type == MessageType.RESPONSE
    assert reply.message_id == "hello" and reply.content_type == ResultCode.OK
    client_id = header(reply, Header.CLIENT_ID)
    assert client_id == "gen-1"
    push = tmqp.Frame(message_type=MessageType.QUEUE, content_type=7, target="ch", payload=b"x")
    p.frame(push)
    assert p.recv_frame() == push
    assert engine.received == [("gen-1", push)]


def test_client_chosen_id_is_kept_and_duplicates_refused(peers: Any) -> None:
    assert header(peers().handshake("alice"), Header.CLIENT_ID) == "alice"
    second = peers()
    second.send(GREETING)
    second.frame(ConnectionInfo(client_id="alice").to_frame("h2"))
    assert second.recv() == GREETING
    refusal = second.recv_frame()
    assert refusal.message_type == MessageType.TERMINATE
    assert refusal.content_type == ResultCode.ALREADY_CREATED


def test_unknown_protocol_is_refused(peers: Any) -> None:
    p = peers()
    p.send(b"TMQP/1.0")
    refusal = p.recv_frame()
    assert refusal.message_type == MessageType.TERMINATE
    assert refusal.content_type == ResultCode.UNACCEPTABLE
    assert "TMQP/1.0" in (header(refusal, Header.REASON) or "")


def test_frames_before_the_handshake_are_refused(peers: Any, engine: ScriptedEngine) -> None:
    p = peers()
    p.frame(tmqp.Frame(message_type=MessageType.QUEUE, target="ch", payload=b"x"))
    refusal = p.recv_frame()
    assert refusal.message_type == MessageType.TERMINATE
    assert "handshake required" in (header(refusal, Header.REASON) or "")
    assert engine.received == []


def test_rejected_client_gets_terminate(peers: Any) -> None:
    p = peers()
    refusal = p.handshake(token="bad")
    assert refusal.message_type == MessageType.TERMINATE
    assert refusal.content_type == ResultCode.UNAUTHORIZED
    assert header(refusal, Header.REASON) == "token refused"


def test_bad_connection_info_is_refused(peers: Any) -> None:
    p = peers()
    p.send(GREETING)
    assert p.recv() == GREETING
    p.frame(tmqp.Frame(message_type=MessageType.QUEUE, payload=b"not info"))
    assert p.recv_frame().content_type == ResultCode.BAD_REQUEST


def test_ping_pong_both_ways(peers: Any) -> None:
    p = peers()
    p.handshake()
    p.send(PING)
    assert p.recv() == PONG
    # then stay silent: the server pings after ping_interval (0.3 s)
    assert p.recv(timeout=WAIT) == PING


def test_silent_client_expires(peers: Any, engine: ScriptedEngine) -> None:
    p = peers()
    p.handshake("quiet")
    deadline = time.monotonic() + 5.0
    while "quiet" not in engine.disconnected and time.monotonic() < deadline:
        p.sock.poll(50)
        while p.sock.poll(0):
            p.sock.recv()  # PINGs, never answered
    assert engine.disconnected == ["quiet"]


def test_terminate_frame_disconnects(peers: Any, engine: ScriptedEngine) -> None:
    p = peers()
    p.handshake("leaving")
    p.frame(tmqp.Frame(message_type=MessageType.TERMINATE))
    p.send(PING)  # no session any more: refused
    refusal = p.recv_frame()
    assert refusal.message_type == MessageType.TERMINATE
    assert engine.disconnected == ["leaving"]


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"\x11\x10\x05\x00\x00\x01\x00\x03abc", ResultCode.BAD_REQUEST),  # id runs past end
        (b"\x11\x10\x02\x00\x00\x01\x00\x00\xff\xfe", ResultCode.BAD_REQUEST),  # bad UTF-8
        (b"\x11\x10\x00\x00\x00\x01\x00\xfd\xff\xff", ResultCode.BAD_REQUEST),  # payload length
        (b"\x11\x30\x00\x00\x00\x01\x00\x00\x09\x00a:b\r\n", ResultCode.BAD_REQUEST),  # header
        (b"\x11", ResultCode.BAD_REQUEST),  # truncated
        (b"\x11\x10\x00\x00\x00\x01\x00\x00extra", ResultCode.BAD_REQUEST),  # trailing octets
    ],
)
def test_bad_frames_get_an_error_response(peers: Any, data: bytes, code: ResultCode) -> None:
    p = peers()
    p.handshake()
    p.send(data)
    reply = p.recv_frame()
    assert reply.message_type == MessageType.RESPONSE
    assert reply.content_type == code
    assert (header(reply, Header.REASON) or "").startswith("malformed frame")
    p.send(PING)
    assert p.recv() == PONG  # still served


def test_error_response_echoes_a_readable_message_id(peers: Any) -> None:
    p = peers()
    p.handshake()
    good = tmqp.encode(tmqp.Frame(message_type=MessageType.QUEUE, message_id="m-1"))[0]
    p.send(good + b"junk")
    reply = p.recv_frame()
    assert reply.message_id == "m-1" and reply.content_type == ResultCode.BAD_REQUEST


def test_oversize_and_multipart_frames(zctx: Ctx, engine: ScriptedEngine) -> None:
    with Server(engine, options(max_frame_size=1000), context=zctx) as srv:
        assert srv.endpoint is not None
        p = Peer(zctx, srv.endpoint)
        try:
            p.handshake()
            p.send(PING, PING)
            reply = p.recv_frame()
            assert reply.content_type == ResultCode.BAD_REQUEST
            assert "one TMQP frame" in (header(reply, Header.REASON) or "")
            fits = tmqp.Frame(message_type=MessageType.QUEUE, message_id="fits")
            size = 1000
            while len(tmqp.encode(fits.replace(payload=b"x" * size))[0]) > 1000:
                size -= 1
            fits = fits.replace(payload=b"x" * size)
            assert len(tmqp.encode(fits)[0]) == 1000
            p.frame(fits)
            assert p.recv_frame() == fits  # the largest frame allowed is served
            big = tmqp.Frame(message_type=MessageType.QUEUE, message_id="big", payload=b"x" * 2000)
            p.frame(big)
            # libzmq refuses it (ZMQ_MAXMSGSIZE): the connection is dropped, nothing answers
            assert p.silent(0.3)
            assert [f.message_id for _, f in engine.received] == ["fits"]
        finally:
            p.close()


def test_engine_failure_answers_failed_and_keeps_serving(peers: Any) -> None:
    p = peers()
    p.handshake()
    p.frame(tmqp.Frame(message_type=MessageType.DIRECT, message_id="b1", payload=b"boom"))
    reply = p.recv_frame()
    assert reply.message_id == "b1" and reply.content_type == ResultCode.FAILED
    p.frame(tmqp.Frame(message_type=MessageType.SERVER, message_id="ok", pending_ack=True))
    assert p.recv_frame().message_id == "ok"


def test_engine_timers_are_driven_by_next_deadline(peers: Any, engine: ScriptedEngine) -> None:
    p = peers()
    p.handshake()
    p.frame(tmqp.Frame(message_type=MessageType.DIRECT, payload=b"arm-timer"))
    event = p.recv_frame(timeout=WAIT)
    assert event.message_type == MessageType.EVENT and event.target == "Tick"
    assert engine.ticks == 1


def test_fuzzed_frames_never_stop_the_server(peers: Any, engine: ScriptedEngine) -> None:
    rng = random.Random(5)
    fuzzer, bystander = peers(), peers()
    fuzzer.handshake()
    bystander.handshake()
    template = tmqp.encode(
        tmqp.Frame(
            message_type=MessageType.QUEUE,
            message_id="id",
            target="chan",
            headers=(("k", "v"),),
            payload=b"payload",
        )
    )[0]
    for _ in range(300):
        data = bytearray(template)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(1, len(data))] = rng.randrange(256)  # keep the type
        if rng.random() < 0.3:
            data = data[: rng.randrange(len(data))]
        fuzzer.send(bytes(data))
    fuzzer.send(PING)
    # every fuzzed message got an answer (error or echo) before the PONG
    for _ in range(301):
        if fuzzer.recv() == PONG:
            break
    else:
        pytest.fail("no PONG after the fuzzed frames")
    bystander.frame(tmqp.Frame(message_type=MessageType.QUEUE, payload=b"still there"))
    assert bystander.recv_frame().payload == b"still there"


def test_stop_tells_clients_and_ends_sessions(zctx: Ctx, engine: ScriptedEngine) -> None:
    srv = Server(engine, options(), context=zctx)
    endpoint = srv.start()
    p = Peer(zctx, endpoint)
    try:
        p.handshake("c1")
        srv.stop()
        bye = p.recv_frame()
        assert bye.message_type == MessageType.TERMINATE
        assert engine.disconnected == ["c1"]
    finally:
        p.close()


def test_stop_after_run_ended_by_an_exception(zctx: Ctx, engine: ScriptedEngine) -> None:
    # ``broker serve`` runs on the main thread and SIGTERM ends run() with an exception;
    # stop() must then not block on the control socket the loop has already closed.
    class Interrupted(Exception):
        pass

    calls = 0

    def clock() -> float:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise Interrupted
        return time.monotonic()

    options = ServerOptions(endpoint="tcp://127.0.0.1:*")
    server = Server(engine, options, context=zctx, clock=clock)
    with pytest.raises(Interrupted):
        server.run()
    stopper = threading.Thread(target=server.stop)
    stopper.start()
    stopper.join(5.0)
    assert not stopper.is_alive(), "stop() blocked after run() had ended"


def test_insecure_bind_is_refused(zctx: Ctx, engine: ScriptedEngine) -> None:
    srv = Server(engine, ServerOptions(endpoint="tcp://0.0.0.0:*"), context=zctx)
    with pytest.raises(ServerError, match="without CURVE"):
        srv.start()
    srv.stop()


def test_bind_failure_is_reported(zctx: Ctx, engine: ScriptedEngine) -> None:
    with Server(engine, options(), context=zctx) as first:
        assert first.endpoint is not None
        second = Server(engine, ServerOptions(endpoint=first.endpoint), context=zctx)
        with pytest.raises(ServerError, match="cannot serve"):
            second.start()
        second.stop()


def test_stats_include_transport_counters(server: Server, peers: Any) -> None:
    p = peers()
    p.handshake()
    p.send(b"\x11")
    p.recv_frame()
    stats = server.stats()
    counters = stats["server"]
    assert isinstance(counters, dict) and counters["bad_frames"] == 1
    assert stats["engine"] == {"clients": 1}


def test_salvage_message_id() -> None:
    data = tmqp.encode(tmqp.Frame(message_id="abc", payload=b"x" * 300))[0]
    assert salvage_message_id(data) == "abc"
    assert salvage_message_id(b"\x00" * 3) == ""
    # a frame cut inside its id, or an id that is not UTF-8, gives nothing (no exception)
    assert salvage_message_id(data[:9]) == ""
    bad = tmqp.encode(tmqp.Frame(message_id="\u00e9", payload=b"x"))[0]
    at = bad.index("\u00e9".encode())
    assert salvage_message_id(bad[:at] + b"\xff\xfe" + bad[at + 2 :]) == ""


@pytest.mark.parametrize("send_batch", [1, 3, 256])
def test_batched_sends_keep_the_order_of_every_reply(
    zctx: Ctx, engine: ScriptedEngine, send_batch: int
) -> None:
    srv = Server(engine, options(send_batch=send_batch), context=zctx)
    endpoint = srv.start()
    p = Peer(zctx, endpoint)
    try:
        p.handshake()
        expected: list[Any] = []
        for i in range(200):
            if i % 10 == 3:  # answered by the server itself (PONG), not batched
                p.send(PING)
                expected.append(PONG)
            elif i % 10 == 7:  # undecodable: an error response from the server
                p.send(b"\x11\x10\x00")
                expected.append(ResultCode.BAD_REQUEST)
            else:  # echoed by the engine: batched
                p.frame(tmqp.Frame(message_type=MessageType.QUEUE, target="ch",
                                   payload=b"%d" % i))  # fmt: skip
                expected.append(b"%d" % i)
        got: list[Any] = []
        for _ in expected:
            data = p.recv()
            if data == PONG:
                got.append(PONG)
                continue
            f = tmqp.decode([data])
            assert isinstance(f, tmqp.Frame)
            got.append(f.payload if f.message_type == MessageType.QUEUE else f.content_type)
        assert got == expected
        assert p.silent(0.1)
    finally:
        p.close()
        srv.stop()


def test_send_batch_must_be_positive() -> None:
    with pytest.raises(ValueError):
        options(send_batch=0)


class FanOutEngine(ScriptedEngine):
    """Answers a QUEUE frame with three frames, the middle one too big to batch."""

    def receive(
        self, client_id: str, frame: tmqp.Frame, now: float, data: bytes | None = None
    ) -> list[Any]:
        if frame.message_type != MessageType.QUEUE:
            return super().receive(client_id, frame, now)
        return [
            Outgoing(client_id, frame.replace(payload=frame.payload + b"-a")),
            Outgoing(client_id, frame.replace(payload=b"B" * 70_000)),
            Outgoing(client_id, frame.replace(payload=frame.payload + b"-c")),
        ]


def test_a_frame_sent_outside_the_batch_loses_nothing_after_it(zctx: Ctx) -> None:
    srv = Server(FanOutEngine(), options(), context=zctx)
    endpoint = srv.start()
    p = Peer(zctx, endpoint)
    try:
        p.handshake()
        for i in range(3):
            p.frame(tmqp.Frame(message_type=MessageType.QUEUE, target="ch", payload=b"%d" % i))
        got = [p.recv_frame().payload for _ in range(9)]
        assert got == [x for i in range(3) for x in (b"%d-a" % i, b"B" * 70_000, b"%d-c" % i)]
        assert p.silent(0.1)
    finally:
        p.close()
        srv.stop()
        # big frames go out without copying: pyzmq started its reference-keeping thread
        zmq.utils.garbage.gc.stop()
