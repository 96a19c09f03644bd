"""Blocking Python client of the zerohub broker (TMQP frames over a ZeroMQ DEALER).

Design: one background I/O thread owns the DEALER socket; every public method
may be called from any thread.

* Sending: the caller encodes the frame and appends it to an outbox deque; the
  I/O thread is woken (``zerohub.wakeup.Wakeup``, a pipe) only when the outbox goes from
  empty to non-empty, so a burst of ``push`` calls costs one wake-up.  A full
  outbox (``max_outbox`` frames) blocks the caller: backpressure, not memory growth.
* Replies: requests register a ``concurrent.futures.Future`` with the session core
  under their message id; the I/O thread settles it when the ACK/RESPONSE arrives, so
  any number of requests may be outstanding (``*_async`` methods return the futures).
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
now and then when idle so the broker's PINGs get answered.

The calls themselves (push, join, pull, direct messages, events, server operations) are
``broker.client.api.ClientApi``, shared with ``AsyncClient``; the protocol is the session
core ``broker.client.session``; this module is lifecycle and waiting, ``broker.client.io``
the socket side, ``broker.client.core`` what the two share.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from typing import Any

import zmq

from broker import tmqp
from broker.client.api import ANSWER, ClientApi
from broker.client.core import NO_WAKE, WAKE_STOP, ClientCore
from broker.client.errors import (
    ClientClosed,
    ClientError,
    ConnectError,
    ConnectionLost,
    RemoteError,
    UnconfirmedSends,
)
from broker.client.fanout import Gap
from broker.client.frames import Headers, ack_frame, as_bytes, normalize_headers, queue_frame
from broker.client.io import IOLoop
from broker.client.message import Kind, Message
from broker.client.session import SEND_BATCH, Call, Reply, Session, SessionState
from broker.client.sockets import Curve
from broker.protocol import DEFAULT_ENDPOINT, ConnectionInfo, MessageType
from zerohub.wakeup import Wakeup

_READY = SessionState.READY
_CLOSING = SessionState.CLOSING
_CLOSED = SessionState.CLOSED
log = logging.getLogger(__name__)

_QUEUE = int(MessageType.QUEUE)
#: Frames ``push_many``/``ack_many`` queue at once (each waits for outbox room).
_ENQUEUE_CHUNK = 256

__all__ = [
    "Client",
    "ClientClosed",
    "ClientError",
    "ConnectError",
    "ConnectionLost",
    "Kind",
    "Message",
    "RemoteError",
    "UnconfirmedSends",
]


#: What a socket call raises once the application terminated (``destroy``) the context
#: under an open client: the client is closed, not failed.
_CONTEXT_GONE = (zmq.ETERM, zmq.ENOTSOCK)


class Client(ClientApi[Any]):
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
        fanout: bool = True,
        batch: int = SEND_BATCH,
        raw_fanout: str = "",
    ) -> None:
        """``batch``: frames (pushes, acknowledges) one batch sent to the broker may hold
        at most (``broker.batch``: what waits in the outbox leaves together); 0: one
        ZeroMQ message per frame.  ``raw_fanout``: "payloads" or "numbered": fan-out
        deliveries are read raw, for :meth:`receive_payloads` only (never ``receive``)."""
        if raw_fanout not in ("", "payloads", "numbered"):
            raise ValueError(f"raw_fanout: '', 'payloads' or 'numbered', not {raw_fanout!r}")
        info = ConnectionInfo(
            client_id=client_id,
            name=name,
            type=client_type,
            token=token,
            properties=dict(properties or {}),
        )
        self._session = Session(
            endpoint,
            info,
            timeout=timeout,
            ping_interval=ping_interval,
            peer_timeout=peer_timeout,
            reconnect=reconnect,
            backoff=backoff,
            batch=batch,
        )
        self._core = ClientCore(
            self._session,
            context or zmq.Context.instance(),
            curve=Curve.of(server_key, curve_secret),
            max_outbox=max_outbox,
            max_inbox=max_inbox,
            hwm=hwm,
            linger=linger,
        )
        self._core.raw_fanout = raw_fanout
        self.threaded = threaded
        self._thread: threading.Thread | None = None
        #: Ask for broadcast fan-out at every join (``broker.client.fanout``): a broker
        #: serving ``--fanout`` then publishes its broadcast queues' messages to this
        #: client through libzmq; any other broker ignores the question.
        self._fanout = fanout

    @property
    def unconfirmed(self) -> int:
        """Messages this client sent without waiting for an answer (pushes without
        ``ack``, direct messages) that the broker is not yet known to have read: the answer
        to a later keep-alive PING or the goodbye confirms them (``broker.client.confirm``)."""
        return self._core.confirmations.unconfirmed

    @property
    def fanout_gaps(self) -> list[Gap]:
        """Broadcast messages this client's fan-out never received (``broker.client.fanout``:
        a SUB that fell behind, messages published before its subscription was live); the
        newest ``MAX_GAPS`` of them, oldest first."""
        fan = self._core.fanout
        return list(fan.gaps) if fan is not None else []

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._core.ready

    @property
    def context(self) -> zmq.Context[zmq.Socket[bytes]]:
        return self._core.context

    def connect(self, timeout: float | None = None) -> Client:
        """Open the session and wait until the broker accepted it (``ConnectError`` if not)."""
        core = self._core
        if self._thread is not None or core.loop is not None:
            raise ClientError("already connected")
        wait = self.timeout if timeout is None else timeout
        self._session.begin(time.monotonic(), wait)
        if not self.threaded:
            core.loop = loop = IOLoop(core, None)
            core.wake_tx = NO_WAKE
            try:
                loop.begin()
                core.pump(core.connected.done, None)
                core.connected.result(0)
            except BaseException:
                self.close()
                raise
            return self
        wake = core.wake_tx = Wakeup()
        self._thread = threading.Thread(target=self._io_main, args=(wake,), name="broker-client")
        self._thread.daemon = True
        try:
            # (inside: Ctrl-C can land while start() waits to return, after the thread runs)
            self._thread.start()
            core.connected.result(wait + 1.0)
        except BaseException:
            self.close()
            raise
        return self

    def close(self, timeout: float = 5.0) -> None:
        """End the session (TERMINATE), stop the I/O thread, fail what is outstanding.

        The I/O thread reads on after the goodbye until the broker ends the session, at
        most ``linger`` seconds (``broker.client.io``): close waits that long plus
        ``timeout`` for the thread before it raises ClientError.  Then, if frames sent
        without an answer (pushes without ``ack``, direct messages) may not have reached the
        broker (``broker.client.confirm``), close raises ``UnconfirmedSends`` (the client
        is closed all the same)."""
        core = self._core
        loop = core.loop
        if isinstance(loop, IOLoop):
            core.loop = None
            core.wake_tx = None
            loop.goodbye()
            loop.finish()
            self._report_unconfirmed()
            return
        with core.cv:
            wake, core.wake_tx = core.wake_tx, None
            if wake is not None:
                wake.notify(WAKE_STOP)  # (the I/O thread closes it)
            core.cv.notify_all()
        thread = self._thread
        if wake is not None and (thread is None or thread.ident is None):
            wake.close()  # no I/O thread ever ran
        if (
            thread is not None
            and thread.ident is not None  # started
            and thread is not threading.current_thread()
        ):
            thread.join(core.linger + timeout)
            if thread.is_alive():
                raise ClientError(
                    f"client I/O thread did not stop within {core.linger + timeout} s"
                )
        self._session.state = SessionState.CLOSED
        core.inbox.wake_all()
        self._report_unconfirmed()

    def _report_unconfirmed(self) -> None:
        with self._core.cv:
            error = self._core.confirmations.report()
        if error is not None:
            raise error

    def __enter__(self) -> Client:
        if self._thread is None and self._core.loop is None:
            self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _io_main(self, wake: Wakeup) -> None:
        core = self._core
        core.io_ident = threading.get_ident()
        loop = IOLoop(core, wake)
        try:
            loop.run()
        except zmq.ZMQError as exc:
            if exc.errno not in _CONTEXT_GONE:
                log.exception("client I/O thread failed")
                core.error = ClientError("client I/O thread failed")
            else:  # the application terminated the context under an open client
                log.info("client I/O thread: its zmq context was terminated: closed")
                core.error = ClientClosed("the client's zmq context was terminated")
        except Exception:
            log.exception("client I/O thread failed")
            core.error = ClientError("client I/O thread failed")
        finally:
            with core.cv:
                core.io_over = True
            loop.finish()
            wake.close()

    def poll(self, timeout: float = 0.0) -> None:
        """Poll-on-call clients: handle what arrived (replies, PINGs, reconnects) for a while.

        Call it now and then when not otherwise calling the client, so that the broker's
        PINGs are answered; threaded clients do this on their I/O thread (no-op here).
        """
        if self._core.loop is not None:
            deadline = time.monotonic() + timeout
            self._core.pump(lambda: time.monotonic() >= deadline, deadline, first=True)

    # -- the driver hooks of ClientApi -------------------------------------------------

    def _perform(self, call: Call, timeout: float | None = None, result: Any = ANSWER) -> Any:
        value = self._core.wait(self._core.submit(call, timeout), timeout)
        return value if result is ANSWER else result

    def _emit(self, data: bytes, result: Any = None) -> Any:
        # counted for close()'s report when it is a message (a push or a direct message:
        # its id is the result); a lost acknowledge is a redelivery, a lost response the
        # requester's time-out
        self._core.enqueue(data, result is not None)
        return result

    # -- futures -----------------------------------------------------------------------

    def send_frame(self, frame: tmqp.Frame) -> None:
        """Send any TMQP frame as is (fire and forget)."""
        self._core.enqueue(tmqp.encode(frame)[0])

    def request_frame(self, frame: tmqp.Frame, timeout: float | None = None) -> Future[Any]:
        """Send a frame with a message id and return the future of its ACK/RESPONSE frame."""
        return self._core.submit(Call(frame), timeout)

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
        """Push asking for an acknowledge: the future of the ACK (RemoteError on a nack)."""
        session = self._session
        mid = message_id or f"{session.prefix}{next(session.counter)}"  # (``new_id``)
        if not headers and (high_priority is False or high_priority is True):
            # no headers: the source's encoder (``frames.queue_senders``), no Frame made
            encode = (session.senders or session.push_encoders())[2 + high_priority]
            body = payload if type(payload) is bytes else as_bytes(payload)
            return self._core.submit_encoded(mid, encode(queue_id, mid, channel, body)[0],
                                             timeout)  # fmt: skip
        call = self._push_call(
            channel, queue_id, payload, mid, headers, high_priority, Reply.FRAME
        )
        return self._core.submit(call, timeout)

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
        """``pull`` without waiting: the future of the list of messages."""
        return self._core.submit(self._pull_call(channel, queue_id, count, clear, order, info),
                                 timeout)  # fmt: skip

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
        """Direct message waiting for a response (or, with ``ack``, an acknowledge): the
        future of the answer frame."""
        call = self._direct_call(target, payload, content_type, headers, Reply.FRAME, ack)
        return self._core.submit(call, timeout)

    def push_many_async(
        self,
        channel: str,
        queue_id: int,
        payloads: Iterable[bytes | str],
        *,
        ack: bool = True,
        high_priority: bool = False,
        headers: Headers | None = None,
        timeout: float | None = None,
    ) -> list[Future[Any]]:
        """Push several messages at once, in batches (one ZeroMQ message, one acknowledge
        each, with a broker that takes batches: ``broker.batch``; one frame each
        otherwise).  With ``ack``: the futures of their acknowledges (the ACK frame, as
        ``push_async``'s), in order (RemoteError for a push refused); without: []."""
        session = self._session
        source = session.client_id or ""
        hdrs = normalize_headers(headers)
        core = self._core
        futures: list[Future[Any]] = []
        chunk: list[bytes] = []
        now = time.monotonic()
        # no headers: the source's encoder (``frames.queue_senders``), no Frame made
        plain = not hdrs and (high_priority is False or high_priority is True)
        encode = session.push_encoders()[high_priority + (2 if ack else 0)] if plain else None
        for payload in payloads:
            mid = f"{session.prefix}{next(session.counter)}"
            body = payload if type(payload) is bytes else as_bytes(payload)
            if encode is not None:
                chunk.append(encode(queue_id, mid, channel, body)[0])
                if ack:
                    future = core.future()
                    session.expect(mid, future, now, timeout)  # (before its frame leaves)
                    futures.append(future)
            elif ack:
                frame = queue_frame(mid, channel, queue_id, body, source=source, ack=True,
                                    headers=hdrs, high_priority=high_priority)  # fmt: skip
                future = core.future()
                chunk.append(session.start(Call(frame, Reply.FRAME), future, now, timeout))
                futures.append(future)
            else:
                chunk.append(
                    tmqp.encode_frame(
                        high_priority=high_priority,
                        message_type=_QUEUE,
                        content_type=queue_id,
                        message_id=mid,
                        source=source,
                        target=channel,
                        headers=hdrs,
                        payload=body,
                    )[0]
                )
            if len(chunk) >= _ENQUEUE_CHUNK:
                core.enqueue_many(session.batches(chunk), blind=not ack)
                chunk = []
        if chunk:
            core.enqueue_many(session.batches(chunk), blind=not ack)
        return futures

    def push_many(
        self,
        channel: str,
        queue_id: int,
        payloads: Iterable[bytes | str],
        *,
        ack: bool = True,
        high_priority: bool = False,
        headers: Headers | None = None,
        timeout: float | None = None,
    ) -> list[tuple[int, ClientError]]:
        """``push_many_async`` and wait: the pushes refused (or not answered in time), as
        (index, error); [] when the broker acknowledged them all (or ``ack`` is False)."""
        futures = self.push_many_async(channel, queue_id, payloads, ack=ack,
                                       high_priority=high_priority, headers=headers,
                                       timeout=timeout)  # fmt: skip
        failed: list[tuple[int, ClientError]] = []
        for index, future in enumerate(futures):
            try:
                self._core.wait(future, timeout)
            except ClientError as exc:
                failed.append((index, exc))
        return failed

    def ack_many(self, messages: Iterable[Message]) -> None:
        """Acknowledge several messages at once (in batches with a broker that takes them)."""
        datas = [tmqp.encode(ack_frame(m))[0] for m in messages]
        for start in range(0, len(datas), _ENQUEUE_CHUNK):
            chunk = self._session.batches(datas[start : start + _ENQUEUE_CHUNK])
            self._core.enqueue_many(chunk, blind=False)  # (as ``ack``: not counted)

    # -- receiving ---------------------------------------------------------------------

    def on_message(self, callback: Callable[[Message], Any] | None) -> None:
        """Deliver queue and direct messages to ``callback`` on the I/O thread instead."""
        self._core.on_message = callback

    def receive(self, timeout: float | None = None) -> Message | None:
        """Next queue/direct/event message, or None after ``timeout`` seconds.

        After ``close`` it hands out what the client still holds (messages that need no
        acknowledge: the broker counted them done), then raises ``ClientClosed``.
        """
        core = self._core
        items = core.inbox.items
        deadline = None
        while True:
            if not items:
                if deadline is None and timeout is not None:
                    deadline = time.monotonic() + timeout
                if core.loop is not None:  # (one poll at least: timeout 0 reads too)
                    if not core.pump(lambda: bool(items), deadline, first=True):
                        return None
                elif not core.inbox.wait(deadline, self._closed):
                    return None
            msg = items.popleft()
            if self._session.paused and core.inbox.drained:
                self._resume()
            state = self._session.state
            if state is _READY or not Session.unanswerable(msg, state):
                return msg

    def receive_payloads(self, timeout: float | None = None) -> list[Any]:
        """Fan-out deliveries read raw (``Client(raw_fanout=...)``, ``broker.client.fanout``):
        every payload (``raw_fanout="payloads"``) or ``(stream number, payload)`` pair
        ("numbered") the client holds, oldest first, waiting up to ``timeout`` seconds for
        one (an empty list then).  No message objects are built: headers and ids of these
        deliveries are not read, and gaps are reported as with messages (``fanout_gaps``).
        Other messages (one-by-one deliveries, direct messages) wait for ``receive``."""
        core = self._core
        fan = core.fanout
        if fan is None or not fan.raw:
            raise ClientError("receive_payloads needs Client(raw_fanout='payloads' or 'numbered')")
        batches = fan.batches
        if not batches:
            deadline = None if timeout is None else time.monotonic() + timeout
            loop = core.loop
            if loop is not None:  # poll-on-call: straight from the SUB while it may
                if not loop.read_fan_between(deadline) and not core.pump(
                    lambda: bool(batches), deadline, first=True
                ):
                    return []
            elif not core.inbox.wait(deadline, self._closed, batches):
                return []
        got: list[Any] = batches.popleft()
        while batches:
            got += batches.popleft()
        fan.raw_out += len(got)
        if self._session.paused and core.inbox.drained and fan.held <= core.inbox.limit // 2:
            self._resume()
        return got

    def _closed(self) -> ClientError | None:
        if self._session.state is SessionState.CLOSED:
            return self._core.closed_error()
        return None

    def consume(self, timeout: float | None = None) -> Iterator[Message]:
        """Iterate over received messages; stops after ``timeout`` seconds without one."""
        items = self._core.inbox.items
        session = self._session
        while True:
            if items and not session.paused:
                held = items.popleft()
                state = session.state  # (open: no call per message)
                if (state is not _CLOSING and state is not _CLOSED) or not Session.unanswerable(
                    held, state
                ):
                    yield held
                continue
            msg = self.receive(timeout)
            if msg is None:
                return
            yield msg

    def _resume(self) -> None:
        """The inbox drained: let the I/O loop read again."""
        core = self._core
        if core.loop is not None:
            self._session.paused = False
            return
        with core.cv:
            core.wake()
