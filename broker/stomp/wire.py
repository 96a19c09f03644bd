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

    def send(self, stomp: bytes | bytearray) -> None:
        """Queue ``stomp`` (the wire's from then on: the caller does not change it)."""
        ...

    def take(self) -> bytes | bytearray: ...

    def close(self) -> None:
        """The session is over: say so on the wire (a WebSocket close frame)."""
        ...


class PlainWire:
    """STOMP straight over TCP (or TLS): bytes are bytes, passed on as they came (a
    session's output reaches the transport uncopied)."""

    def __init__(self) -> None:
        self._out: list[bytes | bytearray] = []

    @property
    def open(self) -> bool:
        return True

    @property
    def finished(self) -> bool:
        return False

    def receive(self, data: bytes) -> bytes:
        return data

    def send(self, stomp: bytes | bytearray) -> None:
        if stomp:
            self._out.append(stomp)

    def take(self) -> bytes | bytearray:
        out = self._out
        if len(out) == 1:  # (the usual: what one flush sent)
            return out.pop()
        data = b"".join(out)
        out.clear()
        return data

    def close(self) -> None:
        return None
