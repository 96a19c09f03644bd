"""The client's side of broadcast fan-out (``broker.engine.fanout``): one SUB socket.

A JOIN the broker answered with a fan-out grant (``session.Fanout``) subscribes the
channel's stream token on a SUB connected to the announced endpoint (CURVE with the
client's keys when it uses CURVE; a wildcard host is replaced by the broker's host).  The
join completes when the stream's marker arrives: the subscription is live from then on,
and that is where the join takes effect (every message pushed after ``join()`` returned
comes; one pushed while it waited may not, as a push racing a one-by-one join).  From
there each stream's sequence numbers must follow one another; a jump is a *gap*:
messages dropped at a full pipe (the
broker's ``fanout_hwm`` and this SUB's high-water mark).  A gap is never silent: it is
logged, counted and kept in :attr:`FanoutReader.gaps` (``Client.fanout_gaps``).  The broker
never resends a broadcast.  The session's loss ends every stream (a re-join after a
reconnect takes the one-by-one path); a LEAVE unsubscribes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import zmq

from broker import tmqp
from broker.client.errors import ConnectError
from broker.client.session import Fanout
from broker.client.sockets import Curve
from broker.fanout import HEAD_SIZE, SEQ, TOKEN_SIZE
from zerohub import zmqkit
from zproto.errors import DecodeError

log = logging.getLogger("broker.client")

#: Seconds a fan-out join waits for its marker before it fails.
READY_TIMEOUT = 10.0
#: Gaps kept for the application (the oldest are forgotten beyond this; all are counted).
MAX_GAPS = 1000
_BATCH = 1024
_decode = tmqp.decode
_WILDCARDS = ("0.0.0.0", "*", "::", "[::]")


@dataclass(frozen=True, slots=True)
class Gap:
    """Messages ``first``..``last`` (stream sequence numbers) of ``channel`` never came."""

    channel: str
    first: int
    last: int

    @property
    def count(self) -> int:
        return self.last - self.first + 1


class _Stream:
    __slots__ = ("channel", "deadline", "expected", "live", "token", "waiter")

    def __init__(self, grant: Fanout, now: float) -> None:
        self.channel = grant.channel
        self.token = grant.token
        self.waiter: Any = grant.waiter
        self.deadline = now + READY_TIMEOUT
        #: The next sequence number due (set again from the first marker).
        self.expected = grant.seq + 1
        self.live = False


def reachable(announced: str, broker_endpoint: str) -> str:
    """The announced endpoint with a wildcard host replaced by the broker's host."""
    parts = urlsplit(announced)
    if parts.scheme != "tcp" or parts.hostname is None:
        return announced
    host = announced[len("tcp://") :].rsplit(":", 1)[0]
    if host not in _WILDCARDS:
        return announced
    broker = urlsplit(broker_endpoint)
    if broker.hostname is None:
        return announced
    return f"tcp://{broker.netloc.rsplit(':', 1)[0]}:{parts.port}"


class FanoutReader:
    """The SUB socket and the streams it reads (driven by the client's I/O loop)."""

    def __init__(self, context: Any, curve: Curve | None, hwm: int, broker: str) -> None:
        self.context = context
        self.curve = curve
        self.hwm = hwm
        self.broker = broker
        self.sock: zmq.Socket[bytes] | None = None
        self.endpoint = ""
        self.streams: dict[bytes, _Stream] = {}
        self.gaps: list[Gap] = []
        #: Messages missed in all (every gap, also those no longer in ``gaps``).
        self.missed = 0
        self.received = 0

    def grant(self, grant: Fanout, now: float) -> None:
        """Subscribe a granted stream (the join completes at its marker)."""
        endpoint = reachable(grant.endpoint, self.broker)
        if self.sock is not None and endpoint != self.endpoint:
            grant.waiter.set_exception(
                ConnectError(f"a second fan-out endpoint {endpoint} (have {self.endpoint})")
            )
            return
        if self.sock is None:
            sock = self.context.socket(zmq.SUB)
            sock.linger = 0
            sock.rcvhwm = self.hwm
            if self.curve is not None:
                try:
                    zmqkit.configure_client(sock, self.curve.secret, self.curve.server_key)
                except zmqkit.SecurityError as exc:
                    sock.close(linger=0)
                    grant.waiter.set_exception(ConnectError(str(exc)))
                    return
            sock.connect(endpoint)
            self.sock, self.endpoint = sock, endpoint
        self.streams[grant.token] = _Stream(grant, now)
        self.sock.setsockopt(zmq.SUBSCRIBE, grant.token)

    def leave(self, channel: str) -> None:
        for token, stream in list(self.streams.items()):
            if stream.channel == channel:
                del self.streams[token]
                if self.sock is not None:
                    self.sock.setsockopt(zmq.UNSUBSCRIBE, token)

    def read(self, take: Callable[[tmqp.Frame], None]) -> None:
        """Read what the SUB holds (one batch): ``take`` each delivery's frame in order,
        gaps reported.  (Two plain ``recv``: about a third of the cost of
        ``recv_multipart``, measured.)"""
        sock = self.sock
        if sock is None:
            return
        streams = self.streams
        recv = sock.recv
        decode = _decode
        frame_type = tmqp.Frame
        unpack = SEQ.unpack_from
        for _ in range(_BATCH):
            try:
                first = recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            # the broker's XPUB sends every message as two parts, delivered together
            # (RCVMORE checks would cost two enum conversions per message in pyzmq)
            data = recv(zmq.NOBLOCK)
            stream = streams.get(first[:TOKEN_SIZE]) if len(first) == HEAD_SIZE else None
            if stream is None:
                continue  # (left, a stream of an earlier session, or not a head)
            seq = unpack(first, TOKEN_SIZE)[0]
            if not data:  # a marker: the last number sent when a subscription was applied
                self._marker(stream, seq)
                continue
            expected = stream.expected
            if seq != expected:
                if seq < expected:
                    continue  # (sent before this client's join)
                self._gap(stream, expected, seq - 1)
            stream.expected = seq + 1
            try:
                frame = decode((data,))
            except DecodeError:
                log.warning("an undecodable fan-out message on %r", stream.channel)
                continue
            if type(frame) is frame_type:
                self.received += 1
                take(frame)

    def _marker(self, stream: _Stream, seq: int) -> None:
        if not stream.live:
            # the join takes effect here, where join() returns: messages published
            # between the broker's answer and this marker were pushed before it
            # (as with a one-by-one join, a push racing the join may miss it)
            stream.live = True
            stream.expected = seq + 1
            if not stream.waiter.done():
                stream.waiter.set_result(None)
            return
        if seq >= stream.expected:
            self._gap(stream, stream.expected, seq)
            stream.expected = seq + 1

    def _gap(self, stream: _Stream, first: int, last: int) -> None:
        gap = Gap(stream.channel, first, last)
        self.missed += gap.count
        if len(self.gaps) >= MAX_GAPS:
            del self.gaps[0]
        self.gaps.append(gap)
        log.warning(
            "fan-out of %r: messages %d..%d (%d) were not received",
            stream.channel, first, last, gap.count,
        )  # fmt: skip

    def expire(self, now: float) -> None:
        """Fail the joins whose marker did not come within ``READY_TIMEOUT``."""
        for token, stream in list(self.streams.items()):
            if not stream.live and now >= stream.deadline:
                del self.streams[token]
                if not stream.waiter.done():
                    stream.waiter.set_exception(
                        ConnectError(f"no fan-out from {self.endpoint} for {stream.channel!r}")
                    )

    def pending_deadline(self) -> float | None:
        waits = [s.deadline for s in self.streams.values() if not s.live]
        return min(waits) if waits else None

    def close(self) -> None:
        """The session is gone: every stream ends (a waiting join fails)."""
        for stream in self.streams.values():
            if not stream.live and not stream.waiter.done():
                stream.waiter.set_exception(ConnectError("the session ended before fan-out"))
        self.streams.clear()
        if self.sock is not None:
            self.sock.close(linger=0)
            self.sock = None
            self.endpoint = ""
