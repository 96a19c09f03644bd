"""The broker's fan-out socket: an XPUB where libzmq copies broadcast deliveries.

See ``broker.engine.fanout`` for the protocol.  This door binds the XPUB (``serve
--fanout ENDPOINT``; CURVE with the ROUTER's key and authenticator when CURVE is on),
runs it in manual mode and, when a SUB's subscription is a member's live ticket, applies
the stream's token to that SUB's pipe; each applied claim publishes the stream's marker.
Publishing never blocks: a subscriber whose pipe holds ``fanout_hwm`` messages misses
what follows (libzmq drops for that pipe alone) and sees the gap in the sequence numbers.
"""

from __future__ import annotations

import logging
from typing import Any

import zmq

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
        """Subscriptions from SUB sockets: a live ticket gets its stream's token applied;
        markers (and what a token change held) out."""
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
            claim = self.engine.fanout_claim(topic)
            if claim is None:
                self.counters["fanout_refused"] += 1
                continue
            # manual mode: applies to the pipe of the subscription just read (the ticket's
            # SUB gets the stream token, never the ticket itself)
            sock.setsockopt(zmq.SUBSCRIBE, claim[0])
            self.counters["fanout_subscribed"] += 1
            out += claim[1]
        return out

    def publish(self, head: bytes, data: bytes) -> None:
        """One frame: the head and the delivery (a marker: the head alone)."""
        try:
            self.sock.send(head + data if data else head, zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            log.error("fan-out publish failed: %s", exc)
            return
        self.counters["fanout_published" if data else "fanout_markers"] += 1

    def close(self, linger: float) -> None:
        self.sock.close(linger=int(linger * 1000))
