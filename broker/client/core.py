"""The core of ``broker.Client``: shared state, the outbox, requests and their futures.

Callers encode frames and append them to the outbox (``_enqueue``); requests register a
future under their message id (``request_frame``) and may wait for it (``_wait``).  A
threaded client's I/O thread is woken over an inproc PAIR socket when the outbox goes
from empty to non-empty; a poll-on-call client (``threaded=False``) sends at once and
runs the I/O loop (``broker.client_io.IOLoop``) on the calling thread inside every
blocking call (``_pump``), including waits on the futures it returns.

:class:`ClientCore` is the bottom layer of :class:`broker.client.Client`; above it are
``broker.client_inbox`` (receiving, events) and ``broker.client`` (the public API).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from enum import Enum
from typing import TYPE_CHECKING, Any

import zmq

from broker import tmqp
from broker.client.errors import ClientClosed, ClientError, StopLoop
from broker.client.message import Message
from broker.protocol import DEFAULT_ENDPOINT, ConnectionInfo, Header

if TYPE_CHECKING:
    from broker.client.io import IOLoop

_ids = itertools.count(1)


def session_properties(properties: Mapping[str, str], secret: str | None) -> dict[str, str]:
    """Connection-info properties for a (re)connect: with the session secret, if any.

    The broker gives every session a secret (``Session-Secret`` in its connect answer);
    sent back when reconnecting under the same client id, it proves the connection is
    the same client, which then takes its session over at once.  Shared by both clients.
    """
    props = {k: v for k, v in properties.items() if k.lower() != Header.SESSION_SECRET.lower()}
    if secret:
        props[Header.SESSION_SECRET] = secret
    return props


class SessionState(Enum):
    """The session's state: kept on the client, driven by the I/O loop."""

    IDLE = "idle"
    HANDSHAKE = "handshake"
    READY = "ready"
    BACKOFF = "backoff"
    CLOSED = "closed"


class ClientCore:
    """Shared state, outbox and requests of a client (see the module docstring)."""

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
        #: The broker's secret for this client's session (sent back when reconnecting).
        self.session_secret: str | None = None
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
        self._channels: dict[str, int | None] = {}  # joined channel -> its prefetch
        self._subscriptions: dict[tuple[str, str | None, int | None], None] = {}
        self._event_handlers: list[tuple[str, str | None, int | None, Callable[..., Any]]] = []
        self._on_message: Callable[[Message], Any] | None = None
        self._connected: Future[str] = Future()
        self._error: ClientError | None = None
        self._state = SessionState.IDLE
        self._thread: threading.Thread | None = None
        self._io_ident = 0
        self._wake_addr = f"inproc://zerohub-client-{os.getpid()}-{next(_ids)}"
        self._wake_tx: zmq.Socket[bytes] | None = None
        self._loop: IOLoop | None = None  # poll-on-call: the loop the caller drives
        self._unpumped = 0

    # -- poll-on-call ------------------------------------------------------------------

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

    @property
    def connected(self) -> bool:
        return self._state is SessionState.READY

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


class _PumpedFuture(Future[Any]):
    """A poll-on-call client's future: waiting on it runs the client's I/O loop."""

    def __init__(self, client: ClientCore) -> None:
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
