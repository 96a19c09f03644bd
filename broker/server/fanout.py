"""The broker's fan-out socket: an XPUB where libzmq copies broadcast deliveries.

See ``broker.engine.fanout`` for the protocol.  This door binds the XPUB (``serve
--fanout ENDPOINT``; CURVE with the ROUTER's key and authenticator when CURVE is on),
runs it in manual mode and applies a SUB's subscription only when the engine knows its
topic as a live stream token; each applied subscription publishes the stream's marker.
Publishing never blocks: a subscriber whose pipe holds ``fanout_hwm`` messages misses
what follows (libzmq drops for that pipe alone) and sees the gap in the sequence numbers.
"""

from __future__ import annotations

import logging
from typing import Any

import zmq

from broker.engine.fanout import Publish
from zerohub import zmqkit

log = logging.getLogger("broker.server.server")


class FanoutDoor:
    """The XPUB socket, its subscriptions and its sends (one per published message)."""

    def __init__(self, sock: zmq.Socket[bytes], engine: Any, counters: dict[str, int]) -> None:
        self.sock = sock
        self.engine = engine
        self.counters = counters
        counters.setdefault("fanout_published", 0)
        counters.setdefault("fanout_subscribed", 0)
        counters.setdefault("fanout_refused", 0)
        counters.setdefault("fanout_markers", 0)

    @classmethod
    def bind(
        cls,
        context: zmq.Context[zmq.Socket[bytes]],
        endpoint: str,
        hwm: int,
        linger: float,
        curve_secret: str | None,
        engine: Any,
        counters: dict[str, int],
    ) -> FanoutDoor:
        sock = context.socket(zmq.XPUB)
        try:
            sock.linger = int(linger * 1000)
            sock.sndhwm = hwm
            sock.rcvhwm = hwm
            sock.setsockopt(zmq.XPUB_VERBOSER, 1)  # every (un)subscription reaches us
            sock.setsockopt(zmq.XPUB_MANUAL, 1)  # and applies only when we say so
            if curve_secret is not None:
                zmqkit.configure_server(sock, curve_secret)
            sock.bind(endpoint)
        except (zmq.ZMQError, zmqkit.SecurityError):
            sock.close(linger=0)
            raise
        return cls(sock, engine, counters)

    @property
    def endpoint(self) -> str:
        return self.sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def on_readable(self, now: float) -> list[Any]:
        """Subscriptions from SUB sockets: apply those naming a live token; markers out."""
        sock = self.sock
        out: list[Any] = []
        while True:
            try:
                msg = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            if not msg or msg[0] not in (0, 1):
                continue
            topic = msg[1:]
            if msg[0] == 0:
                sock.setsockopt(zmq.UNSUBSCRIBE, topic)
                continue
            marker = self.engine.fanout_check(topic)
            if marker is None:
                self.counters["fanout_refused"] += 1
                continue
            # manual mode: applies to the pipe of the subscription just read
            sock.setsockopt(zmq.SUBSCRIBE, topic)
            self.counters["fanout_subscribed"] += 1
            out.append(Publish(marker, None))  # type: ignore[arg-type]
        return out

    def publish(self, head: bytes, data: bytes) -> None:
        try:
            self.sock.send(head, zmq.SNDMORE | zmq.NOBLOCK)
            self.sock.send(data, zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            log.error("fan-out publish failed: %s", exc)
            return
        self.counters["fanout_published" if data else "fanout_markers"] += 1

    def close(self, linger: float) -> None:
        self.sock.close(linger=int(linger * 1000))
