"""STOMP over WebSocket (RFC 6455) as a :class:`~broker.stomp.wire.Wire`, sans-IO.

Uses the ``websockets`` library's sans-I/O server protocol (the ``stomp-ws`` extra).
The handshake offers the ``v12.stomp``, ``v11.stomp`` and ``v10.stomp`` subprotocols
(stomp.js asks for them; a client asking for none is accepted too).  The STOMP stream
is the concatenation of the data frames' payloads, text or binary, so a STOMP frame may
span WebSocket messages and a message may hold several frames.  Each flush of session
output is one message: text when it is valid UTF-8, else binary.  Pings are answered
by the library.  A WebSocket message larger than ``max_message`` bytes (default 16 MiB)
fails the connection (close code 1009).
"""

from __future__ import annotations

from collections.abc import Sequence

from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol

SUBPROTOCOLS = [Subprotocol("v12.stomp"), Subprotocol("v11.stomp"), Subprotocol("v10.stomp")]
#: Largest WebSocket message accepted (bytes).
DEFAULT_MAX_MESSAGE = 16 * 1024 * 1024

_DATA = (Opcode.TEXT, Opcode.BINARY, Opcode.CONT)


class WebSocketWire:
    def __init__(self, max_message: int = DEFAULT_MAX_MESSAGE) -> None:
        self._ws = ServerProtocol(
            subprotocols=SUBPROTOCOLS,
            select_subprotocol=_select,
            max_size=max_message,
        )
        self._finished = False

    @property
    def open(self) -> bool:
        return self._ws.state is State.OPEN

    @property
    def finished(self) -> bool:
        return self._finished or self._ws.close_expected() or self._ws.state is State.CLOSED

    def receive(self, data: bytes) -> bytes:
        self._ws.receive_data(data)
        stomp = bytearray()
        for event in self._ws.events_received():
            if isinstance(event, Request):
                response = self._ws.accept(event)
                self._ws.send_response(response)
                if response.status_code != 101:
                    self._finished = True
            elif isinstance(event, Frame) and event.opcode in _DATA:
                stomp += event.data
        return bytes(stomp)

    def send(self, stomp: bytes | bytearray) -> None:
        if not self.open or not stomp:
            return
        stomp = bytes(stomp)  # (the WebSocket protocol's frames take bytes)
        try:
            stomp.decode("utf-8")
        except UnicodeDecodeError:
            self._ws.send_binary(stomp)
        else:
            self._ws.send_text(stomp)

    def take(self) -> bytes:
        return b"".join(self._ws.data_to_send())

    def close(self) -> None:
        if self.open:
            self._ws.send_close(1000)


def _select(protocol: ServerProtocol, offered: Sequence[Subprotocol]) -> Subprotocol | None:
    """The highest STOMP version offered; no subprotocol when none was asked for."""
    for candidate in SUBPROTOCOLS:
        if candidate in offered:
            return candidate
    return None
