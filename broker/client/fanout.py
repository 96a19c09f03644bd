"""The client's side of broadcast fan-out (``broker.engine.fanout``): one SUB socket.

A JOIN the broker answered with a fan-out grant (``session.Fanout``) subscribes the
channel's stream token (this SUB's own filter) and the member's ticket (the broker's
XPUB applies the token to this SUB's pipe when it sees the ticket) on a SUB connected to
the announced endpoint (CURVE with the client's keys when it uses CURVE; a wildcard host
is replaced by the broker's host).  The join completes when the stream's marker arrives:
the subscription is live from then on, and that is where the join takes effect (every
message pushed after ``join()`` returned comes; one pushed while it waited may not, as a
push racing a one-by-one join).  A join of a channel whose stream this client already
reads completes at once.  From there each stream's sequence numbers must follow one
another; a jump is a *gap*: messages dropped at a full pipe (the broker's ``fanout_hwm``
and this SUB's high-water mark, both counted in runs).  A gap is never silent: it is
logged, counted and kept in :attr:`FanoutReader.gaps` (``Client.fanout_gaps``).  The
broker never resends a broadcast.

When another member leaves, the broker replaces the stream's token and tells this client
(``session.Fanout`` without a waiter, with the old token's last number): the new token
and ticket are subscribed beside the old ones; the old token's messages are read up to
that number, the new one's marker makes it live, and the old subscription goes.  The
numbers run on across the change, so a message lost there is a reported gap too.

Each message of the SUB is a *run* (``broker.fanout``): the head's number is its first
delivery's, the others follow one by one; one ``recv`` and one unpack of the run's table
per run (libzmq's per-message work is paid once for all its deliveries), then slices.

Raw reading (``Client(raw_fanout=...)``, :meth:`FanoutReader.read_raw`): the payloads
(or ``(number, payload)`` pairs) of a batch of deliveries as one list, without building
frames or messages; their headers and ids are not read.

The session's loss ends every stream (a re-join after a reconnect takes the one-by-one
path); a LEAVE unsubscribes.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import zmq

from broker import tmqp
from broker.client.errors import ConnectError
from broker.client.session import Fanout
from broker.client.sockets import Curve
from broker.fanout import COUNT, HEAD_SIZE, ROW, SEQ, TABLE_AT, TOKEN_SIZE, table
from broker.fanout import TABLES as _TABLES
from zerohub import zmqkit
from zproto.errors import DecodeError

log = logging.getLogger("broker.client")

#: Seconds a fan-out join waits for its marker before it fails.
READY_TIMEOUT = 10.0
#: Gaps kept for the application (the oldest are forgotten beyond this; all are counted).
MAX_GAPS = 1000
#: Published messages (runs, ``broker.fanout``) one read takes at most.
_BATCH = 1024
_unpack_seq = SEQ.unpack_from
_unpack_count = COUNT.unpack_from
_TABLE_AT = TABLE_AT
_ROW_SIZE = ROW.size
_NOBLOCK = int(zmq.NOBLOCK)
_EVENTS = int(zmq.EVENTS)
#: Raw reading: milliseconds a poll-on-call client's receive may block on the SUB alone
#: (its receive timeout) before the client's loop takes a whole step again.
RAW_WAIT_MS = 20
_decode = tmqp.decode
_decode_run = tmqp.decode_run
_waiting_fields = tmqp.waiting_fields
#: Batches read with every field decoded at once after the application was seen reading
#: the fields of lazy ones (then a lazy batch looks again).
EAGER_BATCHES = 64


def _rows(data: bytes, size: int, channel: str) -> tuple[int, tuple[int, ...]]:
    """Where a run's first delivery starts and its table's rows (payload start, end, ...)
    up to the first one its frame contradicts (a cut or garbled run: the deliveries
    after it are a gap, reported at the stream's next head)."""
    count = _unpack_count(data, HEAD_SIZE)[0] if size >= _TABLE_AT else 0
    at = _TABLE_AT + _ROW_SIZE * count
    if count == 0 or size < at:
        log.warning("a fan-out run without its table on %r", channel)
        return at, ()
    rows: tuple[int, ...] = table(count).unpack_from(data, _TABLE_AT)
    if rows[-1] == size and at <= rows[0]:
        return at, rows  # (the broker's runs: checked whole by their last end)
    log.warning("a cut fan-out run on %r", channel)
    prev = at
    for i in range(0, len(rows), 2):
        if not prev <= rows[i] <= rows[i + 1] <= size:
            return at, rows[:i]
        prev = rows[i + 1]
    return at, rows


def _framed(data: bytes, at: int, rows: tuple[int, ...]) -> tuple[int, ...]:
    """The leading ``rows`` of a damaged run (``_rows``) whose deliveries decode where
    their rows say, payload included: raw reading slices payloads where a table says, so
    a table that contradicts itself (rows swapped, an end going backwards) must not pick
    another delivery's octets.  The deliveries from the first that does not are a gap."""
    prev = at
    for i in range(0, len(rows), 2):
        start, end = rows[i], rows[i + 1]
        try:
            frame = _decode((data[prev:end],))
        except DecodeError:
            return rows[:i]
        if type(frame) is not tmqp.Frame or len(frame.payload) != end - start:
            return rows[:i]
        prev = end
    return rows


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
    __slots__ = ("base", "channel", "deadline", "expected", "live", "replaces", "ticket",
                 "token", "waiters")  # fmt: skip

    def __init__(self, grant: Fanout, now: float) -> None:
        self.channel = grant.channel
        self.token = grant.token
        self.ticket = grant.ticket
        self.waiters: list[Any] = [grant.waiter] if grant.waiter is not None else []
        self.deadline = now + READY_TIMEOUT
        #: The next sequence number due (set again from the first marker).
        self.expected = grant.seq + 1
        self.live = False
        #: A token change: the old token's last number (None: a join).
        self.base: int | None = None
        #: The streams (old tokens) this one replaces once live.
        self.replaces: list[_Stream] = []


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

    def __init__(
        self, context: Any, curve: Curve | None, hwm: int, broker: str, raw: str = ""
    ) -> None:
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
        #: Raw reading (``read_raw``): "payloads" or "numbered"; "": frames (``read``).
        self.raw = raw
        #: Batches read raw, for the application (appended here, taken by it).
        self.batches: deque[list[Any]] = deque()
        #: Message reading: the first and last frames of the last lazy batch, to see
        #: whether the application reads the fields (``read``), and eager batches left.
        self.probe: tuple[tmqp.Frame, tmqp.Frame] | None = None
        self.eager_left = 0
        #: Raw deliveries put into / taken out of ``batches`` (one writer each).
        self.raw_in = 0
        self.raw_out = 0

    @property
    def held(self) -> int:
        """Raw deliveries read and not taken by the application yet."""
        return self.raw_in - self.raw_out

    def grant(self, grant: Fanout, now: float) -> None:
        """Subscribe a granted stream (a join completes at its marker), or a stream's new
        token (``grant.waiter`` None)."""
        current = [st for st in self.streams.values() if st.channel == grant.channel]
        if grant.waiter is None:
            if not current:
                return  # (left already)
        else:
            same = self.streams.get(grant.token)
            if same is not None:  # joined again: the stream is read already
                if same.live:
                    if not grant.waiter.done():
                        grant.waiter.set_result(None)
                else:
                    same.waiters.append(grant.waiter)
                return
        endpoint = reachable(grant.endpoint, self.broker)
        if self.sock is not None and endpoint != self.endpoint:
            err = ConnectError(f"a second fan-out endpoint {endpoint} (have {self.endpoint})")
            if grant.waiter is not None:
                grant.waiter.set_exception(err)
            else:
                log.warning("fan-out of %r: %s", grant.channel, err)
            return
        if self.sock is None:
            sock = self.context.socket(zmq.SUB)
            sock.linger = 0
            sock.rcvhwm = self.hwm
            if self.raw:
                sock.rcvtimeo = RAW_WAIT_MS
            if self.curve is not None:
                try:
                    zmqkit.configure_client(sock, self.curve.secret, self.curve.server_key)
                except zmqkit.SecurityError as exc:
                    sock.close(linger=0)
                    if grant.waiter is not None:
                        grant.waiter.set_exception(ConnectError(str(exc)))
                    return
            sock.connect(endpoint)
            self.sock, self.endpoint = sock, endpoint
        stream = _Stream(grant, now)
        if grant.waiter is None:
            for old in current:
                if old.live:
                    # its messages up to grant.seq are still to come on this SUB
                    stream.replaces.append(old)
                    stream.base = grant.seq
                else:  # a join still waiting: it completes on the new token
                    stream.waiters += old.waiters
                    stream.deadline = old.deadline
                    self._drop(old)
        self.streams[grant.token] = stream
        self.sock.setsockopt(zmq.SUBSCRIBE, grant.token)  # this SUB's own filter
        self.sock.setsockopt(zmq.SUBSCRIBE, grant.ticket)  # the broker applies the token

    def _drop(self, stream: _Stream) -> None:
        if self.streams.get(stream.token) is stream:
            del self.streams[stream.token]
        if self.sock is not None:
            self.sock.setsockopt(zmq.UNSUBSCRIBE, stream.token)
            self.sock.setsockopt(zmq.UNSUBSCRIBE, stream.ticket)

    def leave(self, channel: str) -> None:
        for stream in list(self.streams.values()):
            if stream.channel == channel:
                self._drop(stream)

    def read(self) -> list[tmqp.Frame]:
        """Read what the SUB holds (one batch): each delivery's frame in order, gaps
        reported.  A run's deliveries are checked and made by ``tmqp.decode_run``: no
        call per delivery, fields other than the payload decoded when first read.  An
        application that reads them (the first or last frame of the last lazy batch has
        its fields decoded by the next read) gets the next :data:`EAGER_BATCHES` batches
        decoded at once instead (cheaper than in place), then lazy ones again."""
        sock = self.sock
        out: list[tmqp.Frame] = []
        if sock is None:
            return out
        probe = self.probe
        if probe is not None and not (_waiting_fields(probe[0]) and _waiting_fields(probe[1])):
            self.eager_left = EAGER_BATCHES  # the application reads the fields
        self.probe = None
        lazy = self.eager_left == 0
        if not lazy:
            self.eager_left -= 1
        recv = sock.recv
        try:
            data = recv(_NOBLOCK)
        except zmq.Again:
            return out
        self._read_run(data, out, lazy)
        # one look at the socket's events, as ``read_raw``: a wake-up that finds one run
        # (the common case) costs no raised zmq.Again, a burst is read on to it
        if sock.getsockopt(_EVENTS) & 1:  # type: ignore[operator]
            for _ in range(_BATCH - 1):
                try:
                    data = recv(_NOBLOCK)
                except zmq.Again:
                    break
                self._read_run(data, out, lazy)
        if lazy and out:
            self.probe = (out[0], out[-1])
        return out

    def _read_run(self, data: bytes, out: list[tmqp.Frame], lazy: bool) -> None:
        stream = self.streams.get(data[:TOKEN_SIZE])
        size = len(data)
        if stream is None or size < HEAD_SIZE:
            return  # (left, replaced, a stream of an earlier session, not a head)
        seq = _unpack_seq(data, TOKEN_SIZE)[0]
        if size == HEAD_SIZE:  # a marker: the last number sent
            self._marker(stream, seq)
            return
        expected = stream.expected
        if seq > expected:
            self._gap(stream, expected, seq - 1)
        at, rows = _rows(data, size, stream.channel)
        ends = rows[1::2]
        if seq < expected and ends:  # the first ones were sent before this client's join
            skip = min(expected - seq, len(ends))
            at = ends[skip - 1]
            ends = ends[skip:]
            seq += skip
        frames, bad = _decode_run(data, at, ends, lazy)
        if bad:  # missed: gaps, never silent
            log.warning("undecodable fan-out messages on %r", stream.channel)
            first = last = bad[0]
            for i in bad[1:]:
                if i != last + 1:
                    self._gap(stream, seq + first, seq + last)
                    first = i
                last = i
            self._gap(stream, seq + first, seq + last)
        self.received += len(frames)
        out += frames
        seq += len(ends)
        if seq > stream.expected:
            stream.expected = seq

    def read_raw(self, wait: bool = False) -> int:
        """``read`` for raw reading: one batch of payloads (``raw`` "payloads") or
        ``(number, payload)`` pairs ("numbered") appended to ``batches``; how many.
        ``wait``: the first receive may block, :data:`RAW_WAIT_MS` at most (the SUB's
        receive timeout; cheaper than a poll, where nothing else needs watching).
        The payloads are sliced where the run's table says (deliveries are not read)."""
        sock = self.sock
        if sock is None:
            return 0
        recv = sock.recv
        try:
            data = recv(0 if wait else _NOBLOCK)
        except zmq.Again:
            return 0
        datas = [data]
        # one look at the socket's events: a lone message (a trickle) costs no zmq.Again
        # (a raised exception costs several microseconds), a burst is read on to it
        if sock.getsockopt(_EVENTS) & 1:  # type: ignore[operator]
            more = datas.append
            try:
                for _ in range(_BATCH - 1):
                    more(recv(_NOBLOCK))
            except zmq.Again:
                pass
        streams = self.streams
        numbered = self.raw == "numbered"
        tables = _TABLES
        got: list[Any] = []
        for data in datas:
            stream = streams.get(data[:TOKEN_SIZE])
            size = len(data)
            if stream is None or size <= HEAD_SIZE:
                if stream is not None and size == HEAD_SIZE:
                    self._marker(stream, _unpack_seq(data, TOKEN_SIZE)[0])
                continue
            seq = _unpack_seq(data, TOKEN_SIZE)[0]
            expected = stream.expected
            if seq > expected:
                self._gap(stream, expected, seq - 1)
            # the broker's runs, checked whole by their last end (else _rows checks each)
            count = data[HEAD_SIZE] | data[HEAD_SIZE + 1] << 8 if size >= _TABLE_AT else 0
            layout = tables.get(count)
            rows: Any = None
            if layout is not None and size >= _TABLE_AT + _ROW_SIZE * count:
                rows = layout.unpack_from(data, _TABLE_AT)
                # whole and in order (each row after the one before): a table that
                # contradicts itself is read the checked way, deliveries decoded
                if (
                    rows[-1] != size
                    or rows[0] < _TABLE_AT + _ROW_SIZE * count
                    or list(rows) != sorted(rows)
                ):
                    rows = None
            if rows is None:
                at, rows = _rows(data, size, stream.channel)
                rows = _framed(data, at, rows)
            if len(rows) == 2:  # (a run of one: no loop)
                payloads = [data[rows[0] : rows[1]]]
            else:
                pairs = iter(rows)
                payloads = [data[start:end] for start, end in zip(pairs, pairs, strict=False)]
            if seq < expected:  # (the first ones were sent before this client's join)
                del payloads[: expected - seq]
                first = expected
            else:
                first = seq
            if numbered:
                got += zip(range(first, first + len(payloads)), payloads, strict=False)
            else:
                got += payloads
            seq += len(rows) // 2
            if seq > stream.expected:
                stream.expected = seq
        if got:
            self.received += len(got)
            self.raw_in += len(got)
            self.batches.append(got)
        return len(got)

    def _marker(self, stream: _Stream, seq: int) -> None:
        if not stream.live:
            # the join takes effect here, where join() returns: messages published
            # between the broker's answer and this marker were pushed before it
            # (as with a one-by-one join, a push racing the join may miss it); after a
            # token change the numbers run on from the old token's last one
            stream.live = True
            if stream.base is not None:
                for old in stream.replaces:
                    if old.expected <= stream.base:  # the old token's tail never came
                        self._gap(old, old.expected, stream.base)
                    self._drop(old)
                stream.replaces = []
                if seq >= stream.expected:
                    self._gap(stream, stream.expected, seq)
                stream.expected = max(stream.expected, seq + 1)
            else:
                stream.expected = seq + 1
            for waiter in stream.waiters:
                if not waiter.done():
                    waiter.set_result(None)
            stream.waiters = []
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
        for stream in list(self.streams.values()):
            if not stream.live and stream.waiters and now >= stream.deadline:
                self._drop(stream)
                for waiter in stream.waiters:
                    if not waiter.done():
                        waiter.set_exception(
                            ConnectError(f"no fan-out from {self.endpoint} for {stream.channel!r}")
                        )

    def pending_deadline(self) -> float | None:
        waits = [s.deadline for s in self.streams.values() if not s.live and s.waiters]
        return min(waits) if waits else None

    def close(self) -> None:
        """The session is gone: every stream ends (a waiting join fails)."""
        for stream in self.streams.values():
            for waiter in stream.waiters:
                if not waiter.done():
                    waiter.set_exception(ConnectError("the session ended before fan-out"))
        self.streams.clear()
        if self.sock is not None:
            self.sock.close(linger=0)
            self.sock = None
            self.endpoint = ""
