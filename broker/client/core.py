"""What the blocking client's caller threads and its I/O loop share: outbox, futures, pumping.

Callers encode frames and append them to the outbox (:meth:`ClientCore.enqueue`); requests
register a future with the session core (:meth:`ClientCore.submit`) and may wait for it
(:meth:`ClientCore.wait`).  A threaded client's I/O thread is woken (a
``zerohub.wakeup.Wakeup``) when the outbox goes from empty to non-empty; a poll-on-call client
(``threaded=False``) sends at once and runs its I/O loop (``broker.client.io.IOLoop``,
seen here as a :class:`Pump`) on the calling thread inside every blocking call
(:meth:`ClientCore.pump`), including waits on the futures it returns.

The protocol is ``broker.client.session``; the inbox is ``broker.client.inbox``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

import zmq

from broker.client import future as _futures
from broker.client.confirm import Confirmations
from broker.client.errors import ClientClosed, ClientError, StopLoop
from broker.client.inbox import Inbox
from broker.client.message import Message
from broker.client.session import Call, Queued, Session, SessionState
from broker.client.sockets import Curve

#: The note of a wake-up that stops the I/O thread (``Client.close``).
WAKE_STOP = b"S"
#: Poll-on-call: frames sent without a look at what arrived before a pump reads it (the
#: broker's PINGs and the answers to fire-and-forget pushes' neighbours wait until then).
_PUMP_EVERY = 1000


def _always() -> bool:
    return True


class Pump(Protocol):
    """A poll-on-call client's I/O loop, as the calling thread drives it."""

    def step(self, cap_ms: int | None = None) -> None: ...
    def send_or_queue(self, data: bytes) -> bool: ...
    def flush(self) -> None: ...
    def finish(self) -> None: ...
    def read_fan_between(self, deadline: float | None) -> bool: ...


class ClientCore:
    """State shared by the blocking client's callers and its I/O loop (see the docstring)."""

    def __init__(
        self,
        session: Session,
        context: zmq.Context[zmq.Socket[bytes]],
        *,
        curve: Curve | None,
        max_outbox: int,
        max_inbox: int,
        hwm: int,
        linger: float,
    ) -> None:
        self.session = session
        self.context = context
        self.curve = curve
        self.max_outbox = max_outbox
        self.hwm = hwm
        self.linger = linger
        self.inbox = Inbox(max_inbox)
        #: The lock of ``cv`` (reentrant, as a bare Condition's); the hot paths take it
        #: directly (in C: no Python frame for the Condition's ``__enter__``/``__exit__``).
        self.lock = threading.RLock()
        self.cv = threading.Condition(self.lock)
        #: Frames to send, oldest first (an acknowledged push's with its message id:
        #: ``session.Queued``).
        self.outbox: deque[Queued] = deque()
        self.woken = False
        self.out_waiting = 0
        self.on_message: Callable[[Message], Any] | None = None
        self.connected: Future[str] = Future()
        self.error: ClientError | None = None
        self.io_ident = 0
        #: The threaded client's I/O loop ended (closed, failed, or its context was
        #: terminated): a call raises ``closed_error`` instead of waiting for nobody.
        self.io_over = False
        #: How callers wake the I/O thread (``zerohub.wakeup.Wakeup``; poll-on-call:
        #: ``NO_WAKE``); None once closed.
        self.wake_tx: Any = None
        self.loop: Pump | None = None  # poll-on-call: the loop the caller drives
        #: The I/O loop's fan-out reader (``broker.client.fanout``), once there is a loop.
        self.fanout: Any = None
        #: Raw fan-out reading ("payloads", "numbered"; "": messages): ``FanoutReader.raw``.
        self.raw_fanout = ""
        #: Frames sent without an answer, and which the broker read (``broker.client.confirm``).
        self.confirmations = Confirmations()
        self._unpumped = 0

    def closed_error(self) -> ClientError:
        return self.error or ClientClosed("client is closed")

    # -- poll-on-call ------------------------------------------------------------------

    def future(self) -> Future[Any]:
        """A request's future (threaded: ``broker.client.future``; poll-on-call: one
        whose waiting drives the loop)."""
        return _PumpedFuture(self) if self.loop is not None else _futures.ClientFuture()

    def pump(
        self, done: Callable[[], bool], deadline: float | None, *, first: bool = False
    ) -> bool:
        """Poll-on-call: run the I/O loop on this thread until ``done()`` or the deadline."""
        loop = self.loop
        if loop is None:
            raise self.closed_error()
        self._unpumped = 0
        while first or not done():
            cap = None
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 and not first:
                    return False
                cap = int(left * 1000) + 1 if left > 0 else 0
            first = False
            try:
                loop.step(cap)
            except StopLoop:
                self.loop = None
                self.wake_tx = None
                loop.finish()
                raise self.closed_error() from None
        return True

    # -- sending -----------------------------------------------------------------------

    def enqueue(self, data: bytes, blind: bool = True, push_id: str | None = None) -> None:
        """Send ``data`` (``blind``: it waits for no answer, see ``confirmations``;
        ``push_id``: it is the acknowledged push of that message id)."""
        loop = self.loop
        if loop is not None:  # poll-on-call: send right here
            if blind:
                self.confirmations.sent += 1
            self._unpumped += 1
            # sent at once and no pump due: nothing more to look at (the common case)
            if not loop.send_or_queue(data) or self._unpumped >= _PUMP_EVERY:
                self._sent_on_call(0)
            return
        with self.lock:
            out = self.outbox  # (full or closed: the slow path, inline for the common case)
            if len(out) >= self.max_outbox or self.wake_tx is None or self.io_over:
                self._wait_for_room()
            if blind:
                self.confirmations.sent += 1
            out.append(data if push_id is None else (data, push_id))
            if not self.woken:
                self.wake()

    def enqueue_many(self, datas: list[bytes], blind: bool = True) -> None:
        """``enqueue`` several frames at once: queued together, they may leave in one
        batch (``broker.batch``; the I/O loop coalesces what waits in the outbox)."""
        loop = self.loop
        if loop is not None:
            if blind:
                self.confirmations.sent += len(datas)
            self.outbox.extend(datas)
            loop.flush()
            self._sent_on_call(len(datas))
            return
        with self.lock:
            out = self.outbox  # (full or closed: the slow path, inline for the common case)
            if len(out) >= self.max_outbox or self.wake_tx is None or self.io_over:
                self._wait_for_room()
            if blind:
                self.confirmations.sent += len(datas)
            out.extend(datas)
            if not self.woken:
                self.wake()

    def _sent_on_call(self, n: int) -> None:
        """Poll-on-call: ``n`` frames were handed to the loop; pump when the outbox is
        full, or now and then for replies and PINGs (no waiting)."""
        self._unpumped += n
        out = self.outbox
        if len(out) >= self.max_outbox:
            self.pump(lambda: len(out) < self.max_outbox // 2, None)
        elif self._unpumped >= _PUMP_EVERY:
            self.pump(_always, 0.0, first=True)

    def _wait_for_room(self) -> None:
        """(Holding ``cv``, threaded) wait while the outbox is full, unless called on the
        I/O thread; raise once the client is closed."""
        if len(self.outbox) >= self.max_outbox and threading.get_ident() != self.io_ident:
            self.out_waiting += 1
            try:
                while len(self.outbox) >= self.max_outbox and self.wake_tx is not None:
                    self.cv.wait(1.0)
            finally:
                self.out_waiting -= 1
        if self.wake_tx is None or self.io_over:
            raise self.closed_error()

    def wake(self) -> None:
        """Wake the I/O thread (once until it takes the wake-up)."""
        tx = self.wake_tx
        if tx is not None and not self.woken:
            self.woken = True
            tx.notify()

    def submit(self, call: Call, timeout: float | None) -> Future[Any]:
        """Send ``call``; the future of its answer."""
        future = self.future()
        data = self.session.start(call, future, time.monotonic(), timeout)
        try:
            self.enqueue(data, blind=False)
        except BaseException:
            self.session.cancel(call.frame.message_id)
            raise
        return future

    def submit_encoded(self, message_id: str, data: bytes, timeout: float | None) -> Future[Any]:
        """Send ``data``, a frame encoded by the caller whose answer is the ACK/RESPONSE
        frame of ``message_id``; the future of that frame."""
        # (future(), inline)
        future = _PumpedFuture(self) if self.loop is not None else _futures.ClientFuture()
        session = self.session
        session.expect(message_id, future, time.monotonic(), timeout)
        try:
            # (with its id when it may share a batch: ``Session.coalesce`` takes it)
            self.enqueue(data, False, message_id if session.batch_max else None)
        except BaseException:
            self.session.cancel(message_id)
            raise
        return future

    def wait(self, future: Future[Any], timeout: float | None) -> Any:
        """The value of ``future`` (the session core times it out; this is a backstop)."""
        if threading.get_ident() == self.io_ident:
            raise ClientError("blocking call from a callback: use the *_async method")
        wait = self.session.timeout if timeout is None else timeout
        if self.loop is not None:
            self.pump(future.done, time.monotonic() + wait + 0.5)
        try:
            return future.result(wait + 0.5)
        except TimeoutError as exc:
            if future.done():
                raise  # the session's RequestTimeout
            raise TimeoutError(f"no answer from the broker within {wait} s") from exc

    @property
    def ready(self) -> bool:
        return self.session.state is SessionState.READY


class _PumpedFuture(Future[Any]):
    """A poll-on-call client's future: waiting on it runs the client's I/O loop."""

    def __init__(self, core: ClientCore) -> None:
        super().__init__()
        self._core = core

    def result(self, timeout: float | None = None) -> Any:
        self._drive(timeout)
        return super().result(0 if self.done() else timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._drive(timeout)
        return super().exception(0 if self.done() else timeout)

    def _drive(self, timeout: float | None) -> None:
        core = self._core
        if not self.done() and core.loop is not None:
            deadline = None if timeout is None else time.monotonic() + timeout
            core.pump(self.done, deadline)


class _NoWake:
    """Stands in for the wake-up of a poll-on-call client (never signalled)."""

    def notify(self, note: bytes = b"") -> None:
        pass


NO_WAKE: Any = _NoWake()
