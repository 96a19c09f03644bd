"""STOMP over WebSocket: a real WebSocket client (the ``websockets`` library) against
the listener's WebSocket port, next to a plain STOMP client on the TCP port."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

pytest.importorskip("websockets")
from websockets.sync.client import ClientConnection, connect

from broker.stomp.frames import SERVER_COMMANDS, Command, Frame, FrameParser, Version
from broker.stomp.memory import MemoryBackend
from broker.stomp.server import ListenerOptions, StompListener
from broker.stomp.session import SessionConfig
from tests.polling import WAIT

from .test_listener import Raw


@pytest.fixture
def listener() -> Iterator[StompListener]:
    options = ListenerOptions(
        port=0, ws_port=0, ws_max_message=64 * 1024, session=SessionConfig(die_delay=0.1)
    )
    server = StompListener(MemoryBackend(), options)
    server.start()
    yield server
    server.stop()


class WsPeer:
    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.parser = FrameParser(commands=SERVER_COMMANDS, version=Version.V1_2)
        self.frames: list[Frame] = []

    def next(self) -> Frame:
        while not self.frames:
            message = self.ws.recv(timeout=WAIT)
            data = message.encode() if isinstance(message, str) else message
            self.frames.extend(self.parser.feed(data))
        return self.frames.pop(0)


def ws_url(listener: StompListener) -> str:
    return f"ws://127.0.0.1:{listener.ws_port}/stomp"


def test_websocket_client_and_tcp_client_share_destinations(listener: StompListener) -> None:
    with connect(ws_url(listener), subprotocols=["v11.stomp", "v12.stomp"]) as ws:  # type: ignore[list-item]
        assert ws.subprotocol == "v12.stomp"
        peer = WsPeer(ws)
        ws.send("CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
        assert peer.next().command is Command.CONNECTED
        # a frame split over two WebSocket messages, then two frames in one message
        ws.send("SUBSCRIBE\nid:0\ndestination:/queue/w")
        ws.send("s\nreceipt:sub\n\n\x00")
        assert peer.next().header("receipt-id") == "sub"
        tcp = Raw(listener)
        try:
            tcp.connect()
            tcp.send(b"SEND\ndestination:/queue/ws\ncontent-length:3\n\na\x00b\x00")
        finally:
            tcp.close()
        message = peer.next()
        assert message.command is Command.MESSAGE
        assert message.body == b"a\x00b"  # sent as a text message: NUL is valid UTF-8
        ws.send(b"SEND\ndestination:/queue/ws\nreceipt:bin\ncontent-length:2\n\n\xff\xfe\x00")
        frames = [peer.next(), peer.next()]
        bodies = {f.command: f.body for f in frames}
        assert bodies[Command.MESSAGE] == b"\xff\xfe"
        assert Command.RECEIPT in bodies


def test_websocket_garbage_gets_error_then_close(listener: StompListener) -> None:
    with connect(ws_url(listener)) as ws:
        peer = WsPeer(ws)
        ws.send("HELLO\n\n\x00")
        error = peer.next()
        assert error.command is Command.ERROR
        assert "unknown command" in (error.header("message") or "")
        with pytest.raises(Exception):  # noqa: B017 - closed by the server
            while True:
                ws.recv(timeout=WAIT)
    assert ws.close_code == 1000


def test_oversized_websocket_message_fails_the_connection(listener: StompListener) -> None:
    with connect(ws_url(listener), max_size=None) as ws:
        ws.send("CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
        WsPeer(ws).next()
        ws.send(b"x" * (65 * 1024))
        with pytest.raises(Exception):  # noqa: B017 - closed by the server
            while True:
                ws.recv(timeout=WAIT)
    assert ws.close_code == 1009
    tcp = Raw(listener)  # and the listener serves others
    try:
        tcp.connect()
    finally:
        tcp.close()


@pytest.mark.parametrize(
    ("request_bytes", "reply_start"),
    [
        (b"GARBAGE / NOTHTTP\r\n\r\n", b""),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 426 "),
    ],
)
def test_a_bad_handshake_is_answered_and_closed(
    listener: StompListener, request_bytes: bytes, reply_start: bytes
) -> None:
    with socket.create_connection(("127.0.0.1", listener.ws_port), timeout=WAIT) as sock:
        sock.sendall(request_bytes)
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
    assert reply.startswith(reply_start)
    tcp = Raw(listener)
    try:
        tcp.connect()
    finally:
        tcp.close()
