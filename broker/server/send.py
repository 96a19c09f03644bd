"""The server's send path: engine output batched to libzmq, per-peer backlogs.

Engine output is routed by client id and handed to libzmq in batches
(``ServerOptions.send_batch``), in order with every other frame the server sends, so
that libzmq's I/O thread is woken once per batch.  A frame the engine passes through
unchanged is sent as the octets received (a queue delivery is a ``broker.message.Message``,
encoded by ``broker.engine.tmqp_door``, which sends the received octets of a message
that was not changed).  A peer whose send pipe is full gets a
per-peer backlog instead of blocking the loop or losing frames, and stays connected: a
slow reader is not a dead one (only missed pings end a session), and one whose backlog
drains reads what the server sends: it is alive (``Peer.drained``) even while the
server's PING to it still waits behind that backlog.  A peer whose
connection went away is put on a list for the loop to end its session after the batch.

Queue deliveries come from the engine as ``Tracked`` frames: each one libzmq takes is
counted on its peer (``Peer.transmitted``) for the loop to report to the engine
(``Engine.transmitted``), which holds every consumer to its window; so a backlog holds at
most the peer's windows of deliveries.  Other frames (replies, events, direct messages)
are held up to ``max_backlog`` per peer; beyond that they are discarded, counted
(``overflowed``) and logged.
"""

from __future__ import annotations

import errno
import logging
from collections import deque
from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any

import zmq

from broker import batch, tmqp
from broker.engine.fanout import Publish
from broker.engine.tmqp_door import WIRE, encode
from broker.message import Message
from broker.protocol import Tracked
from broker.server.gate import OutputGate
from broker.server.options import ServerError, ServerOptions
from zproto.errors import EncodeError

log = logging.getLogger("broker.server.server")

_BIG = 65536  # frames at least this large are sent without copying
_SNDMORE_NOBLOCK = zmq.SNDMORE | zmq.NOBLOCK
_PENDING_ACK = 64  # in a TMQP frame's second octet: the receiver must acknowledge
_DELIVERY_OCTETS = batch.DELIVERY_OCTETS


class PeerState(Enum):
    AWAIT_INFO = "await-info"  # greeting answered, connection info expected
    READY = "ready"  # connected to the engine under a client id


class Peer:
    """A ROUTER peer (routing id): its handshake state, session and send backlog."""

    __slots__ = (
        "address",
        "backlog",
        "batch",
        "client_id",
        "drained",
        "drained_at",
        "last_seen",
        "overflowing",
        "pinged",
        "reassured_at",
        "rid",
        "run",
        "since",
        "state",
        "transmitted",
    )

    def __init__(self, rid: bytes, now: float) -> None:
        self.rid = rid
        self.state = PeerState.AWAIT_INFO
        self.client_id = ""
        self.since = now
        self.last_seen = now
        self.pinged = False
        #: When the server last sent it a PING while it kept sending (``PeerSessions.scan``).
        self.reassured_at = now
        #: It took frames from its backlog since the last scan: its pipe had been full and
        #: has room again, so it reads what the server sends (``drained_at``: when noticed).
        self.drained = False
        self.drained_at = float("-inf")
        #: Frames waiting for room in the peer's pipe: (octets, tracked delivery?).
        self.backlog: deque[tuple[bytes, bool]] | None = None
        #: Tracked deliveries libzmq took since the last report to the engine.
        self.transmitted = 0
        self.overflowing = False
        #: The remote address libzmq gave the connection info's message (None: unknown).
        self.address: str | None = None
        #: Deliveries one message to this peer may carry (``broker.batch``; 0: one each).
        self.batch = 0
        #: Its pushes read in the current drain, not served yet (``Server._serve_runs``):
        #: their octets, not decoded yet (plain ones and ones waiting for an acknowledge
        #: alike); None: none.
        self.run: list[bytes] | None = None


def _entries(item: list[bytes] | bytes) -> list[bytes]:
    return [item] if isinstance(item, bytes) else item


def _no_socket(*args: Any, **kw: Any) -> Any:
    raise ServerError("server socket not bound")


class SendPath:
    """Sending to peers (see the module docstring); the ``Server`` has one."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.router: zmq.Socket[bytes] | None = None
        self.in_frame: object = None  # the frame being handled and its octets
        self.in_data = b""
        self.by_client: dict[str, Peer] = {}
        self.blocked: set[Peer] = set()
        self.gone: list[Peer] = []
        self.frames_out = 0
        self.fast_send: Callable[..., Any] = _no_socket
        self.outq: list[tuple[Peer, bytes, bool]] = []
        #: Peers whose ``transmitted`` count waits to be reported to the engine.
        self.sent_to: list[Peer] = []
        self.flush_at = options.send_batch
        #: Deliveries without acknowledge one delivery batch may carry (0: none), and
        #: their octets at most (``ServerOptions.unacked_batch_octets``).
        self.unacked_batch = options.unacked_batch
        self.unacked_octets = options.unacked_batch_octets
        #: The broadcast fan-out socket (``broker.server.fanout``); None: not bound.
        self.fanout: Any = None
        #: The fan-out socket may hold a run of deliveries for ``flush_out`` to send.
        self.fanning = False
        #: Connected peers that read delivery batches (``Peer.batch``; a count: flush_out
        #: looks at ``batchable``, what the queued output holds).
        self.batching = 0
        #: ``outq`` holds a group of deliveries (``_grouped``, ``_send_groups``): to a peer
        #: that reads batches, awaiting its acknowledge (or any, with ``unacked_batch``).
        #: False: the plain flush.
        self.batchable = False
        #: The delivery groups open in ``outq``, by peer: [its entries, how many, their
        #: octets]; a group is an ``outq`` item whose data is that list of entries.
        self.groups: dict[Peer, list[Any]] = {}
        #: The group that took the last delivery: [entries, how many, octets, its peer,
        #: the most deliveries without acknowledge it may hold] (None: none open).
        self.last_group: list[Any] | None = None
        #: Holds engine output until the store made it durable (None: memory only).
        self.gate: OutputGate | None = None
        self.counters: dict[str, int] = dict.fromkeys(
            (
                "frames_in",
                "bad_frames",
                "refused",
                "expired",
                "dropped_out",
                "engine_errors",
                "backlogged",
                "overflowed",
                "batched_in",
                "batch_refused",
                "batched_out",
                "run_pushes",
                "octets_pushes",
            ),
            0,
        )

    def send_all(self, outs: Iterable[Any]) -> None:
        """Send engine output, through the durability gate when there is one
        (``broker.server.gate``: held until the store writes it depends on are durable)."""
        if self.gate is None:
            self.send_now(outs)
        else:
            self.gate.admit(list(outs))

    def send_now(self, outs: Iterable[Any]) -> None:
        """Encode and route engine output; consecutive equal frames are encoded once."""
        # (indexed: ``_extend_group`` moves on in it)
        items = outs if outs.__class__ is list else list(outs)
        by_client = self.by_client
        outq = self.outq
        flush_at = self.flush_at
        prev: tmqp.Frame | None = None
        in_frame = self.in_frame
        data = b""
        # the peer of the item before: a run's deliveries to one consumer look it up once
        to: str | None = None
        peer: Peer | None = None
        i = 0
        n = len(items)
        while i < n:
            out = items[i]
            i += 1
            client_id, frame = out
            if frame is not prev:
                prev = frame
                if frame is in_frame:
                    data = self.in_data
                elif frame.__class__ is bytes:  # a push delivered as its octets (octets_run)
                    data = frame
                elif frame.__class__ is Message:  # a queue delivery
                    wire = frame.wire
                    try:
                        data = wire[1] if wire is not None and wire[0] is WIRE else encode(frame)
                    except EncodeError as exc:
                        log.error("engine produced an unencodable message: %s", exc)
                        self.counters["engine_errors"] += 1
                        data = b""
                elif frame is None:  # a fan-out marker
                    data = b""
                else:
                    try:
                        data = frame.encode()[0]
                    except (EncodeError, AttributeError) as exc:
                        log.error("engine produced an unencodable frame: %s", exc)
                        self.counters["engine_errors"] += 1
                        data = b""
            if client_id is not to:
                to = client_id
                peer = by_client.get(client_id)
            tracked = out.__class__ is Tracked
            if peer is None:
                if out.__class__ is Publish and self.fanout is not None:
                    self.fanout.publish(client_id, data)  # (client_id: the head frame)
                    self.fanning = True  # the run goes with flush_out
                    continue
                # gone: the engine returns tracked deliveries when it disconnects the client
                self.counters["dropped_out"] += 1
            elif not data:
                self.counters["dropped_out"] += 1
                if tracked:  # keep the engine's count in step (the error is counted)
                    self.count_sent(peer)
            elif peer.backlog or (size := len(data) + 4) >= _BIG + 4:
                self.send_raw(peer, data, tracked)
                outq = self.outq  # _send_raw flushed the batch: a new list
            else:  # the common case: sent with the batch (see _flush_out)
                if tracked and peer.batch:
                    group = self.last_group  # (the group of the delivery before, if any)
                    if group is not None and group[3] is peer:
                        # (size: its octets and its length in the batch)
                        ack = data[1] & _PENDING_ACK
                        if group[1] < (peer.batch if ack else group[4]) and group[2] + size <= (
                            _DELIVERY_OCTETS if ack else self.unacked_octets
                        ):
                            group[0].append(data)
                            group[1] += 1
                            group[2] += size
                            # and the deliveries to it that follow, in a loop of their own
                            i = self._extend_group(group, items, i, client_id, ack)
                            prev = None
                            continue
                    if self._grouped(peer, data, outq):
                        outq = self.outq  # (a new list if the group filled the batch)
                        continue
                elif self.groups:
                    self._end_group(peer)  # (another frame to it: its group ends)
                outq.append((peer, data, tracked))
                if len(outq) >= flush_at:
                    self.flush_out()
                    outq = self.outq

    def _extend_group(
        self, group: list[Any], outs: list[Any], i: int, client_id: str, ack: int
    ) -> int:
        """``send_now`` appending to the open ``group`` of a peer (no backlog) the
        deliveries from ``outs[i]`` on that go to the same client, as each alone would
        join it: passed through unchanged, of the same acknowledge kind, within the
        group's bounds in entries and octets; returns the index of the first other one
        (``send_now`` takes it its own way).  The loop of a run's deliveries, with no
        look-up per delivery of what cannot change within it."""
        entries, count, octets, peer, most = group
        if ack:
            most = peer.batch
            limit = _DELIVERY_OCTETS
        else:
            limit = self.unacked_octets
        add = entries.append
        n = len(outs)
        while i < n and count < most:
            out = outs[i]
            if out.__class__ is not Tracked or out[0] is not client_id:
                break
            m = out[1]
            if m.__class__ is bytes:  # a push delivered as its octets (octets_run)
                data = m
            elif m.__class__ is not Message:
                break
            else:
                wire = m.wire
                if wire is None or wire[0] is not WIRE:
                    break
                data = wire[1]
            size = len(data) + 4
            # (a delivery of _BIG octets or more is sent alone: send_raw)
            if (
                size < 6
                or size >= _BIG + 4
                or data[1] & _PENDING_ACK != ack
                or octets + size > limit
            ):
                break
            add(data)
            count += 1
            octets += size
            i += 1
        group[1] = count
        group[2] = octets
        return i

    def _grouped(self, peer: Peer, data: bytes, outq: list[Any]) -> bool:
        """Put a delivery to a peer that reads batches in its open group, or open one
        (True), within its bounds (see ``_send_groups``); False: it travels alone."""
        size = len(data) + 4  # (and its length in the batch)
        cap = unacked_cap = min(peer.batch, self.unacked_batch)
        if data[1] & _PENDING_ACK:
            cap = peer.batch
            octets = _DELIVERY_OCTETS
        else:  # done once libzmq took it: bounded in entries and octets
            octets = self.unacked_octets
            if not cap or size > octets:
                if self.groups:
                    self._end_group(peer)
                return False
        groups = self.groups
        group = groups.get(peer)
        if group is not None and group[1] < cap and group[2] + size <= octets:
            group[0].append(data)
            group[1] += 1
            group[2] += size
            self.last_group = group
            return True
        entries = [data]
        groups[peer] = self.last_group = [entries, 1, size, peer, unacked_cap]
        outq.append((peer, entries, True))
        self.batchable = True
        if len(outq) >= self.flush_at:
            self.flush_out()
        return True

    def _end_group(self, peer: Peer) -> None:
        group = self.groups.pop(peer, None)
        if group is not None and group is self.last_group:
            self.last_group = None

    def count_sent(self, peer: Peer) -> None:
        if not peer.transmitted:
            self.sent_to.append(peer)
        peer.transmitted += 1

    def take_transmitted(self) -> dict[str, int]:
        """Tracked deliveries sent per client id since the last call (for the engine)."""
        peers, self.sent_to = self.sent_to, []
        counts: dict[str, int] = {}
        for peer in peers:
            if peer.transmitted:
                counts[peer.client_id] = counts.get(peer.client_id, 0) + peer.transmitted
                peer.transmitted = 0
        return counts

    def flush_out(self) -> None:
        """Send the frames batched by send_all, in order.

        Sending a batch at a time (at the end of a socket drain, at most ``flush_at``
        frames later) lets libzmq's I/O thread take many frames per wake-up instead of
        being woken for nearly every frame.  The fan-out socket's run goes first.
        """
        if self.fanning:
            self.fanning = False
            self.fanout.flush()
        outq = self.outq
        if not outq:
            return
        self.outq = []
        if self.batchable:  # (else nothing in it may share a message: one by one)
            self.batchable = False
            self.groups = {}
            self.last_group = None
            self._send_groups(outq)
            return
        send = self.fast_send
        sent = 0
        sent_to = self.sent_to
        for peer, data, tracked in outq:
            if peer.backlog:
                self._queue(peer, data, tracked)
                continue
            try:
                send(peer.rid, _SNDMORE_NOBLOCK)
            except zmq.ZMQError:
                self.send_raw(peer, data, tracked)  # full pipe or gone: the slow path decides
                continue
            send(data, zmq.NOBLOCK)
            sent += 1
            if tracked:
                if not peer.transmitted:
                    sent_to.append(peer)
                peer.transmitted += 1
        self.frames_out += sent

    def _send_groups(self, groups: list[tuple[Peer, Any, bool]]) -> None:
        """``flush_out`` when some peers read delivery batches (``broker.batch``): each
        such peer's deliveries that follow one another in the output (no other frame to
        it between them) were gathered where they were queued (``_grouped``) and go out
        as one message of up to ``Peer.batch`` of them and ``batch.DELIVERY_OCTETS``
        octets; each delivery in it counts as sent.

        Deliveries that wait for the consumer's acknowledge share a message: those stay
        in flight, within the consumer's prefetch, until acknowledged, wherever they are.
        One without acknowledge is done once libzmq took it, and the pipe's high-water
        mark counts messages: a consumer that stops reading holds ``pipe_hwm`` messages in
        its pipe, so such deliveries share one only up to ``ServerOptions.unacked_batch``
        entries and ``unacked_batch_octets`` octets (a bigger one travels alone): its pipe
        holds at most ``pipe_hwm`` times that many octets, as if each delivery were that
        big (``ServerOptions.pipe_hwm``)."""
        send = self.fast_send
        sent = 0
        for peer, item, tracked in groups:
            if isinstance(item, bytes):
                data, count = item, 1
            elif len(item) == 1:
                data, count = item[0], 1
            else:
                data, count = batch.deliveries_frame(item), len(item)
            if peer.backlog:
                self._queue_each(peer, item, tracked)
                continue
            try:
                send(peer.rid, _SNDMORE_NOBLOCK)
            except zmq.ZMQError:
                # full pipe or gone: the slow path decides, one delivery at a time
                for one in _entries(item):
                    self.send_raw(peer, one, tracked)
                continue
            send(data, zmq.NOBLOCK)
            sent += 1
            if count > 1:
                self.counters["batched_out"] += count
            if tracked:
                if not peer.transmitted:
                    self.sent_to.append(peer)
                peer.transmitted += count
        self.frames_out += sent

    def _queue_each(self, peer: Peer, item: list[bytes] | bytes, tracked: bool) -> None:
        for one in _entries(item):
            self._queue(peer, one, tracked)

    def send_to(self, peer: Peer, frame: tmqp.Frame) -> None:
        self.send_raw(peer, tmqp.encode(frame)[0])

    def send_raw(self, peer: Peer, data: bytes, tracked: bool = False) -> None:
        if self.outq:
            self.flush_out()  # keep the order
        if peer.backlog:
            self._queue(peer, data, tracked)
            return
        router = self.router
        assert router is not None
        try:
            router.send(peer.rid, _SNDMORE_NOBLOCK)
        except zmq.Again:
            self._queue(peer, data, tracked)
            return
        except zmq.ZMQError as exc:
            if exc.errno == errno.EHOSTUNREACH:
                self.gone.append(peer)  # the connection went away; clean up after this batch
                return
            raise
        router.send(data, zmq.NOBLOCK, copy=len(data) < _BIG)
        self.frames_out += 1
        if tracked:
            self.count_sent(peer)

    def send_rid(self, rid: bytes, data: bytes) -> None:
        """Send to a peer that has no session (handshake replies); dropped if unreachable."""
        if self.outq:
            self.flush_out()
        router = self.router
        assert router is not None
        try:
            router.send(rid, _SNDMORE_NOBLOCK)
        except zmq.ZMQError:
            return
        router.send(data, zmq.NOBLOCK)

    def _queue(self, peer: Peer, data: bytes, tracked: bool) -> None:
        backlog = peer.backlog
        if backlog is None:
            backlog = peer.backlog = deque()
        if not tracked and len(backlog) >= self.options.max_backlog:
            # Deliveries are bounded by the engine's windows; other frames by this limit.
            self.counters["overflowed"] += 1
            if not peer.overflowing:
                peer.overflowing = True
                log.warning(
                    "client %s is not reading: frames beyond %d discarded",
                    peer.client_id,
                    self.options.max_backlog,
                )
            return
        backlog.append((data, tracked))
        self.blocked.add(peer)
        self.counters["backlogged"] += 1

    def flush_backlogs(self) -> None:
        router = self.router
        assert router is not None
        for peer in list(self.blocked):
            backlog = peer.backlog
            while backlog:
                data, tracked = backlog[0]
                try:
                    router.send(peer.rid, _SNDMORE_NOBLOCK)
                except zmq.Again:
                    break
                except zmq.ZMQError:
                    backlog.clear()
                    self.gone.append(peer)
                    break
                router.send(data, zmq.NOBLOCK, copy=len(data) < _BIG)
                backlog.popleft()
                peer.drained = True
                self.frames_out += 1
                if tracked:
                    self.count_sent(peer)
            if not backlog:
                peer.backlog = None
                peer.overflowing = False
                self.blocked.discard(peer)
