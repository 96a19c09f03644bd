"""ZeroMQ socket connector: existing zmq applications on one side of a bridge.

A route's remote is ``KIND:ENDPOINT[#TOPIC]`` (connect) or ``KIND@ENDPOINT[#TOPIC]``
(bind):

* outbound (``out:``) ``pub`` or ``push``: each local message is sent on a PUB or PUSH
  socket, as one frame, or as two (``TOPIC``, payload) when a topic is given;
* inbound (``in:``) ``sub`` or ``pull``: each message read from a SUB (subscribed to
  ``TOPIC``, default everything) or PULL socket is pushed into the local queue; of a
  multipart message the last frame is the payload and the first one, when there are
  two or more, is given as the ``Zmq-Topic`` header.

ZeroMQ has no acknowledgements, so "accepted by the remote" means: handed to libzmq.  A
PUSH send that would block (no peer, or the peer's high-water mark reached) waits here,
in order, and the local message stays unacknowledged until it went; a PUB never blocks
(libzmq drops for slow subscribers: PUB's own semantics).  Inbound, at most ``window``
messages are read and not yet accepted by the local broker at once; the rest wait in
libzmq (the sender's HWM applies).  What libzmq held when the bridge stops is lost
(no acknowledgement to resend it from).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import zmq

from broker.bridge.config import Direction, Route
from broker.bridge.connectors import Sink
from broker.bridge.errors import ConfigError, ConnectorError
from broker.bridge.events import RemoteAccepted, RemoteMessage

#: Socket high-water mark (messages) of every bridge socket.
DEFAULT_HWM = 1000
#: Milliseconds a socket may keep unsent messages after close.
LINGER_MS = 500
#: Messages read from the inbound sockets per pump (the driver looks at its queue between).
READ_BATCH = 256

_KINDS = {
    Direction.OUT: {"pub": zmq.PUB, "push": zmq.PUSH},
    Direction.IN: {"sub": zmq.SUB, "pull": zmq.PULL},
}


@dataclass(frozen=True, slots=True)
class SocketSpec:
    """One remote of a route, parsed."""

    kind: str
    endpoint: str
    bind: bool
    topic: bytes

    @classmethod
    def parse(cls, route: Route) -> SocketSpec:
        text = route.remote
        kinds = _KINDS[route.direction]
        for sep, bind in ((":", False), ("@", True)):
            kind, found, rest = text.partition(sep)
            if found and kind in kinds and "://" in rest:
                endpoint, _, topic = rest.partition("#")
                if not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
                    break
                return cls(kind, endpoint, bind, topic.encode())
        names = "|".join(kinds)
        raise ConfigError(
            f"zmq remote of {route} must be {names}:ENDPOINT or {names}@ENDPOINT[#TOPIC]"
        )


class ZmqConnector:
    def __init__(
        self,
        routes: tuple[Route, ...],
        *,
        window: int,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        hwm: int = DEFAULT_HWM,
    ) -> None:
        self.routes = routes
        self.specs = {route: SocketSpec.parse(route) for route in routes}
        self.window = window
        self.hwm = hwm
        self._context = context
        self._own_context = context is None
        self._out: dict[str, tuple[zmq.Socket[bytes], SocketSpec]] = {}
        self._in: list[tuple[zmq.Socket[bytes], Route]] = []
        self._waiting: deque[tuple[int, str, bytes]] = deque()  # PUSH sends that would block
        self._poller = zmq.Poller()
        self._sink: Sink | None = None
        self._generation = 0
        self._outstanding = 0  # inbound messages not yet acknowledged by the bridge

    def open(self, sink: Sink, generation: int, timeout: float) -> None:
        if self._context is None:
            self._context = zmq.Context()
        self._sink = sink
        self._generation = generation
        self._outstanding = 0
        self._poller = zmq.Poller()
        try:
            for route, spec in self.specs.items():
                sock = self._context.socket(_KINDS[route.direction][spec.kind])
                sock.linger = LINGER_MS
                sock.sndhwm = sock.rcvhwm = self.hwm
                if spec.kind == "sub":
                    sock.setsockopt(zmq.SUBSCRIBE, spec.topic)
                (sock.bind if spec.bind else sock.connect)(spec.endpoint)
                if route.direction is Direction.OUT:
                    self._out[route.remote] = (sock, spec)
                else:
                    self._in.append((sock, route))
                    self._poller.register(sock, zmq.POLLIN)
        except zmq.ZMQError as exc:
            self.close()
            raise ConnectorError(f"zmq socket: {exc}") from None

    def publish(self, token: int, remote: str, payload: bytes, resent: bool = False) -> None:
        self._waiting.append((token, remote, payload))
        self._flush()

    def _flush(self) -> None:
        sink = self._sink
        assert sink is not None
        while self._waiting:
            token, remote, payload = self._waiting[0]
            sock, spec = self._out[remote]
            frames = [spec.topic, payload] if spec.topic else [payload]
            try:
                sock.send_multipart(frames, zmq.NOBLOCK)
            except zmq.Again:
                return  # a PUSH with no peer ready: keep the order, try again next pump
            except zmq.ZMQError as exc:
                raise ConnectorError(f"zmq send: {exc}") from None
            self._waiting.popleft()
            sink(RemoteAccepted(token, self._generation))

    def ack(self, ref: Any) -> None:
        self._outstanding = max(0, self._outstanding - 1)

    def pump(self, timeout: float) -> None:
        self._flush()
        if not self._in or self._outstanding >= self.window:
            time.sleep(timeout)  # nothing to read now: the driver must not spin
            return
        sink = self._sink
        assert sink is not None
        ready = dict(self._poller.poll(int(timeout * 1000)))
        for sock, route in self._in:
            if sock not in ready:
                continue
            for _ in range(READ_BATCH):
                if self._outstanding >= self.window:
                    return
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                headers: tuple[tuple[str, str], ...] = ()
                if len(frames) > 1:
                    topic = frames[0].decode("utf-8", "replace")
                    headers = (("Zmq-Topic", topic),)
                self._outstanding += 1
                sink(RemoteMessage(route, frames[-1], None, self._generation, headers))

    def close(self) -> None:
        for sock, _spec in self._out.values():
            sock.close()
        for sock, _route in self._in:
            sock.close()
        self._out.clear()
        self._in.clear()
        self._waiting.clear()  # unacknowledged locally: the local broker hands them out again
        if self._own_context and self._context is not None:
            self._context.term()
            self._context = None
