"""Resource limits seen from outside: a real ``broker serve`` process, its memory and its
file descriptors (``/proc/PID``), raw peers that misbehave, the CLI against long lists."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from broker import tmqp
from broker.client.blocking import Client
from broker.protocol import (
    GREETING,
    ConnectionInfo,
    Header,
    MessageType,
    Operation,
    ResultCode,
    header,
)
from broker.server.server import Server, ServerOptions
from tests.broker.test_cli import run, start_serve
from tests.broker.test_server_transport import Peer, ScriptedEngine
from tests.ports import free_port

Ctx = zmq.Context[zmq.Socket[bytes]]
MiB = 1024 * 1024
LONG = 90.0  # seconds: a deadline for work a loaded 2-core machine may take long over
PING = tmqp.encode(tmqp.Ping())[0]
PONG = tmqp.encode(tmqp.Pong())[0]


def until(check: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), in octets."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def open_sockets(pid: int) -> int:
    """How many of the process's file descriptors are sockets (its connections)."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    return count


class Broker:
    """A ``broker serve`` process on a free loopback port."""

    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.proc = start_serve("--bind", self.endpoint, *args)
        self.pid = self.proc.pid

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(LONG) == 0  # (took over 15 s at load 50)


@pytest.fixture
def serve() -> Iterator[Callable[..., Broker]]:
    started: list[Broker] = []

    def start(*args: str) -> Broker:
        started.append(Broker(*args))
        return started[-1]

    yield start
    for broker in started:
        if broker.proc.poll() is None:
            broker.stop()


def handshake(sock: zmq.Socket[bytes], client_id: str | None = None) -> tmqp.Frame:
    sock.send(GREETING)
    sock.send(tmqp.encode(ConnectionInfo(client_id=client_id).to_frame("hi"))[0])
    assert sock.poll(10_000) and sock.recv() == GREETING
    assert sock.poll(10_000)
    reply = tmqp.decode([sock.recv()])
    assert isinstance(reply, tmqp.Frame)
    return reply


def stats(zctx: Ctx, endpoint: str) -> Any:
    with Client(endpoint, context=zctx, timeout=10) as client:
        return client.stats()


def test_an_oversized_frame_is_dropped_before_it_is_buffered(
    zctx: Ctx, serve: Callable[..., Broker]
) -> None:
    # Frames up to 4x the maximum frame size used to be buffered whole, then refused.
    broker = serve("--max-frame-size", str(16 * MiB))
    stats(zctx, broker.endpoint)  # warmed up
    before = peak_rss(broker.pid)
    sock = zctx.socket(zmq.DEALER)
    sock.linger = 0
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    try:
        sock.connect(broker.endpoint)
        assert handshake(sock).content_type == ResultCode.OK
        big = tmqp.encode(
            tmqp.Frame(message_type=MessageType.QUEUE, target="ch", payload=bytes(56 * MiB))
        )[0]
        for _ in range(4):
            sock.send(big)  # copied: zero-copy sends start pyzmq's garbage thread
        outcome: list[str] = []

        def settled() -> bool:
            # the broker either answered (it had read the frame) or dropped the connection
            if sock.poll(0):
                reply = tmqp.decode([sock.recv()])
                if isinstance(reply, tmqp.Frame) and reply.content_type:
                    outcome.append("answered")
            if monitor.poll(0):
                recv_monitor_message(monitor)
                outcome.append("dropped")
            return "dropped" in outcome or outcome.count("answered") == 4

        assert until(settled), "the broker neither answered nor dropped the connection"
        assert "dropped" in outcome
        grown = peak_rss(broker.pid) - before
        assert grown < 24 * MiB, f"the broker's peak RSS grew by {grown / MiB:.0f} MiB"
        # and it keeps serving everyone else
        assert stats(zctx, broker.endpoint)["server"]["frames_in"] > 0
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)


def test_expired_peers_lose_their_connections(zctx: Ctx, serve: Callable[..., Broker]) -> None:
    # Peers whose session expired used to keep their TCP connection (and a descriptor).
    broker = serve("--ping-interval", "0.3", "--peer-timeout", "1.5")
    baseline = open_sockets(broker.pid)  # serving, no connection yet
    silent: list[zmq.Socket[bytes]] = []

    def answer_pings() -> None:
        for sock in silent:
            while sock.poll(0):
                if sock.recv() == PING:
                    sock.send(PONG)

    try:
        for i in range(40):
            sock = zctx.socket(zmq.DEALER)
            sock.linger = 0
            sock.reconnect_ivl = -1  # once closed, it stays closed
            sock.connect(broker.endpoint)
            sock.send(GREETING)
            sock.send(tmqp.encode(ConnectionInfo(client_id=f"s{i}").to_frame("hi"))[0])
            silent.append(sock)
        connected = 0
        while connected < 40:  # every session answered, kept alive meanwhile
            for sock in silent:
                while sock.poll(0):
                    data = sock.recv()
                    if data == PING:
                        sock.send(PONG)
                    elif data != GREETING:
                        reply = tmqp.decode([data])
                        assert isinstance(reply, tmqp.Frame) and reply.content_type == 0
                        connected += 1
            silent[0].poll(10)
        answer_pings()
        assert open_sockets(broker.pid) >= baseline + 40  # one socket per connection
        # from now on they never answer a PING: the sessions expire, the connections close
        assert until(lambda: open_sockets(broker.pid) <= baseline), (
            f"{open_sockets(broker.pid) - baseline} connections still held"
        )
        assert stats(zctx, broker.endpoint)["server"]["expired"] >= 40  # and it serves on
    finally:
        for sock in silent:
            sock.close(linger=0)


def test_connections_that_never_speak_are_closed_and_counted(
    zctx: Ctx, tmp_path: Path, serve: Callable[..., Broker]
) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("[server]\nhandshake_timeout = 1.0\nmax_connections = 30\n")
    broker = serve("--config", str(config))
    baseline = open_sockets(broker.pid)
    mute: list[zmq.Socket[bytes]] = []
    raw: list[socket.socket] = []
    try:
        for _ in range(20):  # ZeroMQ peers that never send a TMQP greeting
            sock = zctx.socket(zmq.DEALER)
            sock.linger = 0
            sock.reconnect_ivl = -1
            sock.connect(broker.endpoint)
            mute.append(sock)
        for _ in range(5):  # TCP connections that never even do the ZMTP handshake
            raw.append(socket.create_connection(("127.0.0.1", broker.port)))
        assert until(lambda: open_sockets(broker.pid) >= baseline + 25)
        assert until(lambda: open_sockets(broker.pid) <= baseline), (
            f"{open_sockets(broker.pid) - baseline} silent connections still held"
        )
    finally:
        for sock in mute:
            sock.close(linger=0)
        for s in raw:
            s.close()


def test_connections_beyond_the_limit_are_shut_down(
    zctx: Ctx, tmp_path: Path, serve: Callable[..., Broker]
) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("[server]\nmax_connections = 30\n")
    broker = serve("--config", str(config))
    socks: list[zmq.Socket[bytes]] = []
    monitors: list[zmq.Socket[bytes]] = []
    try:
        for i in range(40):
            sock = zctx.socket(zmq.DEALER)
            sock.linger = 0
            sock.reconnect_ivl = -1  # a connection shut down stays down
            monitors.append(sock.get_monitor_socket(zmq.EVENT_DISCONNECTED))
            sock.connect(broker.endpoint)
            socks.append(sock)
            hello = tmqp.encode(ConnectionInfo(client_id=f"c{i}").to_frame("hi"))[0]
            with contextlib.suppress(zmq.Again):  # shut down already: no pipe to queue in
                sock.send(GREETING, zmq.NOBLOCK)
                sock.send(hello, zmq.NOBLOCK)
        accepted: set[int] = set()
        dropped: set[int] = set()

        def settled() -> bool:
            for i, (sock, monitor) in enumerate(zip(socks, monitors, strict=True)):
                while sock.poll(0):
                    data = sock.recv()
                    if data not in (GREETING, PING):
                        reply = tmqp.decode([data])
                        assert isinstance(reply, tmqp.Frame) and reply.content_type == 0
                        accepted.add(i)
                if monitor.poll(0):
                    recv_monitor_message(monitor)
                    dropped.add(i)
            return len(accepted | dropped) == 40

        assert until(settled)
        assert len(accepted) == 30 and not accepted & dropped
        assert open_sockets(broker.pid) >= 30  # and they are held, all of them
    finally:
        for sock in socks:
            sock.disable_monitor()
            sock.close(linger=0)
        for monitor in monitors:
            monitor.close(linger=0)


def test_every_list_reply_fits_the_frame_limit(zctx: Ctx, serve: Callable[..., Broker]) -> None:
    frame_limit = 64 * 1024
    broker = serve("--max-frame-size", str(frame_limit))
    with Client(broker.endpoint, context=zctx, threaded=False, timeout=10) as client:
        for i in range(1000):
            client.push(f"list-{i:04d}", 1, b"x")  # channels (and queues) made on the fly
        client.push("list-9999", 1, b"last", ack=True)
    sock = zctx.socket(zmq.DEALER)
    sock.linger = 0
    try:
        sock.connect(broker.endpoint)
        handshake(sock)
        names: list[str] = []
        after: str | None = None
        pages = 0
        for operation, path in ((Operation.CHANNEL_LIST, ()), (Operation.STATS, ("engine",))):
            after, pages = None, 0
            names = []
            while True:
                headers = ((Header.PAGE_AFTER, after),) if after is not None else ()
                request = tmqp.Frame(message_type=MessageType.SERVER, content_type=operation,
                                     message_id=f"p{pages}", pending_response=True,
                                     headers=headers)  # fmt: skip
                sock.send(tmqp.encode(request)[0])
                assert sock.poll(10_000)
                data = sock.recv()
                assert len(data) <= frame_limit, f"a reply of {len(data)} octets"
                reply = tmqp.decode([data])
                assert isinstance(reply, tmqp.Frame) and reply.content_type == 0
                body: Any = json.loads(reply.payload)
                for key in path:
                    body = body[key]
                items = body if isinstance(body, list) else body["channel_list"]
                names += [c.get("Name") or c.get("name") for c in items]
                pages += 1
                after = header(reply, Header.PAGE_NEXT)
                if after is None:
                    break
            assert len(names) == 1001 and names == sorted(names) and pages > 2
    finally:
        sock.close(linger=0)


@pytest.mark.slow  # ~3 s of the broker's CPU (10,000 channels): 15 s here, over 120 s at load 50
@pytest.mark.timeout(600)  # (a hang detector, not a speed bound)
def test_cli_lists_ten_thousand_channels(
    zctx: Ctx, serve: Callable[..., Broker], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "broker.toml"  # one (anonymous) user makes them all: its quotas
    config.write_text("[limits]\nmax_channels_per_user = 10000\nmax_queues_per_user = 10000\n")
    broker = serve("--max-frame-size", str(256 * 1024), "--config", str(config))
    # Deadlines, not the liveness this test is not about: the broker answers nothing while
    # it creates the 10,000 channels, which took over 15 s (the client's default
    # peer_timeout: "no traffic from the broker for 15.0 s") at load 50 on 2 cores.
    with Client(
        broker.endpoint, context=zctx, threaded=False, timeout=LONG, peer_timeout=LONG
    ) as client:
        for i in range(10_000):
            client.push(f"c{i:05d}", 1, b"x")
        client.push("c00000", 1, b"sync", ack=True)
    c = ("--connect", broker.endpoint, "--timeout", str(LONG))
    code, out, err = run(capsys, "admin", *c, "list")
    assert code == 0, err
    listed = [c["Name"] for c in json.loads(out)]
    assert listed == [f"c{i:05d}" for i in range(10_000)]
    code, out, err = run(capsys, "stats", *c)
    assert code == 0, err
    engine = json.loads(out)["engine"]
    assert len(engine["channel_list"]) == 10_000 and engine["channels"] == 10_000


def test_limits_come_from_the_config_file(
    tmp_path: Path, serve: Callable[..., Broker], capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("[limits]\nmax_channels = 2\nmax_cc = 1\n")
    broker = serve("--config", str(config))
    c = ("--connect", broker.endpoint)
    assert run(capsys, "admin", *c, "create", "one")[0] == 0
    assert run(capsys, "admin", *c, "create", "two")[0] == 0
    code, out, err = run(capsys, "admin", *c, "create", "three")
    assert code == 1 and out == "" and len(err.splitlines()) == 1 and "482" in err
    code, out, _ = run(capsys, "stats", *c)
    limits = json.loads(out)["engine"]["limits"]
    assert limits["max_channels"] == 2 and limits["max_cc"] == 1
    assert limits["max_clients"] == 10_000  # the others keep their defaults


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[limits]\nmax_cc = 0\n", "max_cc must be a positive integer"),
        ("[limits]\nmax_sockets = 3\n", "unknown keys"),
        ("[limits]\nmax_reply_size = 900000000\n", "max_reply_size"),
        ("limits = 3\n", "a table"),
        (
            '[limits]\nmax_routers = 1\n[broker]\nrouters = [{Name = "a", Method = "Distribute"},'
            ' {Name = "b", Method = "Distribute"}]\n',
            "too many routers",
        ),
    ],
)
def test_bad_limits_in_the_config_are_one_line_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    config = tmp_path / "broker.toml"
    config.write_text(text + f'[server]\nbind = "tcp://127.0.0.1:{free_port()}"\n')
    code, _, err = run(capsys, "serve", "--config", str(config))
    assert code == 2 and message in err and len(err.splitlines()) == 1


def test_handshakes_under_way_are_bounded(zctx: Ctx) -> None:
    options = ServerOptions(endpoint="tcp://127.0.0.1:*", max_handshakes=2)
    with Server(ScriptedEngine(), options, context=zctx) as srv:
        assert srv.endpoint is not None
        peers = [Peer(zctx, srv.endpoint) for _ in range(4)]
        try:
            for p in peers[:2]:
                p.send(GREETING)
                assert p.recv() == GREETING
            peers[2].send(GREETING)
            refusal = peers[2].recv_frame()
            assert refusal.message_type == MessageType.TERMINATE
            assert refusal.content_type == ResultCode.BUSY
            # one handshake completes: room for another
            peers[0].frame(ConnectionInfo().to_frame("h"))
            assert peers[0].recv_frame().content_type == ResultCode.OK
            peers[3].send(GREETING)
            assert peers[3].recv() == GREETING
        finally:
            for p in peers:
                p.close()


@pytest.mark.parametrize("curve", [False, True], ids=["plain", "curve"])
def test_the_largest_frame_allowed_passes_one_octet_more_does_not(
    zctx: Ctx, tmp_path: Path, curve: bool
) -> None:
    from zerohub import zmqkit as security

    kw: dict[str, Any] = {}
    if curve:
        allow = tmp_path / "allow"
        allow.mkdir()
        server_pub, server_sec = security.new_certificate("server", tmp_path)
        client_pub, client_sec = security.new_certificate("client", tmp_path / "c")
        (allow / "client.key").write_bytes(client_pub.read_bytes())
        kw = {"curve_secret": str(server_sec), "allow_dir": str(allow)}
    options = ServerOptions(endpoint="tcp://127.0.0.1:*", max_frame_size=1000, **kw)
    with Server(ScriptedEngine(), options, context=zctx) as srv:
        assert srv.endpoint is not None
        peer = Peer.__new__(Peer)
        peer.sock = zctx.socket(zmq.DEALER)
        peer.sock.linger = 0
        peer.sock.reconnect_ivl = -1
        if curve:
            security.configure_client(peer.sock, client_sec, server_pub)
        monitor = peer.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        try:
            peer.sock.connect(srv.endpoint)
            peer.handshake()

            def frame_of(size: int) -> tmqp.Frame:
                f = tmqp.Frame(message_type=MessageType.QUEUE, message_id=f"m{size}")
                n = size
                while len(tmqp.encode(f.replace(payload=bytes(n)))[0]) > size:
                    n -= 1
                f = f.replace(payload=bytes(n))
                assert len(tmqp.encode(f)[0]) == size
                return f

            peer.frame(frame_of(1000))
            assert peer.recv_frame().message_id == "m1000"  # echoed by the engine
            peer.frame(frame_of(1001))
            assert monitor.poll(10_000), "the connection was not dropped"
        finally:
            peer.sock.disable_monitor()
            monitor.close(linger=0)
            peer.sock.close(linger=0)
