"""The broker's ZeroMQ front end: one ROUTER socket in front of the sans-IO engine.

Every ZeroMQ message carries one TMQP frame.  Each peer (a ROUTER routing id)
goes through a small handshake state machine before its frames reach the engine::

    (unknown) --"TMQP/2.0"--> AWAIT_INFO --connection info--> READY
         \\--anything else--> TERMINATE "handshake required"/"unsupported protocol"

The server owns all I/O: it decodes frames, feeds them to ``Engine.receive``
with a clock value, encodes the ``Outgoing`` frames it gets back and routes
them by client id.  It drains every ready message (non-blocking) before polling
again, drives ``Engine.tick`` from ``Engine.next_deadline`` through the poll
timeout, pings quiet peers and expires silent ones.  A peer whose send pipe is
full gets a per-peer backlog instead of blocking the loop or losing frames, and keeps
its session: only silence ends it.  Flow control: the loop reports to
``Engine.transmitted`` how many queue deliveries (``Tracked`` frames) of each peer
libzmq took, and the engine releases more only then (``broker.flow``), so a slow
consumer's backlog stays within its windows; before a peer's session ends the engine
hears what it got, and puts the rest back in the queues.

Hot path: plain frames take the generated codec's fast path (``tmqp.decode``); pushes without
headers that wait for no response (plain, or waiting for an acknowledge: their first two
octets say so) wait undecoded in their producer's run until the drain ends, then each run is
decoded in one call straight into the engine's messages (``tmqp.decode_message_records``)
and served in one engine call (``Engine.receive_pushes``) -- or, where a run goes into a
queue whose one consumer (a peer of this server) has room, delivered as the very octets
it came in, no message made (``Engine.receive_push_octets``, ``ServerOptions.push_octets``);
a frame the engine passes through unchanged is forwarded as the octets received; engine output is
handed to libzmq in batches (``ServerOptions.send_batch``), in order with every
other frame the server sends, so that libzmq's I/O thread is woken once per batch.

Bad input never stops the loop: undecodable or multi-part messages get a
``RESPONSE`` with a status code and a ``Reason`` header (echoing the message id
when it can be read), and an engine exception answers ``FAILED``.  A message
larger than ``max_frame_size`` never gets here: it is the socket's
ZMQ_MAXMSGSIZE, so libzmq drops the sender's connection as soon as it announces
the size, without buffering the message.

:class:`Server` has its parts, one module each: a ``SendPath`` (``broker.server.send``:
the send path and backlogs) and ``PeerSessions`` (``broker.server.peers``: handshake,
sessions, keep-alive, which reply through the send path); this module holds the
lifecycle, the receive loop and statistics; ``broker.server.options`` holds
:class:`ServerOptions` and :class:`ServerError`.

Default endpoint: ``tcp://127.0.0.1:5680`` (``protocol.DEFAULT_ENDPOINT``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from broker import batch, tmqp
from broker.engine.limits import MIN_REPLY_SIZE
from broker.engine.tmqp_door import WIRE
from broker.message import Message
from broker.paging import json_size
from broker.protocol import (
    GREETING,
    Header,
    MessageType,
    NackReason,
    Operation,
    Outgoing,
    ResultCode,
    header,
)
from broker.server.fanout import FanoutDoor
from broker.server.gate import DurableLike, OutputGate
from broker.server.links import Connections
from broker.server.options import ServerError, ServerOptions
from broker.server.peers import (
    EngineLike,
    PeerSessions,
    error_frame,
    salvage_message_id,
    terminate_frame,
)
from broker.server.send import Peer, PeerState, SendPath
from broker.server.wait import CountsSends, LoopWait
from zerohub import zmqkit
from zerohub.wakeup import Wakeup
from zproto.errors import DecodeError

__all__ = [
    "REPLY_OVERHEAD",
    "STATS_OPERATION",
    "EngineLike",
    "PeerState",
    "Server",
    "ServerError",
    "ServerOptions",
    "error_frame",
    "salvage_message_id",
    "terminate_frame",
]

log = logging.getLogger(__name__)

_PONG = tmqp.encode(tmqp.Pong())[0]
_TERMINATE = int(MessageType.TERMINATE)
_SERVER = int(MessageType.SERVER)
_QUEUE = int(MessageType.QUEUE)
_ACK = int(MessageType.ACK)
_BATCH = batch.BATCH
_Frame = tmqp.Frame
_decode = tmqp.decode
_decode_entries = tmqp.decode_entries
_records = tmqp.decode_message_records
#: Options octet of a frame that waits for a response (0x80) or an acknowledge (0x40) or
#: has a header block (0x20): not a plain push.
_NOT_PLAIN = 0xE0
#: ... waits for a response or has a header block: a push that does not join a run (one
#: waiting for an acknowledge does: its record keeps the flag and the message id).
_NOT_IN_RUN = 0xA0
#: Low 6 bits of the first octet: the message type.
_TYPE_BITS = 63
#: Where a batch payload's first entry has its first octet (type) and its options octet
#: (after the entry's 4-octet length, ``broker.batch``).
_FIRST_TYPE = 4
_FIRST_OPTIONS = 5

#: Server operation (content type) answered by the server itself: a RESPONSE whose payload
#: is the JSON of ``Server.stats()``.  Needs the engine authorizer's ADMIN action.
STATS_OPERATION = int(Operation.STATS)

_READY = PeerState.READY
_ONLY_PUSHES_AND_ACKS = "a batch holds queue pushes and acknowledges only"
#: Messages received between two reports of sent deliveries during one socket drain.
_REPORT_EVERY = 256
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
#: Octets CURVE adds to a message on the wire, which libzmq counts against ZMQ_MAXMSGSIZE:
#: the MESSAGE command's name and nonce (16), the box's MAC (16) and the flags octet.
_CURVE_OVERHEAD = 33
#: Octets a reply frame may need beside its JSON payload (message id, client id, the
#: Page-Next header...): ``Limits.max_reply_size`` must leave this much of a frame free.
REPLY_OVERHEAD = 4096


def _pushes_and_acks(
    frames: Sequence[tmqp.Message | None], refused: list[tuple[int, str, str]]
) -> list[tuple[int, tmqp.Frame]]:
    """The entries of a batch (index, frame) that are queue pushes or acknowledges waiting
    for no response; the others are refused by index (None: refused already, malformed)."""
    taken: list[tuple[int, tmqp.Frame]] = []
    for index, frame in enumerate(frames):
        if frame is None:
            continue
        if (
            type(frame) is not _Frame
            or frame.pending_response
            or (frame.message_type != _QUEUE and frame.message_type != _ACK)
        ):
            refused.append((index, NackReason.BAD_REQUEST, _ONLY_PUSHES_AND_ACKS))
            continue
        taken.append((index, frame))
    return taken


class Server:
    """ROUTER front end of one engine.

    ``start()`` binds and serves on a background thread (``stop()`` ends it through a
    ``zerohub.wakeup.Wakeup``); ``run()`` serves on the calling thread until ``stop()`` is
    called from elsewhere.  ``clock`` (monotonic seconds) is injectable for tests.
    """

    def __init__(
        self,
        engine: EngineLike,
        options: ServerOptions | None = None,
        *,
        context: zmq.Context[zmq.Socket[bytes]],
        clock: Callable[[], float] = time.monotonic,
        durable: DurableLike | None = None,
    ) -> None:
        self.options = options = options or ServerOptions()
        self.engine = engine
        #: The send path: engine output batched to libzmq, per-peer backlogs.
        self.sender = SendPath(options)
        #: With a durable store (the engine's), output waits for the writes it depends on.
        self.gate = OutputGate(durable, self.sender.send_now) if durable is not None else None
        self.sender.gate = self.gate
        #: The peers: handshakes, sessions, keep-alive, expiry.
        self.sessions = PeerSessions(engine, options, self.sender)
        #: Transport counters (shared by the send path and the sessions).
        self.counters = self.sender.counters
        # read per message received: the sessions' table of peers by routing id
        self._peers = self.sessions.by_rid
        self.context = context
        self.clock = clock
        self.endpoint: str | None = None  # the bound endpoint (port resolved)
        #: How stop() ends the loop (made when serving starts).
        self._stop: Wakeup | None = None
        self._serving_thread: threading.Thread | None = None
        self._auth: Any = None
        self._lock = threading.Lock()
        #: Other doors' wake-ups: (pollable, handler(now) -> engine output), see add_reader.
        self._readers: list[tuple[Any, Callable[[float], list[Any]]]] = []
        #: Of the readers' ZeroMQ sockets, those whose sends are counted, and by whom.
        self._senders: dict[Any, CountsSends] = {}
        self._max_frame = self.options.max_frame_size
        #: The engine's batch entry (``broker.batch``); None: batches are not understood.
        self._receive_batch = getattr(engine, "receive_batch", None)
        #: The engine's next timer when the loop last asked (``_after_wake``).
        self._deadline: float | None = None
        #: Frames beyond one in the batch just handled (``_on_message``'s drain budget).
        self._batched = 0
        #: The engine's entry for a drain's run of one producer's pushes, each answered
        #: as alone (``Engine.receive_pushes``); None: runs are not gathered.
        self._receive_pushes = getattr(engine, "receive_pushes", None)
        #: The producers whose pushes read in this drain wait in ``Peer.run`` (their
        #: octets, not decoded yet), in the order of their first one (``_serve_runs``);
        #: empty outside a drain.  At most ``options.batch`` frames wait.
        self._runs: list[Peer] = []
        #: Gather pushes into runs (``ServerOptions.push_runs``, and the engine takes
        #: runs: it has ``receive_pushes``) from the second message of a drain on
        #: (:meth:`_drain`; a lone message, a round trip's, goes straight through).
        self._gather = options.push_runs and self._receive_pushes is not None
        #: The engine's entry for a run delivered as the octets it came in
        #: (``Engine.receive_push_octets``; ``ServerOptions.push_octets``); None: off.
        self._push_octets = (
            getattr(engine, "receive_push_octets", None)
            if options.push_octets and self._gather
            else None
        )
        #: Octets of JSON in one reply: what a frame holds beside ids and headers.
        self._reply_budget = max(MIN_REPLY_SIZE, self._max_frame - REPLY_OVERHEAD)
        limits = getattr(getattr(engine, "config", None), "limits", None)
        wanted = getattr(limits, "max_reply_size", 0)
        if wanted > self._reply_budget:
            raise ServerError(
                f"limits.max_reply_size ({wanted}) must be at most max_frame_size - "
                f"{REPLY_OVERHEAD} ({self._reply_budget}): replies would not fit a frame"
            )
        if wanted:
            self._reply_budget = wanted  # the statistics page like the engine's lists

    # -- lifecycle ---------------------------------------------------------------------

    def bind(self) -> str:
        """Create and bind the ROUTER socket (idempotent); returns the bound endpoint."""
        if self.sender.router is not None:
            assert self.endpoint is not None
            return self.endpoint
        opts = self.options
        curve = opts.curve_secret is not None
        try:
            zmqkit.check_bind(opts.endpoint, curve=curve, insecure=opts.insecure)
        except zmqkit.SecurityError as exc:
            raise ServerError(str(exc)) from None
        if curve and not opts.allow_dir:
            raise ServerError("CURVE needs an allow-list directory (--allow DIR)")
        sock = self.context.socket(zmq.ROUTER)
        try:
            sock.linger = int(opts.linger * 1000)
            sock.router_mandatory = True
            # a new connection never takes over the routing id of a live one
            sock.router_handover = False
            sock.sndhwm = opts.pipe_hwm  # (its octets bound: ServerOptions.send_hwm)
            sock.rcvhwm = opts.hwm
            # libzmq drops a peer whose message is larger, before buffering any of it
            sock.maxmsgsize = opts.max_frame_size + (_CURVE_OVERHEAD if curve else 0)
            # No ZMTP heartbeats (ZMQ_HEARTBEAT_IVL): with them, the last messages of a
            # client flooding the broker then closing came through late (lost, with the
            # client's default 1 s linger), measured with libzmq 4.3.5.  Dead peers are
            # found by the TMQP PINGs instead: the session expires and its connection is
            # shut down (broker.server.links).
            sock.handshake_ivl = int(opts.handshake_timeout * 1000)
            if curve:
                assert opts.curve_secret is not None and opts.allow_dir is not None
                self._auth = zmqkit.start_authenticator(self.context, opts.allow_dir)
                zmqkit.configure_server(sock, opts.curve_secret)
            sock.bind(opts.endpoint)
        except (zmq.ZMQError, zmqkit.SecurityError) as exc:
            sock.close(linger=0)
            self._stop_auth()
            raise ServerError(f"cannot serve on {opts.endpoint}: {exc}") from None
        if opts.fanout is not None:
            try:
                self._bind_fanout(opts.fanout, curve)
            except ServerError:
                sock.close(linger=0)
                raise
        self.sender.router = sock
        self.sessions.connections = Connections(sock, opts.max_connections)
        self.sender.fast_send = zmqkit.fast_send(sock)
        endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.endpoint = endpoint
        return endpoint

    def _bind_fanout(self, endpoint: str, curve: bool) -> None:
        """Bind the broadcast fan-out XPUB (``broker.server.fanout``) beside the ROUTER."""
        opts = self.options
        try:
            zmqkit.check_bind(endpoint, curve=curve, insecure=opts.insecure)
            door = FanoutDoor.bind(self.context, endpoint, opts.fanout_hwm, opts.linger,
                                   opts.curve_secret, self.engine, self.counters)  # fmt: skip
        except (zmq.ZMQError, zmqkit.SecurityError) as exc:
            self._stop_auth()
            raise ServerError(f"cannot publish on {endpoint}: {exc}") from None
        self.sender.fanout = door
        self.engine.enable_fanout(door.endpoint)  # type: ignore[attr-defined]
        self.add_reader(door.sock, door.on_readable)
        self._senders[door.sock] = door  # (it reads until it finds nothing: LoopWait)

    def start(self) -> str:
        """Bind and serve on a background thread; returns the bound endpoint."""
        if self._serving_thread is not None:
            raise ServerError("server already started")
        endpoint = self.bind()
        stop = self._make_stop()
        self._serving_thread = threading.Thread(
            target=self._serve, args=(stop,), name="broker-server", daemon=True
        )
        self._serving_thread.start()
        return endpoint

    @property
    def serving(self) -> bool:
        """True while the thread :meth:`start` began is serving."""
        thread = self._serving_thread
        return thread is not None and thread.is_alive()

    def run(self) -> None:
        """Bind and serve on the calling thread until ``stop()`` (or an exception)."""
        self.bind()
        self._serve(self._make_stop())

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the loop to end, wait for it (``timeout`` seconds), release everything."""
        with self._lock:
            signal = self._stop
            self._stop = None
        if signal is not None:
            signal.notify()  # (the loop closes it)
        if self._serving_thread is not None:
            self._serving_thread.join(timeout)
            if self._serving_thread.is_alive():
                raise ServerError(f"server thread did not stop within {timeout} s")
            self._serving_thread = None
        if self.sender.router is not None and signal is None:
            # bound but never served
            self._close_connections()
            self.sender.router.close(linger=0)
            self.sender.router = None
            self._close_fanout()
        self._stop_auth()

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def add_reader(self, pollable: Any, handler: Callable[[float], list[Any]]) -> None:
        """Poll ``pollable`` (a zmq socket or a file descriptor) in the loop; when it
        is readable, call ``handler(now)`` on the loop's thread and send the engine output
        it returns.  How another front door (STOMP) drives the engine this loop owns.
        When the loop stops, a handler whose pollable is readable is called once more
        (what that door handed over is served before the sessions end).
        Call before ``start()``/``run()``."""
        self._readers.append((pollable, handler))

    def _make_stop(self) -> Wakeup:
        stop = Wakeup()
        with self._lock:
            self._stop = stop
        return stop

    def _close_connections(self) -> None:
        if self.sessions.connections is not None:
            self.sessions.connections.close()
            self.sessions.connections = None

    def _stop_auth(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None

    # -- the loop ----------------------------------------------------------------------

    def _serve(self, stop: Wakeup) -> None:
        router = self.sender.router
        assert router is not None
        waiter = LoopWait(router)
        waiter.add_fd(stop.fileno(), stop)
        connections = self.sessions.connections
        monitor = connections.monitor if connections is not None else None
        if connections is not None:
            waiter.add_drained(connections.monitor, connections)
        readers = self._readers
        for pollable, _handler in readers:
            waiter.add(pollable, self._senders.get(pollable))
        gate = self.gate
        if gate is not None:
            waiter.add_fd(gate.fileno(), gate)
        self.sessions.next_scan = self.clock() + min(1.0, self.options.ping_interval / 2)
        self._deadline = self.engine.next_deadline()
        try:
            timeout = 0
            before = self.clock()  # a time before the wait's look at the ROUTER
            while True:
                ready, router_empty = waiter.wait(timeout)
                now = self.clock()
                if router_empty:
                    # Nothing left to read when the wait looked (after ``before``), and
                    # still nothing now unless the ROUTER woke the wait.
                    self.sessions.emptied_at = before if router in ready else now
                if ready:
                    if stop in ready:
                        break
                    self._serve_ready(ready, router, monitor, router_empty, now)
                    now = self.clock()
                timeout = self._after_wake(now)
                before = now
        finally:
            try:
                self._shutdown(router)
            finally:
                stop.close()

    def _serve_ready(
        self,
        ready: list[Any],
        router: zmq.Socket[bytes],
        monitor: zmq.Socket[bytes] | None,
        woken: bool,
        now: float,
    ) -> None:
        """Serve the sources that have input (``woken``: see :meth:`_drain`)."""
        gate = self.gate
        if monitor is not None and monitor in ready:
            self.sessions.on_connections(now)  # before the messages they bring
        if gate is not None and gate in ready:
            gate.release()  # before the messages: acknowledges leave first
        if router in ready:
            if gate is not None:  # the drain's saves: one group per queue
                gate.begin()
                try:
                    self._drain(router, woken, now)
                finally:
                    gate.end()
            else:
                self._drain(router, woken, now)
            drained = True
        else:
            drained = False
        for pollable, handler in self._readers:
            if pollable in ready:
                if drained:  # (a drain may have taken a while)
                    now = self.clock()
                    drained = False
                self.sender.send_all(self.sessions.guard("door", handler, now))

    def _after_wake(self, now: float) -> int:
        """What every wake ends with: timers, keep-alive, backlogs, reports, sending; the
        next wait's timeout (ms).  Timers are due by the engine's deadline read at the end
        of the previous wake (one created since is due later: the timeout returned here
        is taken from a fresh one)."""
        sender = self.sender
        sessions = self.sessions
        engine = self.engine
        deadline = self._deadline
        if deadline is not None and deadline <= now:
            sender.send_all(sessions.guard("tick", engine.tick, now))
        if now >= sessions.next_scan:
            sessions.scan(now)
            if sender.fanout is not None:  # each stream's marker (tail gaps)
                sender.send_all(engine.fanout_beat())  # type: ignore[attr-defined]
        if sender.blocked:
            sender.flush_backlogs()
        if sender.gone or sessions.unreachable:
            sessions.bury(now)
        if sender.outq or sender.fanning:
            sender.flush_out()
        if sender.sent_to:
            sessions.report_transmitted(now)
            sender.flush_out()
        self._deadline = deadline = engine.next_deadline()
        if sender.sent_to:
            return 0  # deliveries to report: the engine may release more at once
        if sender.blocked or sender.gone or sessions.unreachable:
            return 1
        wake = sessions.next_scan
        if deadline is not None and deadline < wake:
            wake = deadline
        return max(0, int((wake - now) * 1000) + 1)

    def _drain(self, router: zmq.Socket[bytes], woken: bool, now: float) -> None:
        """Read what the ROUTER holds, ``options.batch`` frames at most.  ``woken``: the
        loop's wait found nothing to read before it blocked (a wake-up, as every round
        trip's): the first message is handled alone and its output sent at once, and the
        wait's next ZMQ_EVENTS (asked before it blocks anyway) tells whether more came,
        instead of a recv() here that finds nothing (several system calls)."""
        # Two recv() calls per message: recv_multipart() asks RCVMORE through getsockopt
        # on every part, which costs more than the rest of the receive path.
        recv = router.recv
        on_message = self._on_message
        peers = self._peers
        max_frame = self._max_frame
        gathering = False  # (``_gather`` from the second message on)
        # The producer whose run took the last push, and that run: its next push joins
        # the run with no look-up (its peer is ready, and ``last_seen`` and ``pinged``
        # were set for this drain's ``now`` when the run began).  Reset wherever the
        # runs may have been served or a peer changed (``_on_message``, the mid-drain
        # report).
        run_rid: bytes | None = None
        run_last: list[bytes] = []
        count = 0
        batch = self.options.batch
        while count < batch:
            try:
                rid = recv(zmq.NOBLOCK)
            except zmq.Again:
                self.sessions.emptied_at = now
                break
            part = recv(zmq.NOBLOCK, copy=False)  # the rest of a message is already here
            count += 1
            if part.more:
                while recv(zmq.NOBLOCK, copy=False).more:
                    pass
                run_rid = None
                on_message(rid, b"", True, now, part)
            elif (
                rid == run_rid
                and 1 < len(data := part.bytes) <= max_frame
                and data[0] & _TYPE_BITS == _QUEUE
                and not data[1] & _NOT_IN_RUN
            ):
                run_last.append(data)  # the same producer's next push (the common case)
            elif (
                gathering
                and (peer := peers.get(rid)) is not None
                and peer.state is _READY
                and 1 < len(data := part.bytes) <= max_frame
                and data[0] & _TYPE_BITS == _QUEUE
                and not data[1] & _NOT_IN_RUN
            ):
                # A push of a run by its first two octets (handled here: a call per
                # message costs): decoded with its run (_serve_runs).  A peer with a
                # run was seen at this drain's ``now`` when its run began.
                run = peer.run
                if run is None:
                    peer.last_seen = now
                    peer.pinged = False
                    peer.run = run = [data]
                    self._runs.append(peer)
                else:
                    run.append(data)
                run_rid = rid
                run_last = run
            else:
                run_rid = None  # (it may serve the runs or change a peer)
                if on_message(rid, part.bytes, False, now, part):
                    # a batch: its frames count against this drain's budget, so that
                    # timers and keep-alive (other peers' PINGs wait unread) are not held up
                    count += self._batched
                    gathering = self._gather
                    if count >= batch:
                        break
            if count == 1:
                if woken:
                    break  # (its output leaves at the drain's end)
                # A first message must not wait for the next recv(), which costs several
                # microseconds when it finds nothing: send its output now.  Plain pushes
                # gather into runs from the second message on.
                gathering = self._gather
                if self.sender.outq or self.sender.fanning:
                    self.sender.flush_out()
                # and ask whether another one waits: half what a recv() raising Again
                # costs (a message that came before the wait asked, as a round trip's
                # when the loop is slower than its client; a busy drain once)
                if not int(router.get(_EVENTS)) & _POLLIN:
                    self.sessions.emptied_at = now
                    break
            elif not count % _REPORT_EVERY and self.sender.sent_to:
                # Window slots come back while a long drain goes on, not only after it.
                run_rid = None
                self.sessions.report_transmitted(now)
        self.counters["frames_in"] += count
        if self._runs:
            self._serve_runs(now)
        if self.sender.outq or self.sender.fanning:
            self.sender.flush_out()

    def _on_message(
        self, rid: bytes, data: bytes, multipart: bool, now: float, part: zmq.Frame
    ) -> bool:
        """Handle one ZeroMQ message; True when it was a batch (``self._batched`` more
        frames than one).  A push without headers that waits for no response (plain or
        waiting for an acknowledge: its first two octets say so) from the second message
        of a drain on joins its producer's run undecoded, served at the end of the drain
        (:meth:`_serve_runs`): :meth:`_drain` puts it there itself, so it never comes
        here; any other message first serves the runs gathered before it, so that it
        sees every push that came before it."""
        peer = self._peers.get(rid)
        if peer is None or peer.state is not _READY:
            if self._runs:
                self._serve_runs(now)
            self.sessions.handshake(rid, peer, b"" if multipart else data, now, part)
            return False
        peer.last_seen = now
        peer.pinged = False
        if multipart or len(data) > self._max_frame:
            if self._runs:
                self._serve_runs(now)
            self._refuse(peer, data, multipart)
            return False
        try:
            msg = _decode((data,))
        except DecodeError as exc:
            if self._runs:
                self._serve_runs(now)
            self.sessions.bad(peer, data, f"malformed frame: {exc.reason}", ResultCode.BAD_REQUEST)
            return False
        if type(msg) is _Frame:
            mt = msg.message_type
            if self._runs:
                self._serve_runs(now)
            if mt == _TERMINATE:
                self.sessions.goodbye(peer, now)
                return False
            if mt == _SERVER:
                if msg.content_type == _BATCH and self._receive_batch is not None:
                    self._batch(peer, msg, now)
                    return True
                if msg.content_type == STATS_OPERATION:
                    self.sender.send_to(peer, self._stats_reply(peer, msg))
                    return False
            self._receive_one(peer, msg, data, now)
            return False
        if self._runs:
            self._serve_runs(now)
        if type(msg) is tmqp.Ping:
            self.sender.send_raw(peer, _PONG)
        elif type(msg) is tmqp.Handshake:
            self.sender.send_raw(peer, GREETING)
        return False

    def _refuse(self, peer: Peer, data: bytes, multipart: bool) -> None:
        """Answer a message that is not one frame within ``max_frame_size``."""
        if multipart:
            self.sessions.bad(
                peer, b"", "one TMQP frame per ZeroMQ message", ResultCode.BAD_REQUEST
            )
        else:
            reason = f"frame of {len(data)} octets exceeds {self._max_frame}"
            self.sessions.bad(peer, data, reason, ResultCode.LIMIT_EXCEEDED)

    def _receive_one(self, peer: Peer, msg: tmqp.Frame, data: bytes, now: float) -> None:
        """One frame through ``Engine.receive``; its output sent."""
        # the engine often forwards the very frame it was given (a push delivered
        # as is): send_all then reuses these octets instead of encoding again
        sender = self.sender
        sender.in_frame = msg
        sender.in_data = data
        try:
            outs = self.engine.receive(peer.client_id, msg, now, data)
        except Exception:
            log.exception("engine failed on a frame from %s", peer.client_id)
            self.counters["engine_errors"] += 1
            outs = []
            if msg.message_id:
                sender.send_to(peer, error_frame(msg.message_id, ResultCode.FAILED, "error"))
        if outs:
            sender.send_all(outs)

    def _serve_runs(self, now: float) -> None:
        """Serve the pushes gathered in this drain, each producer's run in one engine
        call, the producers in the order their first push came (:meth:`_serve_peer`).

        The outcome is that of each push handled alone in the order read, but for the
        order between two producers' pushes within the drain (which the order their
        messages were read in does not promise either), and any other frame was
        preceded by a call here.  The output goes through the gate: with the drain's
        hold, acknowledges leave once the drain's saves are durable."""
        peers = self._runs
        self._runs = []
        for peer in peers:
            if peer.run is not None:
                self._serve_peer(peer, now)

    def _serve_peer(self, peer: Peer, now: float) -> None:
        """One producer's run: its pushes (their octets; plain ones and ones waiting for
        an acknowledge alike) delivered as those octets where the engine may
        (:meth:`_serve_octets`), the others decoded and served by :meth:`_serve_records`.
        Where the octets path stops after taking some (a duplicate, a push of another
        kind or queue, garbage, a full window), that one frame takes the record path and
        the octets path is tried again on the rest; where it takes none, the rest of
        the run takes the record path."""
        run = peer.run
        peer.run = None
        if not run:
            return
        if self._push_octets is not None:
            while True:
                taken, run = self._serve_octets(peer, run, now)
                if not run:
                    return
                if not taken or len(run) == 1:
                    break
                self._serve_records(peer, run[:1], now)
                run = run[1:]
        self._serve_records(peer, run, now)

    def _serve_records(self, peer: Peer, run: list[bytes], now: float) -> None:
        """Pushes of a producer's run decoded in one call straight into the engine's
        messages (``tmqp.decode_message_records``: no ``Frame``; the acknowledge flag and
        the message id kept) and served by :meth:`_serve_run`; a frame that does not
        decode is answered where it stood (:meth:`_serve_refused`)."""
        messages, bad = _records(run, Message, WIRE)
        if bad:
            self._serve_refused(peer, run, messages, bad, now)
        else:
            self._serve_run(peer, messages, now)

    def _serve_octets(
        self, peer: Peer, run: list[bytes], now: float, carrier: tmqp.Frame | None = None
    ) -> tuple[int, list[bytes]]:
        """The pushes from the first of a producer's run on (``carrier``: the entries of
        that batch) that the engine delivers as the octets they came in
        (``Engine.receive_push_octets``: to their queue's one consumer, a peer of this
        server): how many, and the rest of the run.  The engine failing: the whole run
        is answered as :meth:`_serve_run` answers a failed one (each push with an id, or
        the batch, FAILED), none left."""
        push_octets = self._push_octets
        assert push_octets is not None
        try:
            taken, outs = push_octets(peer.client_id, run, now, self.sender.by_client)
        except Exception:
            if carrier is not None:
                self._run_failed(peer, [carrier.message_id])
                return len(run), []
            messages, _bad = _records(run, Message, WIRE)
            self._run_failed(peer, [m.message_id for m in messages])
            return 0, []
        if taken:
            self.counters["octets_pushes"] += taken
            if carrier is None and len(run) > 1:
                self.counters["run_pushes"] += taken
            self.sender.in_frame = None
            self.sender.send_all(outs)
            return taken, run[taken:]
        return 0, run

    def _serve_run(
        self, peer: Peer, messages: list[Message], now: float, carrier: tmqp.Frame | None = None
    ) -> None:
        """One producer's pushes through ``Engine.receive_pushes`` (each acknowledged
        push answered on its own there: ``saved_run`` for a queue whose handler answers
        every push alike, the held store); its output sent (``carrier``: the batch of
        plain pushes that brought them, then acknowledged when it asks: its acknowledge
        names the pushes not taken, as :meth:`_batch` names them).  The engine failing:
        each push with an id (or the batch) is answered FAILED."""
        receive_pushes = self._receive_pushes
        assert receive_pushes is not None
        sender = self.sender
        sender.in_frame = None
        if carrier is None and len(messages) > 1:
            self.counters["run_pushes"] += len(messages)
        acked = carrier is not None and carrier.pending_ack
        refused: list[tuple[int, str, str]] | None = [] if acked else None
        try:
            if refused is None:
                outs = receive_pushes(peer.client_id, messages, now)
            else:
                outs = receive_pushes(peer.client_id, messages, now, refused)
        except Exception:
            ids = [m.message_id for m in messages] if carrier is None else [carrier.message_id]
            self._run_failed(peer, ids)
            return
        if refused is not None:
            assert carrier is not None
            if refused:
                self.counters["batch_refused"] += len(refused)
            answer = batch.result_frame(carrier.message_id, peer.client_id, refused, [])
            outs.append(Outgoing(peer.client_id, answer))
        if outs:
            sender.send_all(outs)

    def _run_failed(self, peer: Peer, ids: list[str]) -> None:
        """The engine raised on a producer's run: logged, counted, and each push with an
        id (or the batch that carried them) answered FAILED -- never a silent drop."""
        log.exception("engine failed on a run of pushes from %s", peer.client_id)
        self.counters["engine_errors"] += 1
        for mid in ids:
            if mid:
                self.sender.send_to(peer, error_frame(mid, ResultCode.FAILED, "error"))

    def _serve_refused(
        self, peer: Peer, datas: list[bytes], messages: list[Message], bad: list[int], now: float
    ) -> None:
        """A run with frames that do not decode (``bad``: their indexes in ``datas``,
        ``messages`` the others in order): each answered "malformed frame" in its place."""
        taken = 0  # messages served so far
        start = 0  # the index in ``datas`` of the next message
        for index in bad:
            ahead = index - start
            if ahead:
                self._serve_run(peer, messages[taken : taken + ahead], now)
                taken += ahead
            data = datas[index]
            try:
                _decode((data,))
                reason = "not a queue frame"  # (a literal cannot start as a QUEUE frame)
            except DecodeError as exc:
                reason = exc.reason
            self.sessions.bad(peer, data, f"malformed frame: {reason}", ResultCode.BAD_REQUEST)
            start = index + 1
        if taken < len(messages):
            self._serve_run(peer, messages[taken:], now)

    def _batch(self, peer: Peer, msg: tmqp.Frame, now: float) -> None:
        """A batch of frames (``broker.batch``): split and decoded in one pass, handed to
        the engine in one call, answered (when the batch waits for it) by one acknowledge
        listing the entries refused.  An entry that is not a readable push or
        acknowledge is refused by index; the others are taken."""
        self._batched = 0
        if self._gather and self._plain_batch(peer, msg, now):
            return
        taken = self._entries(peer, msg)
        if taken is None:
            return
        items, refused, count = taken
        client_id = peer.client_id
        self._batched = count - 1 if count else 0
        self.counters["batched_in"] += count
        self.sender.in_frame = None
        assert self._receive_batch is not None
        try:
            outs, taken_refused, later = self._receive_batch(client_id, items, now)
        except Exception:
            log.exception("engine failed on a batch from %s", client_id)
            self.counters["engine_errors"] += 1
            if msg.message_id:
                self.sender.send_to(peer, error_frame(msg.message_id, ResultCode.FAILED, "error"))
            return
        if taken_refused:
            refused = sorted(refused + taken_refused) if refused else taken_refused
        if refused:
            self.counters["batch_refused"] += len(refused)
        if msg.pending_ack:
            result = batch.result_frame(msg.message_id, client_id, refused, later)
            outs.append(Outgoing(client_id, result))
        if outs:
            self.sender.send_all(outs)

    def _plain_batch(self, peer: Peer, msg: tmqp.Frame, now: float) -> bool:
        """A batch of plain pushes only (each entry's first two octets say so, and each
        decodes): decoded straight into the engine's messages and served as one run
        (:meth:`_serve_run`), answered as :meth:`_batch` answers (nothing refused).
        False, nothing done: any other batch (:meth:`_batch` decodes and answers it)."""
        payload = msg.payload
        if len(payload) > _FIRST_OPTIONS and (
            payload[_FIRST_TYPE] & _TYPE_BITS != _QUEUE or payload[_FIRST_OPTIONS] & _NOT_PLAIN
        ):
            return False  # its first entry is no plain push (acknowledged ones): not split
        try:
            datas = batch.unpack(payload, self.options.max_batch_frames)
        except batch.BatchError:
            return False
        for data in datas:
            if len(data) < 2 or data[0] & _TYPE_BITS != _QUEUE or data[1] & _NOT_PLAIN:
                return False
        if (
            self._push_octets is not None
            and not msg.pending_ack
            and datas
            and self._octets_batch(peer, msg, datas, now)
        ):
            return True
        messages, bad = _records(datas, Message, WIRE)
        if bad or not messages:
            return False
        count = len(messages)
        self._batched = count - 1
        self.counters["batched_in"] += count
        self._serve_run(peer, messages, now, msg)
        return True

    def _octets_batch(self, peer: Peer, msg: tmqp.Frame, datas: list[bytes], now: float) -> bool:
        """:meth:`_plain_batch` of a batch of plain pushes that waits for no acknowledge:
        the pushes from the first on that the engine delivers as their octets
        (:meth:`_serve_octets`), the rest decoded and served as one run; an entry of the
        rest that does not decode is refused (counted, unanswered: the batch waits for
        nothing), as :meth:`_batch` refuses it.  False, nothing done: the octets path
        took none (:meth:`_plain_batch` goes on)."""
        taken, rest = self._serve_octets(peer, datas, now, msg)
        if not taken and rest:
            return False
        count = len(datas)
        self._batched = count - 1
        self.counters["batched_in"] += count
        if rest:
            messages, bad = _records(rest, Message, WIRE)
            if bad:
                self.counters["batch_refused"] += len(bad)
            if messages:
                self._serve_run(peer, messages, now, msg)
        return True

    def _entries(
        self, peer: Peer, msg: tmqp.Frame
    ) -> tuple[list[tuple[int, tmqp.Frame, bytes]], list[tuple[int, str, str]], int] | None:
        """A batch's entries that the engine may take, (index, frame, its octets), those
        refused by index, and how many entries it has; None: refused whole (answered).
        Decoded where they lie in the payload (``tmqp.decode_entries``); a batch with an
        entry that does not decode or a bad length is split and decoded entry by entry
        (:meth:`_each_entry`), which says what is wrong with which."""
        payload = msg.payload
        spans: list[int] = []
        try:
            frames = _decode_entries(payload, self.options.max_batch_frames, spans)
        except DecodeError:
            return self._each_entry(peer, msg)
        refused: list[tuple[int, str, str]] = []
        taken = _pushes_and_acks(frames, refused)
        items = [(i, f, payload[spans[i + i] : spans[i + i + 1]]) for i, f in taken]
        return items, refused, len(frames)

    def _each_entry(
        self, peer: Peer, msg: tmqp.Frame
    ) -> tuple[list[tuple[int, tmqp.Frame, bytes]], list[tuple[int, str, str]], int] | None:
        """:meth:`_entries` one entry at a time: a malformed entry is refused by index."""
        try:
            entries = batch.unpack(msg.payload, self.options.max_batch_frames)
        except batch.TooMany as exc:
            self.sessions.bad_request(peer, msg.message_id, str(exc), ResultCode.LIMIT_EXCEEDED)
            return None
        except batch.BatchError as exc:
            self.sessions.bad_request(peer, msg.message_id, f"bad batch: {exc}",
                                      ResultCode.BAD_REQUEST)  # fmt: skip
            return None
        refused: list[tuple[int, str, str]] = []
        frames: list[tmqp.Message | None] = []
        for index, data in enumerate(entries):
            try:
                frames.append(_decode((data,)))
            except DecodeError as exc:
                refused.append((index, NackReason.BAD_REQUEST, f"malformed frame: {exc.reason}"))
                frames.append(None)
        taken = _pushes_and_acks(frames, refused)
        if len(refused) > 1:
            refused.sort()
        items = [(i, f, entries[i]) for i, f in taken]
        return items, refused, len(entries)

    def _shutdown(self, router: zmq.Socket[bytes]) -> None:
        """Tell connected clients the server is stopping, end their sessions, close."""
        now = self.clock()
        if self._runs:  # (a drain that raised) its pushes go in before the sessions end
            try:
                self._serve_runs(now)
            except Exception:
                log.exception("pushes read before the loop stopped were not served")
        self._serve_doors_left(now)
        if self.gate is not None:
            try:
                self.gate.release_all()
            except Exception:
                log.exception("the store could not make the held output durable")
        self.sender.flush_out()
        self.sessions.report_transmitted(now)  # before the engine returns what was not sent
        bye = tmqp.encode(terminate_frame(ResultCode.BUSY, "server stopping"))[0]
        for peer in list(self.sessions.by_rid.values()):
            if peer.state is PeerState.READY:
                self.sender.send_rid(peer.rid, bye)
                self.sessions.guard("disconnect", self.engine.disconnect, peer.client_id, now)
        self.sessions.by_rid.clear()
        self.sender.by_client.clear()
        self.sender.blocked.clear()
        self._close_connections()
        router.close(linger=int(self.options.linger * 1000))
        self.sender.router = None
        self._close_fanout()

    def _serve_doors_left(self, now: float) -> None:
        """What the other doors handed over before the stop (a STOMP client's ACKs and
        its connection's end, submitted as the listener closed) reaches the engine before
        the sessions end and the store closes: the stop wakes the loop with them still
        waiting, and an ACK dropped here is a redelivery after a clean restart."""
        poller = zmq.Poller()
        for pollable, _handler in self._readers:
            poller.register(pollable, zmq.POLLIN)
        ready = dict(poller.poll(0))
        for pollable, handler in self._readers:
            if pollable in ready:
                self.sender.send_all(self.sessions.guard("door", handler, now))

    def _close_fanout(self) -> None:
        if self.sender.fanout is not None:
            self.sender.fanout.close(self.options.linger)
            self.sender.fanout = None

    # -- statistics --------------------------------------------------------------------

    def _stats_reply(self, peer: Peer, request: tmqp.Frame) -> tmqp.Frame:
        """The statistics as JSON, paged like the engine's lists (``broker.paging``): each
        page holds every counter and a part of the engine's ``channel_list``."""
        if not self._admin_allowed(peer.client_id):
            return error_frame(request.message_id, ResultCode.UNAUTHORIZED, "unauthorized")
        counters = dict(self.counters, frames_out=self.sender.frames_out)
        out: dict[str, object] = {"server": counters, "peers": len(self.sessions.by_rid)}
        room = self._reply_budget - json_size(out) - len(',"engine":')
        after = header(request, Header.PAGE_AFTER)
        try:
            out["engine"], more = self.engine.stats_page(after, room)
        except Exception as exc:
            log.exception("engine statistics failed")
            out["engine"], more = {"error": str(exc)}, None
        headers = ((Header.PAGE_NEXT, more),) if more is not None else ()
        body = json.dumps(out, default=str, sort_keys=True, separators=(",", ":"))
        return tmqp.Frame(
            message_type=MessageType.RESPONSE,
            message_id=request.message_id,
            target=peer.client_id,
            headers=headers,
            payload=body.encode("utf-8"),
        )

    def _admin_allowed(self, client_id: str) -> bool:
        authorizer = getattr(self.engine, "authorizer", None)
        clients = getattr(self.engine, "clients", None)
        if authorizer is None or not isinstance(clients, dict) or client_id not in clients:
            return True
        from broker.engine.auth import Action

        try:
            return bool(authorizer.allows(clients[client_id], Action.ADMIN))
        except Exception:
            log.exception("authorizer failed")
            return False

    def peers(self) -> dict[str, str]:
        """Connected client ids and their state (call from the serving thread or after stop)."""
        return self.sessions.peers()

    def stats(self) -> dict[str, object]:
        """Transport counters plus the engine's statistics."""
        counters = dict(self.counters, frames_out=self.sender.frames_out)
        out: dict[str, object] = {"server": counters, "peers": len(self.sessions.by_rid)}
        engine = self._guard_stats()
        listed = engine.get("client_list")
        if isinstance(listed, list):  # the transport knows where each client connects from
            by_client = self.sender.by_client
            for row in listed:
                peer = by_client.get(row.get("Id"))
                row["Address"] = peer.address if peer is not None else None
        out["engine"] = engine
        return out

    def _guard_stats(self) -> dict[str, object]:
        try:
            return dict(self.engine.stats())
        except Exception as exc:
            return {"error": str(exc)}
