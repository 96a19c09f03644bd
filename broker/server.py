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
full gets a per-peer backlog instead of blocking the loop or losing frames.

Hot path: plain frames are decoded by ``broker.fastcodec``; a frame the engine
passes through unchanged is forwarded as the octets received; engine output is
handed to libzmq in batches (``ServerOptions.send_batch``), in order with every
other frame the server sends, so that libzmq's I/O thread is woken once per batch.

Bad input never stops the loop: oversize, undecodable or multi-part messages
get a ``RESPONSE`` with a status code and a ``Reason`` header (echoing the
message id when it can be read), and an engine exception answers ``FAILED``.

Default endpoint: ``tcp://127.0.0.1:5680`` (``protocol.DEFAULT_ENDPOINT``).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

import zmq

from broker import fastcodec, tmqp
from broker.protocol import (
    DEFAULT_ENDPOINT,
    GREETING,
    ConnectionInfo,
    ConnectionInfoError,
    Header,
    MessageType,
    Operation,
    ResultCode,
)
from broker.sockets import fast_send
from zproto.errors import DecodeError, EncodeError

log = logging.getLogger(__name__)

_PING = tmqp.encode(tmqp.Ping())[0]
_PONG = tmqp.encode(tmqp.Pong())[0]
_BIG = 65536  # frames at least this large are sent without copying
_SNDMORE_NOBLOCK = zmq.SNDMORE | zmq.NOBLOCK
_TERMINATE = int(MessageType.TERMINATE)
_SERVER = int(MessageType.SERVER)
_Frame = tmqp.Frame
_decode = fastcodec.decode
_ids = itertools.count(1)

#: Server operation (content type) answered by the server itself: a RESPONSE whose payload
#: is the JSON of ``Server.stats()``.  Needs the engine authorizer's ADMIN action.
STATS_OPERATION = int(Operation.STATS)


class ServerError(Exception):
    """The server cannot start (bad endpoint, key files, insecure bind) or stop."""


class EngineLike(Protocol):
    """What the server needs from ``broker.engine.Engine``."""

    def connect(self, info: ConnectionInfo, now: float) -> tuple[str, list[Any]]: ...
    def receive(self, client_id: str, frame: tmqp.Frame, now: float) -> list[Any]: ...
    def disconnect(self, client_id: str, now: float) -> list[Any]: ...
    def tick(self, now: float) -> list[Any]: ...
    def next_deadline(self) -> float | None: ...
    def stats(self) -> dict[str, object]: ...


class PeerState(Enum):
    AWAIT_INFO = "await-info"  # greeting answered, connection info expected
    READY = "ready"  # connected to the engine under a client id


@dataclass(frozen=True)
class ServerOptions:
    """Transport settings (the engine has its own ``BrokerConfig``)."""

    endpoint: str = DEFAULT_ENDPOINT
    #: CURVE: the server's ``.key_secret`` file and the folder of allowed client ``.key`` files.
    curve_secret: str | None = None
    allow_dir: str | None = None
    #: Allow a non-loopback bind without CURVE.
    insecure: bool = False
    #: Largest frame answered normally; larger ones get LIMIT_EXCEEDED.  libzmq drops the
    #: connection of a peer sending more than ``4 * max_frame_size`` (memory guard).
    max_frame_size: int = 16 * 1024 * 1024
    #: A peer silent this long gets a PING; silent for ``peer_timeout`` it is disconnected.
    ping_interval: float = 5.0
    peer_timeout: float = 15.0
    #: A peer that has not finished the handshake within this time is forgotten.
    handshake_timeout: float = 10.0
    #: ZeroMQ high-water marks (messages per peer pipe).
    hwm: int = 10_000
    #: Frames queued per peer beyond its full pipe before the peer is dropped.
    max_backlog: int = 100_000
    #: Messages handled per socket drain before timers are looked at again.
    batch: int = 1024
    #: Engine output handed to libzmq together: at the end of each drain, or once this
    #: many frames wait.  Batches let libzmq's I/O thread take many frames per wake-up
    #: (on 2 cores: 1.6x the throughput of sending each frame at once); a lone message
    #: goes out at once, so latency grows only under load (at most one batch's work).
    send_batch: int = 256
    linger: float = 0.5

    def __post_init__(self) -> None:
        if self.max_frame_size < 64:
            raise ValueError("max_frame_size must be at least 64 octets")
        if not 0 < self.ping_interval < self.peer_timeout:
            raise ValueError("need 0 < ping_interval < peer_timeout")
        if self.batch < 1 or self.send_batch < 1:
            raise ValueError("batch and send_batch must be at least 1")


_READY = PeerState.READY


class _Peer:
    __slots__ = ("backlog", "client_id", "last_seen", "pinged", "rid", "since", "state")

    def __init__(self, rid: bytes, now: float) -> None:
        self.rid = rid
        self.state = PeerState.AWAIT_INFO
        self.client_id = ""
        self.since = now
        self.last_seen = now
        self.pinged = False
        self.backlog: deque[bytes] | None = None


def _no_socket(*args: Any, **kw: Any) -> Any:
    raise ServerError("server socket not bound")


def salvage_message_id(data: bytes) -> str:
    """Best-effort message id of a frame that failed to decode ('' if unreadable)."""
    if len(data) < 8:
        return ""
    marker = data[7]
    start = 8 + {253: 2, 254: 4, 255: 8}.get(marker, 0)
    raw = data[start : start + data[2]]
    if len(raw) != data[2]:
        return ""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return ""


def error_frame(message_id: str, code: ResultCode, reason: str) -> tmqp.Frame:
    """The RESPONSE the server sends for a request it cannot handle."""
    return tmqp.Frame(
        message_type=MessageType.RESPONSE,
        content_type=code,
        message_id=message_id,
        headers=((Header.REASON, reason[:400]),),
    )


def terminate_frame(code: ResultCode, reason: str) -> tmqp.Frame:
    """A TERMINATE frame: the server ends (or refuses) the session."""
    return tmqp.Frame(
        message_type=MessageType.TERMINATE,
        content_type=code,
        headers=((Header.REASON, reason[:400]),),
    )


class Server:
    """ROUTER front end of one engine.

    ``start()`` binds and serves on a background thread (``stop()`` ends it over an
    inproc PAIR socket); ``run()`` serves on the calling thread until ``stop()`` is
    called from elsewhere.  ``clock`` (monotonic seconds) is injectable for tests.
    """

    def __init__(
        self,
        engine: EngineLike,
        options: ServerOptions | None = None,
        *,
        context: zmq.Context[zmq.Socket[bytes]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.options = options or ServerOptions()
        self.context = context
        self.clock = clock
        self.endpoint: str | None = None  # the bound endpoint (port resolved)
        self._router: zmq.Socket[bytes] | None = None
        self._control_addr = f"inproc://zerohub-server-{os.getpid()}-{next(_ids)}"
        self._stop_tx: zmq.Socket[bytes] | None = None
        self._thread: threading.Thread | None = None
        self._auth: Any = None
        self._peers: dict[bytes, _Peer] = {}
        self._in_frame: object = None  # the frame being handled and its octets
        self._in_data = b""
        self._by_client: dict[str, _Peer] = {}
        self._blocked: set[_Peer] = set()
        self._gone: list[_Peer] = []
        self._next_scan = 0.0
        self._lock = threading.Lock()
        self._max_frame = self.options.max_frame_size
        self._frames_out = 0
        self._fast_send: Callable[..., Any] = _no_socket
        self._outq: list[tuple[_Peer, bytes]] = []
        self._flush_at = self.options.send_batch
        self.counters: dict[str, int] = dict.fromkeys(
            (
                "frames_in",
                "bad_frames",
                "refused",
                "expired",
                "dropped_out",
                "engine_errors",
                "backlogged",
            ),
            0,
        )

    # -- lifecycle ---------------------------------------------------------------------

    def bind(self) -> str:
        """Create and bind the ROUTER socket (idempotent); returns the bound endpoint."""
        if self._router is not None:
            assert self.endpoint is not None
            return self.endpoint
        from filemq import security

        opts = self.options
        curve = opts.curve_secret is not None
        try:
            security.check_bind(opts.endpoint, curve=curve, insecure=opts.insecure)
        except security.SecurityError as exc:
            raise ServerError(str(exc)) from None
        if curve and not opts.allow_dir:
            raise ServerError("CURVE needs an allow-list directory (--allow DIR)")
        sock = self.context.socket(zmq.ROUTER)
        try:
            sock.linger = int(opts.linger * 1000)
            sock.router_mandatory = True
            sock.router_handover = True
            sock.sndhwm = opts.hwm
            sock.rcvhwm = opts.hwm
            sock.maxmsgsize = 4 * opts.max_frame_size
            if curve:
                assert opts.curve_secret is not None and opts.allow_dir is not None
                self._auth = security.start_authenticator(self.context, opts.allow_dir)
                security.configure_server(sock, opts.curve_secret)
            sock.bind(opts.endpoint)
        except (zmq.ZMQError, security.SecurityError) as exc:
            sock.close(linger=0)
            self._stop_auth()
            raise ServerError(f"cannot serve on {opts.endpoint}: {exc}") from None
        self._router = sock
        self._fast_send = fast_send(sock)
        endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.endpoint = endpoint
        return endpoint

    def start(self) -> str:
        """Bind and serve on a background thread; returns the bound endpoint."""
        if self._thread is not None:
            raise ServerError("server already started")
        endpoint = self.bind()
        control = self._make_control()
        self._thread = threading.Thread(
            target=self._serve, args=(control,), name="broker-server", daemon=True
        )
        self._thread.start()
        return endpoint

    def run(self) -> None:
        """Bind and serve on the calling thread until ``stop()`` (or an exception)."""
        self.bind()
        self._serve(self._make_control())

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the loop to end, wait for it (``timeout`` seconds), release everything."""
        with self._lock:
            tx = self._stop_tx
            self._stop_tx = None
        if tx is not None:
            with contextlib.suppress(zmq.ZMQError):
                tx.send(b"STOP")
            tx.close(linger=0)
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise ServerError(f"server thread did not stop within {timeout} s")
            self._thread = None
        if self._router is not None and tx is None:
            # bound but never served
            self._router.close(linger=0)
            self._router = None
        self._stop_auth()

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _make_control(self) -> zmq.Socket[bytes]:
        control = self.context.socket(zmq.PAIR)
        control.linger = 0
        control.bind(self._control_addr)
        tx = self.context.socket(zmq.PAIR)
        tx.linger = 0
        tx.connect(self._control_addr)
        with self._lock:
            self._stop_tx = tx
        return control

    def _stop_auth(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None

    # -- the loop ----------------------------------------------------------------------

    def _serve(self, control: zmq.Socket[bytes]) -> None:
        router = self._router
        assert router is not None
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(control, zmq.POLLIN)
        self._next_scan = self.clock() + min(1.0, self.options.ping_interval / 2)
        try:
            while True:
                events = dict(poller.poll(self._poll_timeout()))
                if control in events:
                    break
                if router in events:
                    self._drain(router)
                now = self.clock()
                deadline = self.engine.next_deadline()
                if deadline is not None and deadline <= now:
                    self._send_all(self._guard("tick", self.engine.tick, now))
                if now >= self._next_scan:
                    self._scan(now)
                if self._blocked:
                    self._flush_backlogs()
                if self._gone:
                    self._bury(now)
                if self._outq:
                    self._flush_out()
        finally:
            self._shutdown(router)
            control.close(linger=0)

    def _poll_timeout(self) -> int:
        now = self.clock()
        wake = self._next_scan
        deadline = self.engine.next_deadline()
        if deadline is not None and deadline < wake:
            wake = deadline
        if self._blocked or self._gone:
            return 1
        return max(0, int((wake - now) * 1000) + 1)

    def _drain(self, router: zmq.Socket[bytes]) -> None:
        # Two recv() calls per message: recv_multipart() asks RCVMORE through getsockopt
        # on every part, which costs more than the rest of the receive path.
        recv = router.recv
        on_message = self._on_message
        now = self.clock()
        count = 0
        batch = self.options.batch
        while count < batch:
            try:
                rid = recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            part = recv(zmq.NOBLOCK, copy=False)  # the rest of a message is already here
            count += 1
            if part.more:
                while recv(zmq.NOBLOCK, copy=False).more:
                    pass
                on_message(rid, b"", True, now)
            else:
                on_message(rid, part.bytes, False, now)
            if count == 1 and self._outq:
                # A lone message (light load) must not wait for the next recv(), which
                # costs several microseconds when it finds nothing: send its output now.
                self._flush_out()
        self.counters["frames_in"] += count
        if self._outq:
            self._flush_out()

    def _on_message(self, rid: bytes, data: bytes, multipart: bool, now: float) -> None:
        peer = self._peers.get(rid)
        if peer is None or peer.state is not _READY:
            self._handshake(rid, peer, b"" if multipart else data, now)
            return
        peer.last_seen = now
        peer.pinged = False
        if multipart:
            self._bad(peer, b"", "one TMQP frame per ZeroMQ message", ResultCode.BAD_REQUEST)
            return
        if len(data) > self._max_frame:
            reason = f"frame of {len(data)} octets exceeds {self._max_frame}"
            self._bad(peer, data, reason, ResultCode.LIMIT_EXCEEDED)
            return
        try:
            msg = _decode(data)
        except DecodeError as exc:
            self._bad(peer, data, f"malformed frame: {exc.reason}", ResultCode.BAD_REQUEST)
            return
        if type(msg) is _Frame:
            mt = msg.message_type
            if mt == _TERMINATE:
                self._drop(peer, now)
                return
            if mt == _SERVER and msg.content_type == STATS_OPERATION:
                self._send_to(peer, self._stats_reply(peer, msg))
                return
            # the engine often forwards the very frame it was given (a push delivered
            # as is): _send_all then reuses these octets instead of encoding again
            self._in_frame = msg
            self._in_data = data
            try:
                outs = self.engine.receive(peer.client_id, msg, now)
            except Exception:
                log.exception("engine failed on a frame from %s", peer.client_id)
                self.counters["engine_errors"] += 1
                outs = []
                if msg.message_id:
                    self._send_to(peer, error_frame(msg.message_id, ResultCode.FAILED, "error"))
            if outs:
                self._send_all(outs)
        elif type(msg) is tmqp.Ping:
            self._send_raw(peer, _PONG)
        elif type(msg) is tmqp.Handshake:
            self._send_raw(peer, GREETING)

    # -- handshake ---------------------------------------------------------------------

    def _handshake(self, rid: bytes, peer: _Peer | None, data: bytes, now: float) -> None:
        if peer is None:
            if data == GREETING:
                self._peers[rid] = _Peer(rid, now)
                self._send_rid(rid, GREETING)
            elif data == _PING:
                self._refuse(rid, ResultCode.UNAUTHORIZED, "handshake required")
            elif data[:5] == b"TMQP/" and len(data) <= 16:
                proto = data.decode("ascii", "replace")
                self._refuse(rid, ResultCode.UNACCEPTABLE, f"unsupported protocol {proto!r}")
            else:
                self._refuse(rid, ResultCode.UNAUTHORIZED, "handshake required")
            return
        # AWAIT_INFO: the connection-info frame, or a repeated greeting / keep-alive.
        peer.last_seen = now
        if data == GREETING:
            self._send_rid(rid, GREETING)
            return
        if data == _PING:
            self._send_rid(rid, _PONG)
            return
        if len(data) > self.options.max_frame_size:
            self._forget(peer)
            self._refuse(rid, ResultCode.LIMIT_EXCEEDED, "connection info too large")
            return
        try:
            msg = tmqp.decode([data])
        except DecodeError as exc:
            self._forget(peer)
            self._refuse(rid, ResultCode.BAD_REQUEST, f"malformed connection info: {exc.reason}")
            return
        if (
            type(msg) is not tmqp.Frame
            or msg.message_type != MessageType.SERVER
            or msg.content_type != Operation.CONNECT
        ):
            self._forget(peer)
            self._refuse(rid, ResultCode.BAD_REQUEST, "expected the connection-info message")
            return
        try:
            info = ConnectionInfo.from_payload(msg.payload)
        except ConnectionInfoError as exc:
            self._forget(peer)
            self._refuse(rid, ResultCode.BAD_REQUEST, str(exc))
            return
        if info.client_id is not None:
            self._take_over(info.client_id, now)
        try:
            client_id, outs = self.engine.connect(info, now)
        except Exception as exc:
            self._forget(peer)
            code = getattr(exc, "code", None)
            if code is None:
                log.exception("engine failed to connect a client")
                self.counters["engine_errors"] += 1
                self._refuse(rid, ResultCode.FAILED, "server error")
            else:
                self._refuse(rid, ResultCode(int(code)), str(getattr(exc, "reason", exc)))
            return
        peer.state = PeerState.READY
        peer.client_id = client_id
        self._by_client[client_id] = peer
        log.debug("client %s connected", client_id)
        answered = any(o.client_id == client_id and o.frame.message_id == msg.message_id
                       for o in outs)  # fmt: skip
        if not answered:
            # The engine did not answer the connection info: tell the client its id.
            self._send_to(peer, self._connected_frame(msg.message_id, client_id))
        self._send_all(outs)

    @staticmethod
    def _connected_frame(message_id: str, client_id: str) -> tmqp.Frame:
        return tmqp.Frame(
            message_type=MessageType.RESPONSE,
            content_type=ResultCode.OK,
            message_id=message_id,
            target=client_id,
            headers=((Header.CLIENT_ID, client_id),),
        )

    def _take_over(self, client_id: str, now: float) -> None:
        """A client reconnecting under its id replaces a session that has gone quiet."""
        old = self._by_client.get(client_id)
        if old is not None and now - old.last_seen >= self.options.ping_interval:
            log.info("client %s reconnected; dropping its stale session", client_id)
            self._drop(old, now)

    def _refuse(self, rid: bytes, code: ResultCode, reason: str) -> None:
        self.counters["refused"] += 1
        log.debug("refused peer %r: %s", rid, reason)
        self._send_rid(rid, tmqp.encode(terminate_frame(code, reason))[0])

    def _bad(self, peer: _Peer, data: bytes, reason: str, code: ResultCode) -> None:
        self.counters["bad_frames"] += 1
        log.debug("bad frame from %s: %s", peer.client_id, reason)
        self._send_to(peer, error_frame(salvage_message_id(data), code, reason))

    # -- peers -------------------------------------------------------------------------

    def _forget(self, peer: _Peer) -> None:
        self._peers.pop(peer.rid, None)
        if peer.client_id and self._by_client.get(peer.client_id) is peer:
            del self._by_client[peer.client_id]
        self._blocked.discard(peer)

    def _drop(self, peer: _Peer, now: float) -> None:
        """End a READY peer's session in the engine and forget it."""
        self._forget(peer)
        if peer.state is PeerState.READY:
            peer.state = PeerState.AWAIT_INFO
            self._send_all(self._guard("disconnect", self.engine.disconnect, peer.client_id, now))

    def _bury(self, now: float) -> None:
        gone, self._gone = self._gone, []
        for peer in gone:
            if self._peers.get(peer.rid) is peer:
                self._drop(peer, now)

    def _scan(self, now: float) -> None:
        opts = self.options
        self._next_scan = now + min(1.0, opts.ping_interval / 2)
        for peer in list(self._peers.values()):
            idle = now - peer.last_seen
            if peer.state is not PeerState.READY:
                if now - peer.since >= opts.handshake_timeout:
                    self._forget(peer)
            elif idle >= opts.peer_timeout:
                log.info("client %s silent for %.1f s: disconnected", peer.client_id, idle)
                self.counters["expired"] += 1
                self._drop(peer, now)
            elif idle >= opts.ping_interval and not peer.pinged:
                peer.pinged = True
                self._send_raw(peer, _PING)

    def peers(self) -> dict[str, str]:
        """Connected client ids and their state (call from the serving thread or after stop)."""
        return {p.client_id or repr(p.rid): p.state.value for p in list(self._peers.values())}

    # -- sending -----------------------------------------------------------------------

    def _guard(self, what: str, call: Callable[..., list[Any]], *args: Any) -> list[Any]:
        try:
            return call(*args)
        except Exception:
            log.exception("engine %s failed", what)
            self.counters["engine_errors"] += 1
            return []

    def _send_all(self, outs: Iterable[Any]) -> None:
        """Encode and route engine output; consecutive equal frames are encoded once."""
        by_client = self._by_client
        outq = self._outq
        flush_at = self._flush_at
        prev: tmqp.Frame | None = None
        in_frame = self._in_frame
        data = b""
        for client_id, frame in outs:
            if frame is not prev:
                prev = frame
                if frame is in_frame:
                    data = self._in_data
                else:
                    try:
                        data = frame.encode()[0]
                    except (EncodeError, AttributeError) as exc:
                        log.error("engine produced an unencodable frame: %s", exc)
                        self.counters["engine_errors"] += 1
                        data = b""
            peer = by_client.get(client_id)
            if peer is None or not data:
                self.counters["dropped_out"] += 1
            elif peer.backlog or len(data) >= _BIG:
                self._send_raw(peer, data)
                outq = self._outq  # _send_raw flushed the batch: a new list
            else:  # the common case: sent with the batch (see _flush_out)
                outq.append((peer, data))
                if len(outq) >= flush_at:
                    self._flush_out()
                    outq = self._outq

    def _flush_out(self) -> None:
        """Send the frames batched by _send_all, in order.

        Sending a batch at a time (at the end of a socket drain, at most ``flush_at``
        frames later) lets libzmq's I/O thread take many frames per wake-up instead of
        being woken for nearly every frame.
        """
        outq = self._outq
        if not outq:
            return
        self._outq = []
        send = self._fast_send
        sent = 0
        for peer, data in outq:
            if peer.backlog:
                self._queue(peer, data)
                continue
            try:
                send(peer.rid, _SNDMORE_NOBLOCK)
            except zmq.ZMQError:
                self._send_raw(peer, data)  # full pipe or gone: the slow path decides
                continue
            send(data, zmq.NOBLOCK)
            sent += 1
        self._frames_out += sent

    def _send_to(self, peer: _Peer, frame: tmqp.Frame) -> None:
        self._send_raw(peer, tmqp.encode(frame)[0])

    def _send_raw(self, peer: _Peer, data: bytes) -> None:
        if self._outq:
            self._flush_out()  # keep the order
        if peer.backlog:
            self._queue(peer, data)
            return
        router = self._router
        assert router is not None
        try:
            router.send(peer.rid, _SNDMORE_NOBLOCK)
        except zmq.Again:
            self._queue(peer, data)
            return
        except zmq.ZMQError as exc:
            if exc.errno == errno.EHOSTUNREACH:
                self._gone.append(peer)  # the connection went away; clean up after this batch
                return
            raise
        router.send(data, zmq.NOBLOCK, copy=len(data) < _BIG)
        self._frames_out += 1

    def _send_rid(self, rid: bytes, data: bytes) -> None:
        """Send to a peer that has no session (handshake replies); dropped if unreachable."""
        if self._outq:
            self._flush_out()
        router = self._router
        assert router is not None
        try:
            router.send(rid, _SNDMORE_NOBLOCK)
        except zmq.ZMQError:
            return
        router.send(data, zmq.NOBLOCK)

    def _queue(self, peer: _Peer, data: bytes) -> None:
        if peer.backlog is None:
            peer.backlog = deque()
        peer.backlog.append(data)
        self._blocked.add(peer)
        self.counters["backlogged"] += 1
        if len(peer.backlog) > self.options.max_backlog:
            log.warning("client %s is not reading: dropped", peer.client_id)
            peer.backlog = None
            self._blocked.discard(peer)
            self._gone.append(peer)

    def _flush_backlogs(self) -> None:
        router = self._router
        assert router is not None
        for peer in list(self._blocked):
            backlog = peer.backlog
            while backlog:
                data = backlog[0]
                try:
                    router.send(peer.rid, _SNDMORE_NOBLOCK)
                except zmq.Again:
                    break
                except zmq.ZMQError:
                    backlog.clear()
                    self._gone.append(peer)
                    break
                router.send(data, zmq.NOBLOCK, copy=len(data) < _BIG)
                backlog.popleft()
                self._frames_out += 1
            if not backlog:
                peer.backlog = None
                self._blocked.discard(peer)

    def _shutdown(self, router: zmq.Socket[bytes]) -> None:
        """Tell connected clients the server is stopping, end their sessions, close."""
        now = self.clock()
        bye = tmqp.encode(terminate_frame(ResultCode.BUSY, "server stopping"))[0]
        for peer in list(self._peers.values()):
            if peer.state is PeerState.READY:
                self._send_rid(peer.rid, bye)
                self._guard("disconnect", self.engine.disconnect, peer.client_id, now)
        self._peers.clear()
        self._by_client.clear()
        self._blocked.clear()
        router.close(linger=int(self.options.linger * 1000))
        self._router = None

    def _stats_reply(self, peer: _Peer, request: tmqp.Frame) -> tmqp.Frame:
        if not self._admin_allowed(peer.client_id):
            return error_frame(request.message_id, ResultCode.UNAUTHORIZED, "unauthorized")
        body = json.dumps(self.stats(), default=str, sort_keys=True).encode("utf-8")
        return tmqp.Frame(
            message_type=MessageType.RESPONSE,
            message_id=request.message_id,
            target=peer.client_id,
            payload=body,
        )

    def _admin_allowed(self, client_id: str) -> bool:
        authorizer = getattr(self.engine, "authorizer", None)
        clients = getattr(self.engine, "clients", None)
        if authorizer is None or not isinstance(clients, dict) or client_id not in clients:
            return True
        from broker.auth import Action

        try:
            return bool(authorizer.allows(clients[client_id], Action.ADMIN))
        except Exception:
            log.exception("authorizer failed")
            return False

    def stats(self) -> dict[str, object]:
        """Transport counters plus the engine's statistics."""
        counters = dict(self.counters, frames_out=self._frames_out)
        out: dict[str, object] = {"server": counters, "peers": len(self._peers)}
        out["engine"] = self._guard_stats()
        return out

    def _guard_stats(self) -> dict[str, object]:
        try:
            return dict(self.engine.stats())
        except Exception as exc:
            return {"error": str(exc)}
