"""What carries a session's bytes: plain TCP (here) or WebSocket (``websocket``).

A :class:`Wire` sits between a transport and a session, sans-IO: ``receive(raw)``
returns the STOMP bytes carried by ``raw``; ``send(stomp)`` queues STOMP bytes;
``take()`` returns the raw bytes to write (STOMP output, handshake replies, pongs).
"""

from __future__ import annotations

from typing import Protocol


class Wire(Protocol):
    @property
    def open(self) -> bool:
        """STOMP bytes can flow (a WebSocket's handshake is done)."""
        ...

    @property
    def finished(self) -> bool:
        """The transport must be closed now (a WebSocket close or failure)."""
        ...

    def receive(self, data: bytes) -> bytes: ...

    def send(self, stomp: bytes) -> None: ...

    def take(self) -> bytes: ...

    def close(self) -> None:
        """The session is over: say so on the wire (a WebSocket close frame)."""
        ...


class PlainWire:
    """STOMP straight over TCP (or TLS): bytes are bytes."""

    def __init__(self) -> None:
        self._out = bytearray()

    @property
    def open(self) -> bool:
        return True

    @property
    def finished(self) -> bool:
        return False

    def receive(self, data: bytes) -> bytes:
        return data

    def send(self, stomp: bytes) -> None:
        self._out += stomp

    def take(self) -> bytes:
        data = bytes(self._out)
        self._out.clear()
        return data

    def close(self) -> None:
        return None
