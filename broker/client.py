"""Blocking Python client of the zerohub broker (TMQP frames over a ZeroMQ DEALER).

Design: one background I/O thread owns the DEALER socket; every public method
may be called from any thread.

* Sending: the caller encodes the frame and appends it to an outbox deque; the
  I/O thread is woken over an inproc PAIR socket only when the outbox goes from
  empty to non-empty, so a burst of ``push`` calls costs one wake-up.  A full
  outbox (``max_outbox`` frames) blocks the caller: backpressure, not memory growth.
* Replies: requests register a ``concurrent.futures.Future`` under their message
  id; the I/O thread settles it when the ACK/RESPONSE arrives, so any number of
  requests may be outstanding (``*_async`` methods return the futures).
* Receiving: queue messages, direct messages and (callback-less) events go to an
  inbox read by ``consume()``/``receive()``, or to an ``on_message`` callback that
  runs on the I/O thread.  A full inbox pauses reading (ZeroMQ pushes back).
* Liveness: if nothing arrives for ``ping_interval`` the client sends PING; after
  ``peer_timeout`` of silence, or a TERMINATE from the server, the session is
  re-established with exponential backoff: a new socket, the greeting, the
  connection info under the same client id, then the channels are re-joined and
  events re-subscribed.  Requests outstanding at that moment fail with
  ``ConnectionLost`` (fire-and-forget frames still in the outbox are sent later).

Poll-on-call (``threaded=False``): no thread at all; the calling thread owns the
socket, ``push`` sends at once, and blocking calls (``receive``, ``join``, waiting on a
returned future, ``poll``) run the same I/O loop until they are satisfied.  Cheapest
per message (the benchmark uses it); use it from one thread only, and call ``poll()``
now and then when idle so the broker's PINGs get answered.  Message ids are
``<random prefix>-<counter>``; every request carries one.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from typing import Any

import zmq

from broker import tmqp
from broker.client_admin import AdminOperations
from broker.client_io import (
    ClientClosed,
    ClientError,
    ConnectError,
    ConnectionLost,
    IOLoop,
    Kind,
    Message,
    RemoteError,
    StopLoop,
    _Pull,
    _State,
)
from broker.fastcodec import queue_frame_bytes
from broker.protocol import (
    DEFAULT_ENDPOINT,
    ConnectionInfo,
    Header,
    MessageType,
    Operation,
    ResultCode,
)

log = logging.getLogger(__name__)

__all__ = [
    "Client",
    "ClientClosed",
    "ClientError",
    "ConnectError",
    "ConnectionLost",
    "Kind",
    "Message",
    "RemoteError",
    "queue_frame_bytes",
]

_Q = MessageType.QUEUE
_ids = itertools.count(1)


Headers = Mapping[str, str] | tuple[tuple[str, str], ...]


def _headers(headers: Headers | None) -> tuple[tuple[str, str], ...]:
    if not headers:
        return ()
    if isinstance(headers, Mapping):
        return tuple((str(k), str(v)) for k, v in headers.items())
    return tuple(headers)


def _as_bytes(payload: bytes | str | None) -> bytes:
    if payload is None:
        return b""
    return payload.encode("utf-8") if isinstance(payload, str) else bytes(payload)


class Client(AdminOperations):
    """A connection to the broker.  Use as a context manager or call ``connect``/``close``."""

    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        *,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        client_id: str | None = None,
        name: str | None = None,
        client_type: str | None = None,
        token: str | None = None,
        properties: Mapping[str, str] | None = None,
        server_key: str | os.PathLike[str] | None = None,
        curve_secret: str | os.PathLike[str] | None = None,
        timeout: float = 10.0,
        ping_interval: float = 5.0,
        peer_timeout: float = 15.0,
        reconnect: bool = True,
        backoff: tuple[float, float] = (0.05, 5.0),
        max_outbox: int = 10_000,
        max_inbox: int = 10_000,
        hwm: int = 10_000,
        linger: float = 1.0,
        threaded: bool = True,
    ) -> None:
        if (server_key is None) != (curve_secret is None):
            raise ValueError("CURVE needs both server_key and curve_secret")
        self.endpoint = endpoint
        self.context = context or zmq.Context.instance()
        self.timeout = timeout
        self.ping_interval = ping_interval
        self.peer_timeout = peer_timeout
        self.reconnect = reconnect
        self.backoff = backoff
        self.max_outbox = max_outbox
        self.max_inbox = max_inbox
        self.hwm = hwm
        self.linger = linger
        self.threaded = threaded
        self._info = ConnectionInfo(
            client_id=client_id,
            name=name,
            type=client_type,
            token=token,
            properties=dict(properties or {}),
        )
        self._curve = (curve_secret, server_key) if curve_secret is not None else None
        self.client_id: str | None = client_id
        prefix = f"{random.getrandbits(32):08x}-"
        self._counter = itertools.count(1)
        self._prefix = prefix
        # shared between caller threads and the I/O thread
        self._cv = threading.Condition()
        self._outbox: deque[bytes] = deque()
        self._woken = False
        self._out_waiting = 0
        self._inbox: deque[Message] = deque()
        self._in_cv = threading.Condition()
        self._in_waiting = 0
        self._rx_paused = False
        self._pending: dict[str, tuple[Future[Any], float, Any]] = {}
        self._channels: dict[str, None] = {}
        self._targets: dict[str, bytes] = {}
        self._subscriptions: dict[tuple[str, str | None, int | None], None] = {}
        self._event_handlers: list[tuple[str, str | None, int | None, Callable[..., Any]]] = []
        self._on_message: Callable[[Message], Any] | None = None
        self._connected: Future[str] = Future()
        self._error: ClientError | None = None
        self._state = _State.IDLE
        self._thread: threading.Thread | None = None
        self._io_ident = 0
        self._wake_addr = f"inproc://zerohub-client-{os.getpid()}-{next(_ids)}"
        self._wake_tx: zmq.Socket[bytes] | None = None
        self._loop: IOLoop | None = None  # poll-on-call: the loop the caller drives
        self._unpumped = 0

    # -- lifecycle ---------------------------------------------------------------------

    def connect(self, timeout: float | None = None) -> Client:
        """Open the session and wait until the broker accepted it (``ConnectError`` if not)."""
        if self._thread is not None or self._loop is not None:
            raise ClientError("already connected")
        wait = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        if not self.threaded:
            self._loop = loop = IOLoop(self, None, deadline)
            self._wake_tx = _NO_WAKE
            try:
                loop.begin()
                self._pump(self._connected.done, None)
                self.client_id = self._connected.result(0)
            except BaseException:
                self.close()
                raise
            return self
        rx = self.context.socket(zmq.PAIR)
        rx.linger = 0
        rx.bind(self._wake_addr)
        tx = self.context.socket(zmq.PAIR)
        tx.linger = 0
        tx.connect(self._wake_addr)
        self._wake_tx = tx
        self._thread = threading.Thread(
            target=self._io_main, args=(rx, deadline), name="broker-client"
        )
        self._thread.daemon = True
        self._thread.start()
        try:
            self.client_id = self._connected.result(wait + 1.0)
        except BaseException:
            self.close()
            raise
        return self

    def close(self, timeout: float = 5.0) -> None:
        """End the session (TERMINATE), stop the I/O thread, fail what is outstanding."""
        loop = self._loop
        if loop is not None:
            self._loop = None
            self._wake_tx = None
            loop.goodbye()
            loop.finish()
            return
        with self._cv:
            tx, self._wake_tx = self._wake_tx, None
            if tx is not None:
                with contextlib.suppress(zmq.ZMQError):
                    tx.send(b"STOP", zmq.NOBLOCK)
                tx.close(linger=0)
            self._cv.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                raise ClientError(f"client I/O thread did not stop within {timeout} s")
        self._state = _State.CLOSED
        with self._in_cv:
            self._in_cv.notify_all()

    def poll(self, timeout: float = 0.0) -> None:
        """Poll-on-call clients: handle what arrived (replies, PINGs, reconnects) for a while.

        Call it now and then when not otherwise calling the client, so that the broker's
        PINGs are answered; threaded clients do this on their I/O thread (no-op here).
        """
        if self._loop is not None:
            deadline = time.monotonic() + timeout
            self._pump(lambda: time.monotonic() >= deadline, deadline, first=True)

    def _future(self) -> Future[Any]:
        return _PumpedFuture(self) if self._loop is not None else Future()

    def _pump(
        self, done: Callable[[], bool], deadline: float | None, *, first: bool = False
    ) -> bool:
        """Poll-on-call: run the I/O loop on this thread until ``done()`` or the deadline."""
        loop = self._loop
        if loop is None:
            raise self._error or ClientClosed("client is closed")
        self._unpumped = 0
        while first or not done():
            cap = None
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 and not first:
                    return False
                cap = max(0, int(left * 1000) + 1)
            first = False
            try:
                loop.step(cap)
            except StopLoop:
                self._loop = None
                self._wake_tx = None
                loop.finish()
                raise self._error or ClientClosed("client is closed") from None
        return True

    def __enter__(self) -> Client:
        if self._thread is None and self._loop is None:
            self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def connected(self) -> bool:
        return self._state is _State.READY

    # -- sending -----------------------------------------------------------------------

    def new_id(self) -> str:
        return f"{self._prefix}{next(self._counter)}"

    def _enqueue(self, data: bytes) -> None:
        loop = self._loop
        if loop is not None:  # poll-on-call: send right here
            out = self._outbox
            loop.send_or_queue(data)
            self._unpumped += 1
            if len(out) >= self.max_outbox:
                self._pump(lambda: len(out) < self.max_outbox // 2, None)
            elif self._unpumped >= 1000:
                self._pump(lambda: True, 0.0, first=True)  # replies, PINGs: no waiting
            return
        with self._cv:
            if len(self._outbox) >= self.max_outbox and threading.get_ident() != self._io_ident:
                self._out_waiting += 1
                try:
                    while len(self._outbox) >= self.max_outbox and self._wake_tx is not None:
                        self._cv.wait(1.0)
                finally:
                    self._out_waiting -= 1
            tx = self._wake_tx
            if tx is None:
                raise self._error or ClientClosed("client is closed")
            self._outbox.append(data)
            if not self._woken:
                self._woken = True
                with contextlib.suppress(zmq.Again):
                    tx.send(b"", zmq.NOBLOCK)

    def send_frame(self, frame: tmqp.Frame) -> None:
        """Send any TMQP frame as is (fire and forget)."""
        self._enqueue(tmqp.encode(frame)[0])

    def request_frame(self, frame: tmqp.Frame, timeout: float | None = None) -> Future[Any]:
        """Send a frame with a message id and return the future of its ACK/RESPONSE frame."""
        if not frame.message_id:
            raise ValueError("a request needs a message id")
        future: Future[Any] = self._future()
        wait = self.timeout if timeout is None else timeout
        self._pending[frame.message_id] = (future, time.monotonic() + wait, None)
        try:
            self._enqueue(tmqp.encode(frame)[0])
        except BaseException:
            self._pending.pop(frame.message_id, None)
            raise
        return future

    def _wait(self, future: Future[Any], timeout: float | None) -> Any:
        if threading.get_ident() == self._io_ident:
            raise ClientError("blocking call from a callback: use the *_async method")
        wait = self.timeout if timeout is None else timeout
        if self._loop is not None:
            self._pump(future.done, time.monotonic() + wait + 0.5)
        try:
            return future.result(wait + 0.5)
        except TimeoutError:
            raise TimeoutError(f"no answer from the broker within {wait} s") from None

    def _call(self, frame: tmqp.Frame, timeout: float | None = None) -> tmqp.Frame:
        result: tmqp.Frame = self._wait(self.request_frame(frame, timeout), timeout)
        return result

    # -- queues ------------------------------------------------------------------------

    def push(
        self,
        channel: str,
        queue_id: int,
        payload: bytes | str,
        *,
        ack: bool = False,
        high_priority: bool = False,
        headers: Headers | None = None,
        message_id: str | None = None,
        timeout: float | None = None,
    ) -> str:
        """Push into a queue; with ``ack`` wait for the broker's acknowledge. Returns the id."""
        mid = message_id or f"{self._prefix}{next(self._counter)}"
        body = payload if type(payload) is bytes else _as_bytes(payload)
        data = None
        if not headers:
            target = self._targets.get(channel)
            if target is None:
                target = self._target_bytes(channel)
            if target is not None:
                source = (self.client_id or "").encode()
                data = queue_frame_bytes(high_priority, ack, queue_id, mid, target, body, source)
        if data is None:  # the general path (headers, or a value the codec must judge)
            frame = tmqp.Frame(
                high_priority=high_priority,
                message_type=_Q,
                pending_ack=ack,
                content_type=queue_id,
                message_id=mid,
                source=self.client_id or "",
                target=channel,
                headers=_headers(headers),
                payload=body,
            )
            data = tmqp.encode(frame)[0]
        if not ack:
            self._enqueue(data)
            return mid
        future: Future[Any] = self._future()
        wait = self.timeout if timeout is None else timeout
        self._pending[mid] = (future, time.monotonic() + wait, None)
        try:
            self._enqueue(data)
        except BaseException:
            self._pending.pop(mid, None)
            raise
        self._wait(future, timeout)
        return mid

    def _target_bytes(self, channel: str) -> bytes | None:
        raw = channel.encode("utf-8")
        if len(raw) > 255:
            return None
        if len(self._targets) < 4096:
            self._targets[channel] = raw
        return raw

    def push_async(
        self,
        channel: str,
        queue_id: int,
        payload: bytes | str,
        *,
        high_priority: bool = False,
        headers: Headers | None = None,
        message_id: str | None = None,
        timeout: float | None = None,
    ) -> Future[Any]:
        """Push asking for an acknowledge; the future fails with RemoteError on a nack."""
        frame = tmqp.Frame(
            high_priority=high_priority,
            message_type=_Q,
            pending_ack=True,
            content_type=queue_id,
            message_id=message_id or self.new_id(),
            target=channel,
            headers=_headers(headers),
            payload=_as_bytes(payload),
        )
        return self.request_frame(frame, timeout)

    def join(self, channel: str, timeout: float | None = None) -> None:
        """Join a channel: its push/broadcast/round-robin queues deliver to this client."""
        self._call(self._op(Operation.JOIN, channel), timeout)
        self._channels[channel] = None

    def leave(self, channel: str, timeout: float | None = None) -> None:
        self._channels.pop(channel, None)
        self._call(self._op(Operation.LEAVE, channel), timeout)

    def ack(self, message: Message) -> None:
        """Positive acknowledge of a received queue or direct message."""
        self._enqueue(tmqp.encode(self._ack_frame(message, ()))[0])

    def nack(self, message: Message, reason: str = "none") -> None:
        """Negative acknowledge (``Nack-Reason`` header)."""
        frame = self._ack_frame(message, ((Header.NACK_REASON, reason),))
        self._enqueue(tmqp.encode(frame)[0])

    @staticmethod
    def _ack_frame(message: Message, headers: tuple[tuple[str, str], ...]) -> tmqp.Frame:
        f = message.frame
        if f.message_type == MessageType.DIRECT:
            return tmqp.Frame(
                high_priority=True,
                message_type=MessageType.ACK,
                message_id=f.message_id,
                target=f.source,
                headers=headers,
            )
        return tmqp.Frame(
            message_type=MessageType.ACK,
            content_type=f.content_type,
            message_id=f.message_id,
            target=f.target,
            headers=headers,
        )

    def pull(
        self,
        channel: str,
        queue_id: int,
        count: int = 1,
        *,
        clear: str | None = None,
        order: str | None = None,
        info: bool = False,
        timeout: float | None = None,
    ) -> list[Message]:
        """Pull up to ``count`` messages from a pull (or cache) queue."""
        return list(self._wait(self.pull_async(channel, queue_id, count, clear=clear,
                                               order=order, info=info, timeout=timeout),
                               timeout))  # fmt: skip

    def pull_async(
        self,
        channel: str,
        queue_id: int,
        count: int = 1,
        *,
        clear: str | None = None,
        order: str | None = None,
        info: bool = False,
        timeout: float | None = None,
    ) -> Future[list[Message]]:
        headers = [(Header.COUNT, str(count))]
        if clear:
            headers.append((Header.CLEAR, clear))
        if order:
            headers.append((Header.ORDER, order))
        if info:
            headers.append((Header.INFO, "yes"))
        mid = self.new_id()
        frame = tmqp.Frame(
            message_type=MessageType.PULL,
            pending_response=True,
            content_type=queue_id,
            message_id=mid,
            target=channel,
            headers=tuple(headers),
        )
        future: Future[list[Message]] = self._future()
        wait = self.timeout if timeout is None else timeout
        self._pending[mid] = (future, time.monotonic() + wait, _Pull(future))
        self._enqueue(tmqp.encode(frame)[0])
        return future

    # -- direct messages ---------------------------------------------------------------

    def send(
        self,
        target: str,
        payload: bytes | str = b"",
        *,
        content_type: int = 0,
        headers: Headers | None = None,
        high_priority: bool = False,
    ) -> str:
        """Fire-and-forget direct message to a client id, ``@name:NAME`` or ``@type:TYPE``."""
        mid = self.new_id()
        frame = tmqp.Frame(
            high_priority=high_priority,
            message_type=MessageType.DIRECT,
            content_type=content_type,
            message_id=mid,
            target=target,
            headers=_headers(headers),
            payload=_as_bytes(payload),
        )
        self._enqueue(tmqp.encode(frame)[0])
        return mid

    def request_async(
        self,
        target: str,
        payload: bytes | str = b"",
        *,
        content_type: int = 0,
        headers: Headers | None = None,
        ack: bool = False,
        timeout: float | None = None,
    ) -> Future[Any]:
        """Direct message waiting for a response (or, with ``ack``, an acknowledge)."""
        frame = tmqp.Frame(
            message_type=MessageType.DIRECT,
            pending_response=not ack,
            pending_ack=ack,
            content_type=content_type,
            message_id=self.new_id(),
            target=target,
            headers=_headers(headers),
            payload=_as_bytes(payload),
        )
        return self.request_frame(frame, timeout)

    def request(
        self,
        target: str,
        payload: bytes | str = b"",
        *,
        content_type: int = 0,
        headers: Headers | None = None,
        timeout: float | None = None,
    ) -> Message:
        """Send a direct message and wait for the peer's response."""
        future = self.request_async(
            target, payload, content_type=content_type, headers=headers, timeout=timeout
        )
        return Message(self._wait(future, timeout))

    def respond(
        self,
        message: Message,
        payload: bytes | str = b"",
        *,
        code: int = ResultCode.OK,
        headers: Headers | None = None,
    ) -> None:
        """Answer a direct message that waits for a response."""
        frame = tmqp.Frame(
            message_type=MessageType.RESPONSE,
            content_type=code,
            message_id=message.id,
            target=message.source,
            headers=_headers(headers),
            payload=_as_bytes(payload),
        )
        self._enqueue(tmqp.encode(frame)[0])

    # -- receiving ---------------------------------------------------------------------

    def on_message(self, callback: Callable[[Message], Any] | None) -> None:
        """Deliver queue and direct messages to ``callback`` on the I/O thread instead."""
        self._on_message = callback

    def receive(self, timeout: float | None = None) -> Message | None:
        """Next queue/direct/event message, or None after ``timeout`` seconds."""
        inbox = self._inbox
        if not inbox:
            deadline = None if timeout is None else time.monotonic() + timeout
            if self._loop is not None:
                if not self._pump(lambda: bool(inbox), deadline):
                    return None
            elif not self._await_inbox(deadline):
                return None
        msg = inbox.popleft()
        if self._rx_paused and len(inbox) <= self.max_inbox // 2:
            self._resume()
        return msg

    def _await_inbox(self, deadline: float | None) -> bool:
        inbox = self._inbox
        with self._in_cv:
            self._in_waiting += 1
            try:
                while not inbox:
                    if self._state is _State.CLOSED:
                        raise self._error or ClientClosed("client is closed")
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._in_cv.wait(left if left is not None else 1.0)
            finally:
                self._in_waiting -= 1
        return True

    def consume(self, timeout: float | None = None) -> Iterator[Message]:
        """Iterate over received messages; stops after ``timeout`` seconds without one."""
        inbox = self._inbox
        while True:
            if inbox and not self._rx_paused:
                yield inbox.popleft()
                continue
            msg = self.receive(timeout)
            if msg is None:
                return
            yield msg

    def _resume(self) -> None:
        """The inbox drained: let the I/O loop read again."""
        if self._loop is not None:
            self._rx_paused = False
            return
        with self._cv:
            tx = self._wake_tx
            if tx is not None and not self._woken:
                self._woken = True
                with contextlib.suppress(zmq.Again):
                    tx.send(b"", zmq.NOBLOCK)

    # -- events ------------------------------------------------------------------------

    def subscribe(
        self,
        event: str,
        callback: Callable[[Message], Any] | None = None,
        *,
        channel: str | None = None,
        queue_id: int | None = None,
        timeout: float | None = None,
    ) -> None:
        """Subscribe to a server event; notifications go to ``callback`` or the inbox."""
        self._call(self._event_frame(event, True, channel, queue_id), timeout)
        self._subscriptions[(event, channel, queue_id)] = None
        if callback is not None:
            self._event_handlers.append((event, channel, queue_id, callback))

    def unsubscribe(
        self,
        event: str,
        *,
        channel: str | None = None,
        queue_id: int | None = None,
        timeout: float | None = None,
    ) -> None:
        self._subscriptions.pop((event, channel, queue_id), None)
        self._event_handlers = [
            h for h in self._event_handlers if (h[0], h[1], h[2]) != (event, channel, queue_id)
        ]
        self._call(self._event_frame(event, False, channel, queue_id), timeout)

    def _event_frame(
        self, event: str, on: bool, channel: str | None, queue_id: int | None
    ) -> tmqp.Frame:
        headers: list[tuple[str, str]] = []
        if channel is not None:
            headers.append((Header.CHANNEL_NAME, channel))
        if queue_id is not None:
            headers.append((Header.QUEUE_ID, str(queue_id)))
        return tmqp.Frame(
            message_type=MessageType.EVENT,
            pending_ack=True,
            content_type=1 if on else 0,
            message_id=self.new_id(),
            target=event,
            headers=tuple(headers),
        )

    # -- the I/O thread ----------------------------------------------------------------

    def _io_main(self, wake_rx: zmq.Socket[bytes], connect_deadline: float) -> None:
        self._io_ident = threading.get_ident()
        loop = IOLoop(self, wake_rx, connect_deadline)
        try:
            loop.run()
        except Exception:
            log.exception("client I/O thread failed")
            self._error = ClientError("client I/O thread failed")
        finally:
            wake_rx.close(linger=0)
            loop.finish()


class _PumpedFuture(Future[Any]):
    """A poll-on-call client's future: waiting on it runs the client's I/O loop."""

    def __init__(self, client: Client) -> None:
        super().__init__()
        self._client = client

    def result(self, timeout: float | None = None) -> Any:
        self._drive(timeout)
        return super().result(0 if self.done() else timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._drive(timeout)
        return super().exception(0 if self.done() else timeout)

    def _drive(self, timeout: float | None) -> None:
        client = self._client
        if not self.done() and client._loop is not None:
            deadline = None if timeout is None else time.monotonic() + timeout
            client._pump(self.done, deadline)


class _NoWake:
    """Stands in for the wake socket of a poll-on-call client (never signalled)."""

    def send(self, data: bytes, flags: int = 0) -> None:
        pass


_NO_WAKE: Any = _NoWake()
