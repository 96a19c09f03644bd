"""The wire side of ``broker.Client``: received messages, errors and the I/O loop.

``IOLoop`` owns the DEALER socket: handshake, dispatch of inbound frames, keep-alive,
reconnect.  It runs on the client's background thread, or (poll-on-call clients) on
the caller's thread inside blocking calls; either way only it touches the socket.
It shares with the ``Client`` object (see ``broker.client`` for the design): the
outbox deque and its condition, the inbox deque and its condition, the pending-request
table and the joined channels / event subscriptions it replays after a reconnect.  Session states::

    HANDSHAKE --connect response--> READY --TERMINATE / silence--> BACKOFF --> HANDSHAKE
        \\--refused (401/406/400) or CURVE denied--> CLOSED (error raised to the caller)
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from broker import fastcodec, tmqp
from broker.protocol import (
    CODE_FOR_NACK_REASON,
    EVENT_NAMES,
    GREETING,
    ConnectionInfo,
    Header,
    MessageType,
    NoContent,
    Operation,
    ResultCode,
    header,
)
from broker.sockets import fast_send
from zproto.errors import DecodeError

if TYPE_CHECKING:
    from broker.client import Client

log = logging.getLogger("broker.client")

_PING = tmqp.encode(tmqp.Ping())[0]
_PONG = tmqp.encode(tmqp.Pong())[0]
_BIG = 65536
_BATCH = 1024
_PERMANENT = {ResultCode.UNAUTHORIZED, ResultCode.UNACCEPTABLE, ResultCode.BAD_REQUEST}
_AUTH_EVENTS = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
_QUEUE = MessageType.QUEUE
_ACK = MessageType.ACK
_RESPONSE = MessageType.RESPONSE
_DIRECT = MessageType.DIRECT


class ClientError(Exception):
    """Root of the client's errors."""


class ConnectError(ClientError):
    """The broker refused the session, or could not be reached in time."""


class ConnectionLost(ClientError):
    """The session ended while a request was outstanding."""


class ClientClosed(ClientError):
    """The client was closed."""


class RemoteError(ClientError):
    """The broker (or a peer) answered with a failure status or a negative acknowledge."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"{reason} (status {code})")
        self.code = code
        self.reason = reason


class Kind(Enum):
    QUEUE = "queue"
    DIRECT = "direct"
    EVENT = "event"
    REPLY = "reply"


@dataclass(frozen=True, slots=True)
class Message:
    """A frame received from the broker, with convenient names."""

    frame: tmqp.Frame

    @property
    def kind(self) -> Kind:
        return _KINDS.get(MessageType(self.frame.message_type), Kind.REPLY)

    @property
    def id(self) -> str:
        return self.frame.message_id

    @property
    def channel(self) -> str:
        return self.frame.target

    @property
    def queue_id(self) -> int:
        return self.frame.content_type

    @property
    def content_type(self) -> int:
        return self.frame.content_type

    @property
    def source(self) -> str:
        return self.frame.source

    @property
    def target(self) -> str:
        return self.frame.target

    @property
    def payload(self) -> bytes:
        return self.frame.payload

    @property
    def headers(self) -> tuple[tuple[str, str], ...]:
        return self.frame.headers

    @property
    def needs_ack(self) -> bool:
        return self.frame.pending_ack

    @property
    def needs_response(self) -> bool:
        return self.frame.pending_response

    def header(self, name: str, default: str | None = None) -> str | None:
        wanted = name.lower()
        for key, value in self.frame.headers:
            if key.lower() == wanted:
                return value
        return default

    def json(self) -> Any:
        return json.loads(self.frame.payload) if self.frame.payload else None


_new = object.__new__
#: Sets a new Message's frame without the frozen dataclass's __init__ (half the cost).
_set_message_frame: Callable[[Message, tmqp.Frame], None] = vars(Message)["frame"].__set__
_decode = fastcodec.decode
_Frame = tmqp.Frame
_QUEUE_BITS = int(MessageType.QUEUE)  # low 6 bits of the first octet
_HEADER_BIT = 32  # in the second octet: a header block follows

_KINDS = {
    MessageType.QUEUE: Kind.QUEUE,
    MessageType.DIRECT: Kind.DIRECT,
    MessageType.EVENT: Kind.EVENT,
}


def failure(frame: tmqp.Frame) -> RemoteError | None:
    """The error an ACK/RESPONSE frame reports, or None if it is a success.

    A negative acknowledge carries ``Nack-Reason`` (its content type is a queue id, not
    a status); a failed response carries the status as its content type.
    """
    reason = nack = None
    for key, value in frame.headers:
        low = key.lower()
        if low == "nack-reason":
            nack = value
        elif low == "reason":
            reason = value
    if frame.message_type == MessageType.ACK:
        if nack is None:
            return None
        status = CODE_FOR_NACK_REASON.get(nack, ResultCode.FAILED)
        return RemoteError(int(status), reason or nack)
    code = frame.content_type
    if code == ResultCode.OK:
        return None
    if reason is None:
        known = code in ResultCode._value2member_map_
        reason = ResultCode(code).name.lower().replace("_", " ") if known else "failed"
    return RemoteError(code, reason)


class _State(Enum):
    IDLE = "idle"
    HANDSHAKE = "handshake"
    READY = "ready"
    BACKOFF = "backoff"
    CLOSED = "closed"


class _Pull:
    __slots__ = ("future", "messages")

    def __init__(self, future: Future[list[Message]]) -> None:
        self.future = future
        self.messages: list[Message] = []


def _unbound_send(*args: Any) -> None:
    raise zmq.ZMQError(zmq.ENOTSOCK, "no session socket")


class StopLoop(Exception):
    """Internal: leave the I/O loop."""


class IOLoop:
    def __init__(
        self, client: Client, wake: zmq.Socket[bytes] | None, connect_deadline: float
    ) -> None:
        self.c = client
        self.wake = wake
        self.sock: zmq.Socket[bytes] | None = None
        #: ``self.sock``'s send (see ``broker.sockets.fast_send``); only used while sock is set.
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
            self.poller.register(sock, flags)

    def _unregister(self, sock: Any) -> None:
        if sock in self.flags:
            del self.flags[sock]
            self.poller.unregister(sock)

    def _timeout(self) -> int:
        c = self.c
        now = time.monotonic()
        wake = now + 1.0
        state = c._state
        if state is _State.HANDSHAKE:
            wake = min(wake, self.hs_deadline)
        elif state is _State.BACKOFF:
            wake = min(wake, self.retry_at)
        elif state is _State.READY:
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
                        frame = _decode(data)
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
        if sock is None or c._state is not _State.READY or self.want_out:
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
            and c._state is _State.READY
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
        if self.first and state is not _State.READY and now >= self.connect_deadline:
            raise self._fatal(ConnectError(f"no answer from {c.endpoint} within the timeout"))
        if state is _State.READY:
            if c._rx_paused:
                self.last_rx = now
            idle = now - self.last_rx
            if idle >= c.peer_timeout:
                self._lost(f"no traffic from the broker for {idle:.1f} s")
            elif idle >= c.ping_interval and not self.pinged:
                self.pinged = True
                self._send_now(_PING)
        elif state is _State.HANDSHAKE and now >= self.hs_deadline:
            self._lost("handshake timed out")
        elif state is _State.BACKOFF and now >= self.retry_at:
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
            from filemq import security

            secret, server_key = c._curve
            assert secret is not None and server_key is not None
            try:
                security.configure_client(sock, secret, server_key)
            except security.SecurityError as exc:
                sock.close(linger=0)
                raise self._fatal(ConnectError(str(exc))) from None
            self.monitor = sock.get_monitor_socket(_AUTH_EVENTS)
            self._register(self.monitor, zmq.POLLIN)
        sock.connect(c.endpoint)
        self.sock = sock
        self.send = fast_send(sock)
        self.hs_id = c.new_id()
        info = ConnectionInfo(
            client_id=c.client_id,
            name=c._info.name,
            type=c._info.type,
            token=c._info.token,
            properties=c._info.properties,
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
        c._state = _State.HANDSHAKE
        self.hs_deadline = now + c.peer_timeout
        self.want_out = False

    def _ready(self, frame: tmqp.Frame) -> None:
        c = self.c
        client_id = header(frame, Header.CLIENT_ID) or frame.target or c.client_id or ""
        c.client_id = client_id
        c._state = _State.READY
        self.attempt = 0
        self.last_rx = time.monotonic()
        self._close_monitor()
        log.debug("session ready as %s", client_id)
        if not self.first:
            # a new session: join the channels and subscribe the events again
            for name in list(c._channels):
                self._send_now(tmqp.encode(c._op(Operation.JOIN, name))[0])
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
        c._state = _State.BACKOFF

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
        if sock is None or c._state is not _State.READY:
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
        c._state = _State.CLOSED
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
        try:
            event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
        except zmq.Again:
            return
        if event["event"] & _AUTH_EVENTS:
            what = (
                "refused this client's CURVE key"
                if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH
                else "failed the security handshake (CURVE settings differ?)"
            )
            raise self._fatal(ConnectError(f"the broker at {self.c.endpoint} {what}"))

    # -- inbound frames ----------------------------------------------------------------

    def _dispatch(self, data: bytes) -> None:
        try:
            msg = _decode(data)
        except DecodeError as exc:
            log.warning("undecodable frame from the broker: %s", exc.reason)
            return
        if type(msg) is not tmqp.Frame:
            if type(msg) is tmqp.Ping:
                self._send_now(_PONG)
            return
        mt = msg.message_type
        c = self.c
        if mt == _QUEUE:
            if msg.headers and self._pulled(msg):
                return
            self._deliver(msg)
        elif mt in (_ACK, _RESPONSE):
            self._settle(msg)
        elif mt == _DIRECT:
            self._deliver(msg)
        elif mt == MessageType.EVENT:
            self._event(msg)
        elif mt == MessageType.TERMINATE:
            self._terminated(msg)
        elif mt == MessageType.PING:
            self._send_now(_PONG)
        elif mt != MessageType.PONG:
            log.debug("ignored frame type %#x from the broker", mt)
        del c

    def _deliver(self, frame: tmqp.Frame) -> None:
        c = self.c
        message = Message(frame)
        callback = c._on_message
        if callback is not None:
            try:
                callback(message)
            except Exception:
                log.exception("on_message callback failed")
            return
        c._inbox.append(message)
        if c._in_waiting:
            with c._in_cv:
                c._in_cv.notify()

    def _settle(self, frame: tmqp.Frame) -> None:
        c = self.c
        mid = frame.message_id
        if c._state is _State.HANDSHAKE and mid == self.hs_id:
            err = failure(frame)
            if err is None:
                self._ready(frame)
            else:
                self._refused(err.code, err.reason)
            return
        entry = c._pending.pop(mid, None)
        if entry is None:
            err = failure(frame)
            if err is not None:
                log.warning("broker reported for %r: %s", mid, err)
            return
        future, _deadline, extra = entry
        if future.done():
            return
        err = failure(frame)
        if err is not None:
            future.set_exception(err)
        elif isinstance(extra, _Pull):
            future.set_result([Message(frame)])  # a cache queue answers with a response
        else:
            future.set_result(frame)

    def _pulled(self, frame: tmqp.Frame) -> bool:
        """Route a message answering a pull request; False if it is an ordinary delivery."""
        request = header(frame, Header.REQUEST_ID)
        if request is None:
            return False
        c = self.c
        entry = c._pending.get(request)
        no_content = header(frame, Header.NO_CONTENT)
        if entry is None or not isinstance(entry[2], _Pull):
            return no_content is not None  # a late End marker; real messages are delivered
        pull: _Pull = entry[2]
        if no_content is None:
            pull.messages.append(Message(frame))
            index, count = header(frame, Header.INDEX), header(frame, Header.COUNT)
            if index is None or index != count:
                return True
        elif no_content not in (NoContent.END, NoContent.EMPTY):
            c._pending.pop(request, None)
            code = CODE_FOR_NACK_REASON.get(no_content.lower(), ResultCode.NOT_FOUND)
            if no_content == NoContent.UNAUTHORIZED:
                code = ResultCode.UNAUTHORIZED
            if not pull.future.done():
                pull.future.set_exception(RemoteError(int(code), no_content))
            return True
        c._pending.pop(request, None)
        if not pull.future.done():
            pull.future.set_result(pull.messages)
        return True

    def _event(self, frame: tmqp.Frame) -> None:
        c = self.c
        name: str = frame.target if frame.target in EVENT_NAMES else frame.source
        channel = header(frame, Header.CHANNEL_NAME)
        queue = header(frame, Header.QUEUE_ID)
        message = Message(frame)
        handled = False
        for event, want_channel, want_queue, callback in list(c._event_handlers):
            if event != name:
                continue
            if want_channel is not None and channel is not None and want_channel != channel:
                continue
            if want_queue is not None and queue is not None and str(want_queue) != queue:
                continue
            handled = True
            try:
                callback(message)
            except Exception:
                log.exception("event callback failed")
        if not handled:
            c._inbox.append(message)
            if c._in_waiting:
                with c._in_cv:
                    c._in_cv.notify()

    def _terminated(self, frame: tmqp.Frame) -> None:
        code = frame.content_type
        reason = header(frame, Header.REASON) or "no reason given"
        if self.c._state is _State.HANDSHAKE:
            self._refused(code, reason)
        else:
            self._lost(f"the broker ended the session: {reason} (status {code})")

    def _refused(self, code: int, reason: str) -> None:
        """The broker turned down the connection info."""
        if code in _PERMANENT:
            err = ConnectError(f"the broker refused the connection: {reason} (status {code})")
            raise self._fatal(err)
        self._lost(f"connection refused for now: {reason} (status {code})")


__all__ = ["ClientClosed", "IOLoop"]
