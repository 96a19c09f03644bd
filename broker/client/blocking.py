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

``Client`` is built in layers, one module each (each a base class of the next):
``broker.client_core`` (shared state, outbox, requests, poll-on-call pumping),
``broker.client_inbox`` (inbox, ``receive``/``consume``, events) and this module
(lifecycle, queues, direct messages; server operations come from
``broker.client_admin``).  The I/O loop is ``broker.client_io``; errors are in
``broker.client_errors`` and :class:`Message` in ``broker.client_message``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from concurrent.futures import Future
from typing import Any

import zmq

from broker import tmqp
from broker.client.admin import AdminOperations
from broker.client.core import _NO_WAKE, SessionState
from broker.client.errors import (
    ClientClosed,
    ClientError,
    ConnectError,
    ConnectionLost,
    RemoteError,
)
from broker.client.frames import (
    Headers,
    ack_frame,
    as_bytes,
    direct_frame,
    join_frame,
    normalize_headers,
    queue_frame,
    response_frame,
)
from broker.client.inbox import ClientInbox
from broker.client.io import IOLoop
from broker.client.message import Kind, Message, _Pull
from broker.protocol import Header, MessageType, Operation, ResultCode

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
]

_QUEUE = int(MessageType.QUEUE)  # a plain int: IntEnum arithmetic costs ~0.1 us a push


class Client(ClientInbox, AdminOperations):
    """A connection to the broker.  Use as a context manager or call ``connect``/``close``."""

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
        try:
            # (inside: Ctrl-C can land while start() waits to return, after the thread runs)
            self._thread.start()
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
        if (
            thread is not None
            and thread.ident is not None  # started
            and thread is not threading.current_thread()
        ):
            thread.join(timeout)
            if thread.is_alive():
                raise ClientError(f"client I/O thread did not stop within {timeout} s")
        self._state = SessionState.CLOSED
        with self._in_cv:
            self._in_cv.notify_all()

    def __enter__(self) -> Client:
        if self._thread is None and self._loop is None:
            self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        body = payload if type(payload) is bytes else as_bytes(payload)
        data = tmqp.encode_frame(
            high_priority=high_priority,
            message_type=_QUEUE,
            pending_ack=ack,
            content_type=queue_id,
            message_id=mid,
            source=self.client_id or "",
            target=channel,
            headers=normalize_headers(headers) if headers else (),
            payload=body,
        )[0]
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
        frame = queue_frame(
            message_id or self.new_id(),
            channel,
            queue_id,
            as_bytes(payload),
            source=self.client_id or "",
            ack=True,
            headers=headers,
            high_priority=high_priority,
        )
        return self.request_frame(frame, timeout)

    def join(
        self, channel: str, timeout: float | None = None, *, prefetch: int | None = None
    ) -> None:
        """Join a channel: its push/broadcast/round-robin queues deliver to this client.

        ``prefetch``: the most deliveries of each of the channel's queues in flight to this
        client at once (unacknowledged, or not yet read off its socket); None takes the
        queue's ``Prefetch`` option or the broker's default.  Kept across reconnects.
        """
        self._call(join_frame(self.new_id(), channel, prefetch), timeout)
        self._channels[channel] = prefetch

    def leave(self, channel: str, timeout: float | None = None) -> None:
        self._channels.pop(channel, None)
        self._call(self._op(Operation.LEAVE, channel), timeout)

    def ack(self, message: Message) -> None:
        """Positive acknowledge of a received queue or direct message."""
        self._enqueue(tmqp.encode(ack_frame(message))[0])

    def nack(self, message: Message, reason: str = "none") -> None:
        """Negative acknowledge (``Nack-Reason`` header)."""
        frame = ack_frame(message, ((Header.NACK_REASON, reason),))
        self._enqueue(tmqp.encode(frame)[0])

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
        frame = direct_frame(
            mid,
            target,
            payload,
            content_type=content_type,
            headers=headers,
            high_priority=high_priority,
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
        frame = direct_frame(
            self.new_id(),
            target,
            payload,
            content_type=content_type,
            headers=headers,
            response=not ack,
            ack=ack,
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
        frame = response_frame(message, payload, code=code, headers=headers)
        self._enqueue(tmqp.encode(frame)[0])
