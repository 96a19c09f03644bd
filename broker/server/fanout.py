"""The broker's fan-out socket: an XPUB where libzmq copies broadcast deliveries.

See ``broker.engine.fanout`` for the protocol.  This door binds the XPUB (``serve
--fanout ENDPOINT``; CURVE with the ROUTER's key and authenticator when CURVE is on),
runs it in manual mode and, when a SUB's subscription is a member's live ticket, applies
the stream's token to that SUB's pipe; each applied claim publishes the stream's marker.
Publishing never blocks: a subscriber whose pipe holds ``fanout_hwm`` messages misses
what follows (libzmq drops for that pipe alone) and sees the gap in the sequence numbers.

Runs: consecutive deliveries of one stream are gathered and sent as ONE message (the
head of the first, a table of offsets, the deliveries: ``broker.fanout``) when the server calls
:meth:`FanoutDoor.flush` (at the end of each drain of its socket, as its other batched
sends), at a marker, at another stream's delivery, or at ``RUN_MAX`` entries /
``RUN_OCTETS``: a SUB pays libzmq's per-message work once per run, not per delivery.
``fanout_hwm`` therefore counts runs.
"""

from __future__ import annotations

import logging
from typing import Any

import zmq

from broker.fanout import RUN_MAX, RUN_OCTETS, SEQ, TOKEN_SIZE, pack_run, payload_length
from zerohub import zmqkit

log = logging.getLogger("broker.server.server")


_unpack_seq = SEQ.unpack_from


class FanoutDoor:
    """The XPUB socket, its subscriptions and its sends (one per run of deliveries)."""

    def __init__(self, sock: zmq.Socket[bytes], engine: Any, counters: dict[str, int]) -> None:
        self.sock = sock
        self.engine = engine
        self.counters = counters
        #: The run being gathered: its deliveries ([]: none), their payload lengths, the
        #: head of the first.
        self.run: list[bytes] = []
        self.run_payloads: list[int] = []
        self.run_head = b""
        #: The number the run's next delivery must have to join it.
        self.run_next = 0
        self.run_octets = 0
        #: Messages handed to the socket so far (``broker.server.wait``: a send may take
        #: the signal of a subscription that came meanwhile).
        self.sends = 0
        #: (``fanout_published``: deliveries; ``fanout_sends``: ZeroMQ messages, runs.)
        counters.setdefault("fanout_published", 0)
        counters.setdefault("fanout_sends", 0)
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
        """A delivery (``data``) joins the run (a new run when it cannot follow it); a
        marker (``data`` empty: the head alone) is sent at once, after the run."""
        run = self.run
        if not data:
            if run:
                self.flush()
            self._send(head, "fanout_markers", 1)
            return
        try:
            length = payload_length(data)
        except ValueError:
            log.error("fan-out publish of a delivery without a payload length: dropped")
            return
        seq = _unpack_seq(head, TOKEN_SIZE)[0]
        if run and (seq != self.run_next or head[:TOKEN_SIZE] != self.run_head[:TOKEN_SIZE]):
            self.flush()
            run = self.run
        if not run:
            self.run_head = head
        run.append(data)
        self.run_payloads.append(length)
        self.run_next = seq + 1
        self.run_octets += len(data)
        if len(run) >= RUN_MAX or self.run_octets >= RUN_OCTETS:
            self.flush()

    def flush(self) -> None:
        """Send the run gathered (nothing when there is none)."""
        run = self.run
        if not run:
            return
        payloads = self.run_payloads
        self.run = []
        self.run_payloads = []
        self.run_octets = 0
        if self._send(pack_run(self.run_head, run, payloads), "fanout_published", len(run)):
            self.counters["fanout_sends"] += 1

    def _send(self, data: bytes, counter: str, count: int) -> bool:
        """Send ``data``, counted (before: a reader may see it at once) in ``counter``."""
        counters = self.counters
        counters[counter] += count
        self.sends += 1
        try:
            self.sock.send(data, zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            counters[counter] -= count
            log.error("fan-out publish failed: %s", exc)
            return False
        return True

    def close(self, linger: float) -> None:
        self.flush()
        self.sock.close(linger=int(linger * 1000))
