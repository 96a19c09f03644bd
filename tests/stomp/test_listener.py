"""The STOMP listener over real loopback sockets: stomp.py 1.0/1.1/1.2 clients, and raw
hostile peers (garbage, split frames, huge announcements, a client that never reads,
a client that leaves mid-frame) while another client keeps being served."""

from __future__ import annotations

import contextlib
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stomp

from broker.stomp.frames import SERVER_COMMANDS, Command, Frame, FrameParser, Limits, Version
from broker.stomp.memory import MemoryBackend
from broker.stomp.server import ListenerOptions, StompListener
from broker.stomp.session import SessionConfig
from tests.polling import WAIT, wait_until
from tests.stomp.two_doors import Recorder

FAST = SessionConfig(die_delay=0.1, heartbeat=(0, 0))


@pytest.fixture
def backend() -> MemoryBackend:
    return MemoryBackend()


def make_listener(backend: MemoryBackend, **options: Any) -> StompListener:
    options.setdefault("session", FAST)
    listener = StompListener(backend, ListenerOptions(port=0, **options))
    listener.start()
    return listener


@pytest.fixture
def listener(backend: MemoryBackend) -> Iterator[StompListener]:
    server = make_listener(backend)
    yield server
    server.stop()


# -- stomp.py ------------------------------------------------------------------------------


CONNECTIONS = {"1.0": stomp.Connection10, "1.1": stomp.Connection11, "1.2": stomp.Connection12}


def client(
    listener: StompListener, version: str, **kwargs: Any
) -> tuple[stomp.Connection, Recorder]:
    conn = CONNECTIONS[version]([("127.0.0.1", listener.port)], **kwargs)
    recorder = Recorder()
    conn.set_listener("recorder", recorder)
    conn.connect("user", "secret", wait=True)
    return conn, recorder


def ack_args(version: str, frame: Any) -> tuple[Any, ...]:
    if version == "1.2":
        return (frame.headers["ack"],)
    if version == "1.1":
        return (frame.headers["message-id"], frame.headers["subscription"])
    return (frame.headers["message-id"],)


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
@pytest.mark.parametrize("ack", ["auto", "client", "client-individual"])
def test_stomp_py_send_subscribe_ack_with_receipts(
    listener: StompListener, backend: MemoryBackend, version: str, ack: str
) -> None:
    conn, rec = client(listener, version)
    try:
        conn.subscribe("/queue/work", id="s1", ack=ack)
        for i in range(3):
            conn.send("/queue/work", f"m{i}\x00with nul", receipt=f"r{i}")
        assert wait_until(lambda: len(rec.messages) == 3 and len(rec.receipts) == 3)
        assert [m.body for m in rec.messages] == [f"m{i}\x00with nul" for i in range(3)]
        assert rec.receipts == ["r0", "r1", "r2"]
        if ack == "auto":
            assert listener.call(lambda: backend.queue_depth("work")) == 0
        else:
            assert listener.call(lambda: backend.queue_depth("work")) == 3
            # client mode: acking the last settles all three; individual: one only
            conn.ack(*ack_args(version, rec.messages[-1]))
            expected = 0 if ack == "client" else 2
            assert wait_until(
                lambda: listener.call(lambda: backend.queue_depth("work")) == expected
            )
        assert rec.errors == []
    finally:
        conn.disconnect()


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_stomp_py_nack_redelivers(listener: StompListener, version: str) -> None:
    conn, rec = client(listener, version)
    try:
        conn.subscribe("/queue/n", id="s1", ack="client-individual")
        conn.send("/queue/n", "again")
        assert wait_until(lambda: len(rec.messages) == 1)
        conn.nack(*ack_args(version, rec.messages[0]))
        assert wait_until(lambda: len(rec.messages) == 2)
        assert rec.messages[1].body == "again"
    finally:
        conn.disconnect()


def test_stomp_py_transaction(listener: StompListener, backend: MemoryBackend) -> None:
    conn, rec = client(listener, "1.2")
    try:
        tx = conn.begin()
        conn.send("/queue/tx", "one", transaction=tx)
        conn.send("/queue/tx", "two", transaction=tx)
        conn.send("/queue/tx", "probe", receipt="probe")
        assert wait_until(lambda: rec.receipts == ["probe"])
        assert listener.call(lambda: backend.queue_depth("tx")) == 1
        conn.commit(tx)
        aborted = conn.begin()
        conn.send("/queue/tx", "never", transaction=aborted)
        conn.abort(aborted)
        conn.send("/queue/tx", "last", receipt="last")
        assert wait_until(lambda: rec.receipts == ["probe", "last"])
        conn.subscribe("/queue/tx", id="s")
        assert wait_until(lambda: len(rec.messages) == 4)
        assert [m.body for m in rec.messages] == ["probe", "one", "two", "last"]
    finally:
        conn.disconnect()


def test_stomp_py_topic_fan_out_between_versions(listener: StompListener) -> None:
    a, rec_a = client(listener, "1.0")
    b, rec_b = client(listener, "1.2")
    try:
        a.subscribe("/topic/news", id="a")
        b.subscribe("/topic/news", id="b", receipt="subscribed")
        assert wait_until(lambda: rec_b.receipts == ["subscribed"])
        a.send("/topic/news", "hello:\nworld", headers={"x-key": "a:b"})
        assert wait_until(lambda: len(rec_a.messages) == 1 and len(rec_b.messages) == 1)
        assert rec_b.messages[0].headers["x-key"] == "a:b"  # escaped on 1.2
        assert rec_a.messages[0].headers["x-key"] == "a:b"  # raw on 1.0
    finally:
        a.disconnect()
        b.disconnect()


def test_stomp_py_heartbeats(backend: MemoryBackend) -> None:
    # Heart-beats every 50 ms both ways, and each side tolerates silences far longer than
    # that: with the default tolerances (the server's twice, stomp.py's 1.5 times the
    # interval: 75-100 ms) a loaded machine's scheduling pause ended the connection now
    # and then, and the heart-beats stopped.  What is checked here is that they are
    # negotiated and flow; ending a silent peer is checked with a hand-driven clock.
    server = make_listener(backend, session=SessionConfig(heartbeat=(50, 50), heartbeat_grace=100))
    conn, rec = client(server, "1.2", heartbeats=(50, 50), heart_beat_receive_scale=100)
    try:
        assert wait_until(lambda: rec.heartbeats >= 3)
        assert conn.is_connected()
    finally:
        conn.disconnect()
        server.stop()


# -- raw sockets -----------------------------------------------------------------------------


class Raw:
    """A hand-driven client socket that parses what the server sends."""

    def __init__(self, listener: StompListener | int, rcvbuf: int | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(WAIT)
        port = listener if isinstance(listener, int) else listener.port
        self.sock.connect(("127.0.0.1", port))
        self.parser = FrameParser(commands=SERVER_COMMANDS, version=Version.V1_2)
        self.frames: list[Frame] = []

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def connect(self) -> None:
        self.send(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
        assert self.next().command is Command.CONNECTED

    def next(self) -> Frame:
        while not self.frames:
            data = self.sock.recv(65536)
            assert data, "connection closed"
            self.frames.extend(self.parser.feed(data))
        return self.frames.pop(0)

    def closed_by_server(self) -> bool:
        """Reads until EOF (True) or the deadline (False); frames are kept."""
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return True
                self.frames.extend(self.parser.feed(data))
        except (TimeoutError, ConnectionResetError):
            return False

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def bystander(listener: StompListener) -> Iterator[Raw]:
    """A well-behaved client that must keep being served through every attack."""
    raw = Raw(listener)
    raw.connect()
    raw.send(b"SUBSCRIBE\nid:s\ndestination:/queue/calm\n\n\x00")
    yield raw
    raw.send(b"SEND\ndestination:/queue/calm\nreceipt:still\n\nok\x00")
    frames = [raw.next(), raw.next()]
    assert sorted(f.command.value for f in frames) == ["MESSAGE", "RECEIPT"]
    raw.close()


ATTACKS = {
    "garbage": (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not stomp\n\n\x00", "command"),
    "unknown command": (b"FLY\nto:moon\n\n\x00", "unknown command"),
    "one GiB announced": (
        b"SEND\ndestination:/queue/a\ncontent-length:1073741824\n\n" + b"x" * 100,
        "max_body",
    ),
    "too many headers": (b"SEND\n" + b"h:v\n" * 2000 + b"\n\x00", "max_headers"),
    "NUL in a header": (b"SEND\ndestination:/queue/a\nbad:a\x00b\n\n\x00", "NUL"),
    "1 MiB header line": (b"SEND\nh:" + b"v" * (1024 * 1024) + b"\n\n\x00", "max_header_length"),
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_hostile_input_gets_error_then_close(
    listener: StompListener, backend: MemoryBackend, bystander: Raw, name: str
) -> None:
    payload, match = ATTACKS[name]
    raw = Raw(listener)
    try:
        if name not in ("garbage", "unknown command"):
            raw.connect()
        # the server may close while a long payload is still going out
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            raw.send(payload)
        assert raw.closed_by_server()
        (error,) = raw.frames
        assert error.command is Command.ERROR
        assert match in (error.header("message") or "")
    finally:
        raw.close()
    assert listener.call(lambda: backend.queue_depth("a")) == 0


def test_frames_split_byte_by_byte(listener: StompListener, bystander: Raw) -> None:
    raw = Raw(listener)
    try:
        stream = (
            b"CONNECT\r\naccept-version:1.1,1.2\r\nhost:localhost\r\n\r\n\x00\n"
            b"SUBSCRIBE\nid:0\ndestination:/queue/split\n\n\x00"
            b"SEND\ndestination:/queue/split\ncontent-length:3\nreceipt:r\n\na\x00b\x00\n\n"
        )
        for i in range(len(stream)):
            raw.send(stream[i : i + 1])
        frames = [raw.next() for _ in range(3)]
        assert [f.command for f in frames] == [Command.CONNECTED, Command.MESSAGE, Command.RECEIPT]
        assert frames[1].body == b"a\x00b"
    finally:
        raw.close()


def test_client_leaving_mid_frame_loses_nothing_else(
    listener: StompListener, backend: MemoryBackend, bystander: Raw
) -> None:
    raw = Raw(listener)
    raw.connect()
    raw.send(b"SEND\ndestination:/queue/half\ncontent-length:10\n\nabc")
    raw.close()
    assert wait_until(lambda: listener.call(lambda: backend.connections) == 1)
    assert listener.call(lambda: backend.queue_depth("half")) == 0


def test_unacked_messages_of_a_vanished_client_are_redelivered(
    listener: StompListener, backend: MemoryBackend
) -> None:
    raw = Raw(listener)
    raw.connect()
    raw.send(b"SUBSCRIBE\nid:0\ndestination:/queue/r\nack:client\n\n\x00")
    raw.send(b"SEND\ndestination:/queue/r\n\nprecious\x00")
    assert raw.next().body == b"precious"
    raw.close()
    conn, rec = client(listener, "1.2")
    try:
        conn.subscribe("/queue/r", id="s", ack="auto")
        assert wait_until(lambda: len(rec.messages) == 1)
        assert rec.messages[0].body == "precious"
    finally:
        conn.disconnect()


def test_client_that_never_reads_is_bounded(backend: MemoryBackend) -> None:
    max_outbound = 64 * 1024
    server = make_listener(backend, max_outbound=max_outbound)
    body = b"x" * 10_000
    total = 2000  # 20 MB: far beyond any socket buffer
    stalled = Raw(server, rcvbuf=4096)
    producer = Raw(server)
    try:
        stalled.connect()
        stalled.send(b"SUBSCRIBE\nid:0\ndestination:/queue/big\nack:client\n\n\x00")
        stalled.send(b"SUBSCRIBE\nid:1\ndestination:/topic/big\n\n\x00")
        producer.connect()
        frame = b"SEND\ndestination:/queue/big,/topic/big\ncontent-length:10000\n\n" + body + b"\0"
        for _ in range(total):
            producer.send(frame)
        producer.send(b"SEND\ndestination:/queue/done\nreceipt:all\n\n\x00")
        assert producer.next().header("receipt-id") == "all"
        outbound = server.call(server.outbound_bytes)
        assert max(outbound.values()) <= max_outbound + len(frame) * 2
        left = server.call(lambda: backend.queue_depth("big"))
        assert left == total  # unacked ones count too: nothing was lost
        # the producer, and a new consumer, are still served
        consumer, rec = client(server, "1.2")
        try:
            consumer.subscribe("/queue/big", id="c")
            assert wait_until(lambda: len(rec.messages) > total // 2, timeout=30)
        finally:
            consumer.disconnect()
    finally:
        stalled.close()
        producer.close()
        server.stop()


def test_max_connections(backend: MemoryBackend) -> None:
    server = make_listener(backend, max_connections=2)
    first, second, third = Raw(server), Raw(server), Raw(server)
    try:
        first.connect()
        second.connect()
        assert third.closed_by_server()
        assert "too many connections" in (third.frames[0].header("message") or "")
        first.close()
        assert wait_until(lambda: server.call(lambda: len(server.connections)) == 1)
        fourth = Raw(server)
        fourth.connect()
        fourth.close()
    finally:
        for raw in (first, second, third):
            raw.close()
        server.stop()


def test_small_frame_limits_are_configurable(backend: MemoryBackend) -> None:
    session = SessionConfig(die_delay=0.1, limits=Limits(max_body=10))
    server = make_listener(backend, session=session)
    raw = Raw(server)
    try:
        raw.connect()
        raw.send(b"SEND\ndestination:/queue/a\n\n0123456789\x00")
        raw.send(b"SEND\ndestination:/queue/a\n\n0123456789A\x00")
        assert raw.closed_by_server()
        assert "max_body" in (raw.frames[0].header("message") or "")
        assert server.call(lambda: backend.queue_depth("a")) == 1
    finally:
        raw.close()
        server.stop()


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A throw-away key and certificate for ``localhost`` (openssl)."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return key, cert


def test_tls(backend: MemoryBackend, tmp_path: Path) -> None:
    key, cert = self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    server = make_listener(backend, ssl=server_ctx)
    client_ctx = ssl.create_default_context(cafile=str(cert))
    try:
        with (
            socket.create_connection(("127.0.0.1", server.port), timeout=WAIT) as plain,
            client_ctx.wrap_socket(plain, server_hostname="localhost") as tls,
        ):
            tls.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
            parser = FrameParser(commands=SERVER_COMMANDS)
            frames: list[Frame] = []
            while not frames:
                frames = parser.feed(tls.recv(4096))
            assert frames[0].command is Command.CONNECTED
    finally:
        server.stop()


def test_silent_client_is_closed_after_the_heartbeat_timeout(backend: MemoryBackend) -> None:
    session = SessionConfig(heartbeat=(0, 50), heartbeat_grace=2.0)
    server = make_listener(backend, session=session)
    silent, chatty = Raw(server), Raw(server)
    try:
        for raw in (silent, chatty):
            raw.send(b"CONNECT\naccept-version:1.2\nhost:localhost\nheart-beat:50,0\n\n\x00")
            assert raw.next().header("heart-beat") == "0,50"
        # the chatty one sends an EOL every 20 ms while the silent one says nothing
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(0.02):
                with contextlib.suppress(OSError):
                    chatty.send(b"\n")

        beater = threading.Thread(target=beat)
        beater.start()
        try:
            assert silent.closed_by_server()
            assert silent.frames == []  # a dead peer gets no ERROR, just the close
            assert wait_until(lambda: server.call(lambda: backend.connections) == 1)
            chatty.send(b"SEND\ndestination:/queue/hb\nreceipt:alive\n\n\x00")
            assert chatty.next().header("receipt-id") == "alive"
        finally:
            stop.set()
            beater.join()
    finally:
        silent.close()
        chatty.close()
        server.stop()
