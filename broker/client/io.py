"""The wire side of ``broker.Client``: the I/O loop, the session and reconnects.

``IOLoop`` owns the DEALER socket: handshake, keep-alive, reconnect, and the inbound
frames it hands to its base class ``broker.client_inbound.InboundFrames``.  It runs on
the client's background thread, or (poll-on-call clients) on the caller's thread inside
blocking calls; either way only it touches the socket.  It shares with the ``Client``
object (see ``broker.client`` for the design): the outbox deque and its condition, the
inbox deque and its condition, the pending-request table and the joined channels / event
subscriptions it replays after a reconnect.  Session states::

    HANDSHAKE --connect response--> READY --TERMINATE / silence--> BACKOFF --> HANDSHAKE
        \\--refused (401/406/400) or CURVE denied--> CLOSED (error raised to the caller)

The client's errors live in ``broker.client_errors`` and :class:`Message` in
``broker.client_message``; both are importable from here too.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import zmq

from broker import tmqp
from broker.client.core import SessionState, session_properties
from broker.client.errors import (
    AccessRefused,
    ClientClosed,
    ClientError,
    ConnectError,
    ConnectionLost,
    RemoteError,
    StopLoop,
    failure,
)
from broker.client.frames import join_frame
from broker.client.inbound import InboundFrames
from broker.client.message import Kind, Message
from broker.protocol import GREETING, ConnectionInfo, Header, MessageType, header
from zerohub import zmqkit
from zproto.errors import DecodeError

if TYPE_CHECKING:
    from broker.client.blocking import Client

__all__ = [
    "ClientClosed",
    "ClientError",
    "ConnectError",
    "ConnectionLost",
    "IOLoop",
    "Kind",
    "Message",
    "RemoteError",
    "StopLoop",
    "failure",
]

log = logging.getLogger("broker.client.blocking")

_PING = tmqp.encode(tmqp.Ping())[0]
_BIG = 65536
_BATCH = 1024

_new = object.__new__
#: Sets a new Message's frame without the frozen dataclass's __init__ (half the cost).
_set_message_frame: Callable[[Message, tmqp.Frame], None] = vars(Message)["frame"].__set__
_decode = tmqp.decode
_Frame = tmqp.Frame
_QUEUE_BITS = int(MessageType.QUEUE)  # low 6 bits of the first octet
_HEADER_BIT = 32  # in the second octet: a header block follows


def _unbound_send(*args: Any) -> None:
    raise zmq.ZMQError(zmq.ENOTSOCK, "no session socket")


class IOLoop(InboundFrames):
    """The client's I/O loop and session (see the module docstring)."""

    def __init__(
        self, client: Client, wake: zmq.Socket[bytes] | None, connect_deadline: float
    ) -> None:
        self.c = client
        self.wake = wake
        self.sock: zmq.Socket[bytes] | None = None
        #: ``self.sock``'s send (see ``zerohub.zmqkit.fast_send``); only used while sock is set.
        self.send: Callable[..., Any] = _unbound_send
        self.monitor: zmq.Socket[bytes] | None = None
        self.poller = zmq.Poller()
        self.flags: dict[Any, int] = {}
        self.first = True
        self.connect_deadline = connect_deadline
        self.attempt = 0
        self.retry_at = 0.0
        self.hs_deadline = 0.0
        self.hs_id = ""
        self.last_rx = 0.0
        self.pinged = False
        self.keepalive_at = 0.0
        self.want_out = False
        self.next_sweep = 0.0
        if wake is not None:
            self._register(wake, zmq.POLLIN)

    # -- main loop ---------------------------------------------------------------------

    def run(self) -> None:
        """The background thread's loop (threaded clients)."""
        try:
            self.begin()
            while True:
                self.step()
        except StopLoop:
            pass

    def begin(self) -> None:
        self._handshake(time.monotonic())

    def step(self, cap_ms: int | None = None) -> None:
        """One poll of the sockets (at most ``cap_ms``), then the due timers.

        Raises ``StopLoop`` when the session ends for good (``close``, refusal, no reconnect).
        """
        c = self.c
        sock = self.sock
        if sock is not None:
            # a full inbox stops reading, unless a reply is awaited
            flags = zmq.POLLIN if not c._rx_paused or c._pending else 0
            if self.want_out:
                flags |= zmq.POLLOUT
            self._register(sock, flags)
        timeout = self._timeout()
        if cap_ms is not None and cap_ms < timeout:
            timeout = cap_ms
        events = dict(self.poller.poll(timeout))
        if self.wake is not None and self.wake in events:
            self._drain_wake()
        if sock is not None and sock is self.sock:
            ev = events.get(sock, 0)
            if ev & zmq.POLLIN:
                self._drain(sock)
            if ev & zmq.POLLOUT:
                self.want_out = False
        if self.monitor is not None and self.monitor in events:
            self._on_monitor()
        if c._outbox:
            self.flush()
        self._timers(time.monotonic())

    def _register(self, sock: Any, flags: int) -> None:
        if self.flags.get(sock) != flags:
            self.flags[sock] = flags
            self.poller.register(sock, flags)  # flags 0 takes it out of the poller

    def _unregister(self, sock: Any) -> None:
        if sock in self.flags and self.flags.pop(sock):  # 0: already out of the poller
            self.poller.unregister(sock)

    def _timeout(self) -> int:
        c = self.c
        now = time.monotonic()
        wake = now + 1.0
        state = c._state
        if state is SessionState.HANDSHAKE:
            wake = min(wake, self.hs_deadline)
        elif state is SessionState.BACKOFF:
            wake = min(wake, self.retry_at)
        elif state is SessionState.READY:
            wake = min(wake, self.last_rx + c.ping_interval)
        if self.first:
            wake = min(wake, self.connect_deadline)
        return max(0, int((wake - now) * 1000) + 1)

    def _drain_wake(self) -> None:
        c = self.c
        assert self.wake is not None
        while True:
            try:
                msg = self.wake.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            if msg == b"STOP":
                self.goodbye()
                raise StopLoop
        with c._cv:
            c._woken = False
        if c._rx_paused and len(c._inbox) <= c.max_inbox // 2:
            c._rx_paused = False

    def _drain(self, sock: zmq.Socket[bytes]) -> None:
        c = self.c
        recv = sock.recv
        dispatch = self._dispatch
        # Queue deliveries without headers (not pull answers, not markers) are what
        # _dispatch would hand to _deliver: with no callback they go straight to the inbox.
        inbox = c._inbox if c._on_message is None else None
        append = inbox.append if inbox is not None else None
        try:
            for _ in range(_BATCH):
                try:
                    data = recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if (
                    append is not None
                    and len(data) > 8
                    and data[0] & 63 == _QUEUE_BITS
                    and not data[1] & _HEADER_BIT
                ):
                    try:
                        frame = _decode((data,))
                    except DecodeError:
                        frame = None
                    if type(frame) is not _Frame:
                        dispatch(data)  # logs what is wrong
                        continue
                    message = _new(Message)
                    _set_message_frame(message, frame)
                    append(message)
                    continue
                dispatch(data)
                if self.sock is not sock:
                    return  # the session was reset while dispatching
        finally:
            # once per batch (the waiters registered before looking at the inbox)
            if inbox and c._in_waiting:
                with c._in_cv:
                    c._in_cv.notify_all()
        self.last_rx = time.monotonic()
        self.pinged = False
        if c._on_message is None and len(c._inbox) >= c.max_inbox:
            c._rx_paused = True

    def flush(self) -> None:
        """Send the outbox until it is empty or the socket's pipe is full."""
        c = self.c
        sock = self.sock
        if sock is None or c._state is not SessionState.READY or self.want_out:
            return
        out = c._outbox
        send = self.send
        while out:
            data = out[0]
            try:
                send(data, zmq.NOBLOCK, len(data) < _BIG)
            except zmq.Again:
                self.want_out = True
                break
            out.popleft()
        if c._out_waiting and len(out) < c.max_outbox:
            with c._cv:
                c._cv.notify_all()

    def send_or_queue(self, data: bytes) -> None:
        """Poll-on-call: send ``data`` now unless frames wait before it; else queue it."""
        c = self.c
        if (
            not c._outbox
            and not self.want_out
            and c._state is SessionState.READY
            and self.sock is not None
        ):
            try:
                self.send(data, zmq.NOBLOCK, len(data) < _BIG)
                return
            except zmq.Again:
                self.want_out = True
        c._outbox.append(data)
        self.flush()

    def _timers(self, now: float) -> None:
        c = self.c
        state = c._state
        if self.first and state is not SessionState.READY and now >= self.connect_deadline:
            raise self._fatal(ConnectError(f"no answer from {c.endpoint} within the timeout"))
        if state is SessionState.READY:
            if c._rx_paused:
                # Not reading (full inbox): the broker's silence is ours.  Tell it we are
                # alive, or it would end the session it cannot reach: it holds what we
                # have not taken (its windows) for as long as we want.
                self.last_rx = now
                if now >= self.keepalive_at:
                    self.keepalive_at = now + c.ping_interval
                    self._send_now(_PING)
            idle = now - self.last_rx
            if idle >= c.peer_timeout:
                self._lost(f"no traffic from the broker for {idle:.1f} s")
            elif idle >= c.ping_interval and not self.pinged:
                self.pinged = True
                self._send_now(_PING)
        elif state is SessionState.HANDSHAKE and now >= self.hs_deadline:
            self._lost("handshake timed out")
        elif state is SessionState.BACKOFF and now >= self.retry_at:
            self._handshake(now)
        if now >= self.next_sweep:
            self.next_sweep = now + 0.5
            self._sweep(now)

    def _sweep(self, now: float) -> None:
        pending = self.c._pending
        late = [mid for mid, entry in list(pending.items()) if entry[1] <= now]
        for mid in late:
            entry = pending.pop(mid, None)
            if entry is not None and not entry[0].done():
                entry[0].set_exception(TimeoutError(f"no answer to {mid}"))

    # -- session -----------------------------------------------------------------------

    def _handshake(self, now: float) -> None:
        c = self.c
        sock = c.context.socket(zmq.DEALER)
        sock.linger = 0
        sock.sndhwm = c.hwm
        sock.rcvhwm = c.hwm
        sock.routing_id = b"\x01" + os.urandom(15)
        if c._curve is not None:
            secret, server_key = c._curve
            assert secret is not None and server_key is not None
            try:
                zmqkit.configure_client(sock, secret, server_key)
            except zmqkit.SecurityError as exc:
                sock.close(linger=0)
                raise self._fatal(ConnectError(str(exc))) from None
        if c._curve is not None or self.first:
            # handshake failures (CURVE key refused; a plain client against a CURVE server,
            # watched on the first connection) end connect() at once
            self.monitor = sock.get_monitor_socket(zmqkit.HANDSHAKE_EVENTS)
            self._register(self.monitor, zmq.POLLIN)
        sock.connect(c.endpoint)
        self.sock = sock
        self.send = zmqkit.fast_send(sock)
        self.hs_id = c.new_id()
        info = ConnectionInfo(
            client_id=c.client_id,
            name=c._info.name,
            type=c._info.type,
            token=c._info.token,
            properties=session_properties(c._info.properties, c.session_secret),
        )
        frame = info.to_frame(self.hs_id)
        frame = tmqp.Frame(
            message_type=frame.message_type,
            pending_response=True,
            content_type=frame.content_type,
            message_id=frame.message_id,
            payload=frame.payload,
        )
        sock.send(GREETING, zmq.NOBLOCK)
        sock.send(tmqp.encode(frame)[0], zmq.NOBLOCK)
        c._state = SessionState.HANDSHAKE
        self.hs_deadline = now + c.peer_timeout
        self.want_out = False

    def _ready(self, frame: tmqp.Frame) -> None:
        c = self.c
        client_id = header(frame, Header.CLIENT_ID) or frame.target or c.client_id or ""
        c.client_id = client_id
        c.session_secret = header(frame, Header.SESSION_SECRET)
        c._state = SessionState.READY
        self.attempt = 0
        self.last_rx = time.monotonic()
        self._close_monitor()
        log.debug("session ready as %s", client_id)
        if not self.first:
            # a new session: join the channels and subscribe the events again
            for name, prefetch in list(c._channels.items()):
                self._send_now(tmqp.encode(join_frame(c.new_id(), name, prefetch))[0])
            for event, channel, queue_id in list(c._subscriptions):
                self._send_now(tmqp.encode(c._event_frame(event, True, channel, queue_id))[0])
        if c._outbox:
            self.flush()
        if self.first:
            self.first = False
            c._connected.set_result(client_id)

    def _lost(self, reason: str) -> None:
        """The session is gone: fail what waits, then reconnect after a backoff (or stop)."""
        c = self.c
        log.info("session lost: %s", reason)
        self._close_socket()
        err = ConnectionLost(reason)
        for mid in list(c._pending):
            entry = c._pending.pop(mid, None)
            if entry is not None and not entry[0].done():
                entry[0].set_exception(err)
        if not c.reconnect and not self.first:
            raise self._fatal(err)
        low, high = c.backoff
        delay = min(high, low * (2**self.attempt)) * (0.5 + random.random() / 2)
        self.attempt += 1
        self.retry_at = time.monotonic() + delay
        c._state = SessionState.BACKOFF

    def _fatal(self, err: Exception) -> StopLoop:
        c = self.c
        c._error = err if isinstance(err, ConnectError | ConnectionLost) else None
        if not c._connected.done():
            c._connected.set_exception(err)
        self._close_socket()
        return StopLoop()

    def _close_monitor(self) -> None:
        if self.monitor is not None:
            self._unregister(self.monitor)
            if self.sock is not None:
                self.sock.disable_monitor()
            self.monitor.close(linger=0)
            self.monitor = None

    def _close_socket(self) -> None:
        self._close_monitor()
        if self.sock is not None:
            self._unregister(self.sock)
            self.sock.close(linger=0)
            self.sock = None
        self.want_out = False

    def goodbye(self) -> None:
        """Closing: send what is queued (within the linger time) and TERMINATE."""
        c = self.c
        sock = self.sock
        if sock is None or c._state is not SessionState.READY:
            return
        deadline = time.monotonic() + c.linger
        out = c._outbox
        out.append(tmqp.encode(tmqp.Frame(message_type=MessageType.TERMINATE))[0])
        while out and time.monotonic() < deadline:
            try:
                sock.send(out[0], zmq.NOBLOCK)
                out.popleft()
            except zmq.Again:
                sock.poll(50, zmq.POLLOUT)
        sock.linger = max(0, int((deadline - time.monotonic()) * 1000))
        self._unregister(sock)
        sock.close()
        self.sock = None

    def finish(self) -> None:
        """The loop is over: close the sockets, fail what still waits, wake the waiters."""
        c = self.c
        self._close_socket()
        c._state = SessionState.CLOSED
        err = c._error or ClientClosed("client is closed")
        if not c._connected.done():
            c._connected.set_exception(err)
        for mid in list(c._pending):
            entry = c._pending.pop(mid, None)
            if entry is not None and not entry[0].done():
                entry[0].set_exception(err)
        with c._cv:
            c._cv.notify_all()
        with c._in_cv:
            c._in_cv.notify_all()

    def _send_now(self, data: bytes) -> None:
        if self.sock is not None:
            try:
                self.sock.send(data, zmq.NOBLOCK)
            except zmq.Again:
                self.c._outbox.appendleft(data)

    def _on_monitor(self) -> None:
        assert self.monitor is not None
        failure = zmqkit.read_monitor(self.monitor, curve=self.c._curve is not None).handshake
        if failure is not None:
            if failure is zmqkit.Handshake.KEY_REFUSED:
                what = "refused this client's CURVE key"
            elif failure is zmqkit.Handshake.CURVE_REQUIRED:
                what = zmqkit.CURVE_REQUIRED_HINT
            else:
                what = "failed the security handshake (CURVE settings differ?)"
            raise self._fatal(AccessRefused(f"the broker at {self.c.endpoint} {what}"))
