"""An asyncio client of the zerohub broker (TMQP frames over a ``zmq.asyncio`` DEALER).

``AsyncClient`` offers the blocking client's calls (``broker.client.api.ClientApi``:
push, join, pull, direct messages, events, server operations) as coroutines, over the
same session core (``broker.client.session``); this module is only its I/O and waiting.

Design: one background task owns the socket.  It feeds what arrives to the session
core, runs its timers and does what its events say: settle the ``asyncio.Future`` of a
request (so any number may be outstanding: ``asyncio.gather`` them), answer PINGs, put
queue, direct and event messages into a bounded inbox read by ``receive()``/``consume()``.
A full inbox makes the task wait (ZeroMQ pushes back on the broker) while it keeps the
session alive with PINGs; that also holds up replies: keep consuming.

Liveness and reconnects are the core's: after ``peer_timeout`` of silence, a TERMINATE
or a refusal for now, outstanding requests fail with ``ConnectionLost`` (as do calls made
until the session is back), and with ``reconnect`` (the default) a new session starts
after a backoff, under the same client id with the broker's session secret, joining the
channels and subscribing the events again.  A refusal for good (401/406/400) or a denied
CURVE handshake closes the client with ``ConnectError`` (``AccessRefused``).

Closing loses nothing the broker sent (``broker.client.session``): ``close`` sends the
goodbye and lets the task read on until the broker's TERMINATE ends the session (at most
``linger`` seconds); deliveries that need no acknowledge stay readable by ``receive``
after ``close`` (beyond a full inbox too), those that need one go back to the broker.

CURVE: ``server_key`` (the broker's public key file) and ``curve_secret`` (this
client's certificate), as for the blocking client (``zerohub.zmqkit`` reads them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Iterable, Mapping
from typing import Any

import zmq
import zmq.asyncio

from broker.client import session as S
from broker.client.api import ANSWER, ClientApi
from broker.client.confirm import Confirmations
from broker.client.errors import ClientClosed, ClientError
from broker.client.fanout import FanoutReader, Gap
from broker.client.message import Message
from broker.client.sockets import Curve, open_dealer, read_watch
from broker.protocol import ConnectionInfo
from zerohub.zmqkit import HandshakeWatch

__all__ = ["AsyncClient"]

log = logging.getLogger(__name__)

_BATCH = 256
#: Frames sent by ``push``/``ack``/... (no answer awaited) between two turns given to the
#: event loop: a send the socket takes at once does not yield, so a coroutine sending in
#: a loop starved every other task, this client's own I/O task (keep-alive PINGs,
#: reading) among them, and the broker ended a consumer's session as silent.
YIELD_EVERY = 64
_PING = S.PING
_PONG = S.PONG


class _Closed:
    """The inbox's end marker (put back by every reader that takes it)."""


_CLOSED = _Closed()


class _Stop(Exception):
    """Internal: the session is over; leave the task."""


class AsyncClient(ClientApi[Awaitable[Any]]):
    """A broker session driven by asyncio.  ``async with AsyncClient(...) as c:`` or
    ``await c.connect()`` ... ``await c.close()``."""

    def __init__(
        self,
        endpoint: str,
        *,
        context: zmq.asyncio.Context,
        client_id: str | None = None,
        name: str | None = None,
        type: str | None = None,
        token: str | None = None,
        properties: Mapping[str, str] | None = None,
        server_key: str | os.PathLike[str] | None = None,
        curve_secret: str | os.PathLike[str] | None = None,
        timeout: float = 10.0,
        linger: float = 1.0,
        hwm: int = 10_000,
        max_inbox: int = 10_000,
        ping_interval: float = 5.0,
        peer_timeout: float = 15.0,
        reconnect: bool = True,
        backoff: tuple[float, float] = (0.05, 5.0),
        fanout: bool = True,
    ) -> None:
        """``fanout``: ask for broadcast fan-out at every join (``broker.client.fanout``:
        a broker serving ``--fanout`` publishes its broadcast queues' messages to this
        client's SUB socket, read by its task; any other broker ignores the question)."""
        info = ConnectionInfo(
            client_id=client_id,
            name=name,
            type=type,
            token=token,
            properties=dict(properties or {}),
        )
        self._session = S.Session(
            endpoint,
            info,
            timeout=timeout,
            ping_interval=ping_interval,
            peer_timeout=peer_timeout,
            reconnect=reconnect,
            backoff=backoff,
        )
        self._curve = Curve.of(server_key, curve_secret)
        self.context = context
        self.linger = linger
        self.hwm = hwm
        self._sock: zmq.asyncio.Socket | None = None
        self._monitor: HandshakeWatch | None = None
        self._task: asyncio.Task[None] | None = None
        self._connected: asyncio.Future[str] | None = None
        self._inbox: asyncio.Queue[Message | _Closed] = asyncio.Queue(max_inbox)
        #: closing: deliveries read after the goodbye that found the inbox full
        self._held: deque[Message] = deque()
        self._ended = asyncio.Event()  # the broker ended the session after the goodbye
        self._end: S.Ended | None = None  # how (``S.Ended.reason``: empty for the goodbye)
        #: Frames sent without an answer, and which the broker read (``broker.client.confirm``).
        self._confirmations = Confirmations()
        self._unyielded = 0  # frames sent since the last turn given to the loop
        self._closing = asyncio.Event()  # close() sent the goodbye
        self._fanout = fanout
        #: The fan-out SUB and its streams: a plain socket on the same libzmq context,
        #: watched by the task beside the DEALER.
        self._fan = FanoutReader(
            zmq.Context.shadow(context.underlying), self._curve, hwm, endpoint
        )

    @property
    def connected(self) -> bool:
        return self._session.state is S.SessionState.READY

    @property
    def unconfirmed(self) -> int:
        """As ``Client.unconfirmed``: messages sent without an answer not yet known read."""
        return self._confirmations.unconfirmed

    @property
    def fanout_gaps(self) -> list[Gap]:
        """Broadcast messages this client's fan-out never received (as
        ``Client.fanout_gaps``); the newest ``MAX_GAPS`` of them, oldest first."""
        return list(self._fan.gaps)

    @property
    def _pending(self) -> dict[str, Any]:
        """Requests waiting for their answer (by message id)."""
        return self._session.pending

    # -- lifecycle ---------------------------------------------------------------------

    async def connect(self) -> AsyncClient:
        """Greet the broker, send the connection info and wait for its answer.

        Raises ``ConnectError`` if the broker refuses or does not answer within ``timeout``
        (``AccessRefused`` when it denies the CURVE handshake).
        """
        session = self._session
        if session.state is not S.SessionState.IDLE or self._connected is not None:
            raise ClientError("connect() may be called once per AsyncClient")
        connected = self._connected = asyncio.get_running_loop().create_future()
        session.begin(time.monotonic(), self.timeout)
        self._task = asyncio.create_task(self._run(), name="broker-aioclient-reader")
        try:
            await connected
        except BaseException:
            await self._shutdown(ClientClosed("client is closed"))
            raise
        return self

    async def close(self) -> None:
        """Send TERMINATE, read on until the broker ended the session (all within
        ``linger``), stop the reader, fail what is outstanding.  Then raise
        ``UnconfirmedSends`` if messages sent without an answer (pushes without ``ack``,
        direct messages) may not have reached the broker (``broker.client.confirm``)."""
        sock = self._sock
        confirmations = self._confirmations
        if sock is not None and self.connected:
            deadline = time.monotonic() + self.linger
            with contextlib.suppress(TimeoutError, zmq.ZMQError):
                await asyncio.wait_for(sock.send(self._session.goodbye()), self.linger)
                self._closing.set()  # a task waiting for room in the inbox reads on
                left = deadline - time.monotonic()
                await asyncio.wait_for(self._ended.wait(), max(0.0, left))
            end = self._end
            if end is not None and not end.reason:
                confirmations.all_read()
            elif end is not None:
                confirmations.doubt(f"the broker ended the session first: {end.reason}")
            else:
                why = f"the broker did not answer the goodbye within the linger ({self.linger} s)"
                confirmations.doubt(why)
        elif self._connected is not None:
            confirmations.doubt(f"the session was down at close ({self._session.state.value})")
        await self._shutdown(ClientClosed("client is closed"))
        error = confirmations.report()
        if error is not None:
            raise error

    async def __aenter__(self) -> AsyncClient:
        if self._connected is None:
            await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _shutdown(self, err: ClientError) -> None:
        """Stop the task, close the socket (``linger``), fail waiters, end the inbox."""
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._close_socket(self.linger)
        for ev in self._session.close(err):
            S.resolve(ev)
        if self._connected is not None and not self._connected.done():
            self._connected.set_exception(self._session.closed_error())
        self._end_inbox()

    def _close_socket(self, linger: float = 0.0) -> None:
        self._fan.close()  # the session's end ends every stream
        sock, self._sock = self._sock, None
        if self._monitor is not None:
            self._monitor.close(sock)
            self._monitor = None
        if sock is not None:
            sock.close(linger=max(0, int(linger * 1000)))

    def _end_inbox(self) -> None:
        with contextlib.suppress(asyncio.QueueFull):  # full: no reader is waiting
            self._inbox.put_nowait(_CLOSED)

    # -- the task ----------------------------------------------------------------------

    async def _run(self) -> None:
        """Read the socket, run the timers, do what the session core says."""
        session = self._session
        try:
            await self._dial()
            while True:
                await self._apply(session.tick(time.monotonic()))
                wait = session.next_wake(time.monotonic())
                sock = self._sock
                if sock is None:
                    await asyncio.sleep(wait)
                    continue
                fan = self._fan
                if fan.streams:
                    fan.expire(time.monotonic())
                    waits = fan.pending_deadline()
                    if waits is not None:
                        wait = max(0.0, min(wait, waits - time.monotonic()))
                wait_ms = int(wait * 1000) + 1
                monitor = self._monitor
                sub = fan.sock if not session.paused else None
                if monitor is None and sub is None:
                    readable = bool(await sock.poll(wait_ms))
                else:  # the handshake: watch the monitor too; the fan-out SUB
                    poller = zmq.asyncio.Poller()
                    poller.register(sock, zmq.POLLIN)
                    if monitor is not None:
                        poller.register(monitor.socket, zmq.POLLIN)
                    if sub is not None:
                        poller.register(sub, zmq.POLLIN)
                    ready = dict(await poller.poll(wait_ms))
                    readable = sock in ready
                    # (the poller may answer with its asyncio wrapper of the plain SUB)
                    if sub is not None and any(getattr(k, "underlying", None) == sub.underlying
                                               for k in ready):  # fmt: skip
                        await self._read_fan()
                    if monitor is not None and monitor.socket in ready:
                        # (as the blocking client's ``IOLoop._watched``)
                        judge = session.first or self._curve is not None
                        seen = read_watch(monitor, endpoint=self.endpoint, judge=judge)
                        if seen.refusal is not None:
                            await self._apply(session.fatal(seen.refusal))
                        elif seen.dropped:
                            await self._apply(session.dropped(time.monotonic()))
                if readable and sock is self._sock:
                    await self._drain(sock)
        except _Stop:
            pass
        except Exception:
            log.exception("async client task failed")
            self._close_socket()
            with contextlib.suppress(_Stop):
                await self._apply(session.fatal(ClientError("the client's task failed")))

    async def _drain(self, sock: zmq.asyncio.Socket) -> None:
        session = self._session
        now = time.monotonic()
        for _ in range(_BATCH):
            try:
                data = await sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if data == _PONG:  # our PING's answer: what we sent before it was read
                self._confirmations.answered()
            events = session.feed(data, now)
            if events:
                await self._apply(events)
                if sock is not self._sock:
                    return  # the session was reset

    async def _read_fan(self) -> None:
        """A batch of the fan-out SUB (``broker.client.fanout``) into the inbox."""
        for frame in self._fan.read():
            await self._to_inbox(Message(frame))

    async def _apply(self, events: Iterable[S.Event]) -> None:
        for ev in events:
            if isinstance(ev, S.Send):
                if self._sock is not None:
                    if ev.data is _PING:
                        self._confirmations.probe()
                    await self._sock.send(ev.data)
            elif isinstance(ev, S.Settled | S.SettledAll | S.Failed):
                S.resolve(ev)
            elif isinstance(ev, S.Deliver):
                await self._to_inbox(ev.message)
            elif isinstance(ev, S.Notify):
                S.notify(ev)
            elif isinstance(ev, S.Fanout):
                self._fan.grant(ev, time.monotonic())
            elif isinstance(ev, S.Unfanout):
                self._fan.leave(ev.channel)
            elif isinstance(ev, S.Ended):
                self._end = ev
                self._ended.set()
                raise _Stop  # nothing more comes: close() takes it from here
            elif isinstance(ev, S.Ready):
                log.debug("async session ready as %s", ev.client_id)
                if self._monitor is not None:
                    self._monitor.close(self._sock)
                    self._monitor = None
                if ev.first and self._connected is not None and not self._connected.done():
                    self._connected.set_result(ev.client_id)
            elif isinstance(ev, S.Lost):
                log.info("async session lost: %s", ev.reason)
                self._close_socket()  # (what its queue held is dropped)
                self._confirmations.doubt(f"the session was lost ({ev.reason})")
            elif isinstance(ev, S.Dial):
                await self._dial()
            elif isinstance(ev, S.Closed):
                self._close_socket()
                self._confirmations.doubt(f"the session ended ({ev.error})")
                if self._connected is not None and not self._connected.done():
                    self._connected.set_exception(ev.error)
                self._end_inbox()
                raise _Stop

    async def _dial(self) -> None:
        session = self._session
        try:
            sock, monitor = open_dealer(
                self.context, self.endpoint, hwm=self.hwm, curve=self._curve, watch=True
            )
        except ClientError as exc:
            await self._apply(session.fatal(exc))
            return
        self._sock, self._monitor = sock, monitor
        for data in session.hello(time.monotonic()):
            try:
                await sock.send(data, zmq.NOBLOCK)
            except zmq.Again:
                # the connection already ended (a handshake refused at once: libzmq drops
                # the pipe for good; waiting to send would never end): the monitor says
                # why, else the session's connect timeout ends or redials
                break

    async def _to_inbox(self, message: Message) -> None:
        """Put ``message`` in the inbox; while it is full, keep the session alive."""
        inbox = self._inbox
        if not inbox.full():
            inbox.put_nowait(message)
            return
        session = self._session
        if session.state is S.SessionState.CLOSING:
            self._held.append(message)  # read after the goodbye: never wait for a reader
            return
        put = asyncio.ensure_future(inbox.put(message))
        closing = asyncio.ensure_future(self._closing.wait())
        session.paused = True
        try:
            while True:
                done, _ = await asyncio.wait(
                    {put, closing},
                    timeout=session.next_wake(time.monotonic()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if put in done:
                    return
                if closing in done:
                    if put.cancel():  # still waiting: it put nothing (else it is in)
                        self._held.append(message)
                    return
                await self._apply(session.tick(time.monotonic()))  # PINGs: not reading is not gone
        finally:
            session.paused = False
            for waiting in (put, closing):
                if not waiting.done():
                    waiting.cancel()

    # -- the driver hooks of ClientApi -------------------------------------------------

    def _check(self) -> zmq.asyncio.Socket:
        sock = self._sock
        if sock is None or not self.connected:
            raise self._session.closed_error()
        return sock

    async def _perform(
        self, call: S.Call, timeout: float | None = None, result: Any = ANSWER
    ) -> Any:
        """Send ``call`` and wait for its answer (the session core times it out)."""
        sock = self._check()
        session = self._session
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        data = session.start(call, future, time.monotonic(), timeout)
        try:
            await sock.send(data)
            value = await future
        finally:
            session.cancel(call.frame.message_id)
        return value if result is ANSWER else result

    async def _emit(self, data: bytes, result: Any = None) -> Any:
        await self._check().send(data)
        if result is not None:  # a message (its id), not an acknowledge: see Client._emit
            self._confirmations.sent += 1
        self._unyielded += 1
        if self._unyielded >= YIELD_EVERY:  # the other tasks' turn (see YIELD_EVERY)
            self._unyielded = 0
            await asyncio.sleep(0)
        return result

    # -- receiving ---------------------------------------------------------------------

    async def receive(self, timeout: float | None = None) -> Message | None:
        """Next queue/direct/event message, or None after ``timeout`` seconds.

        Raises ``ClientClosed`` (or ``ConnectionLost``) once the session is over and
        the messages received before that have been read.
        """
        inbox = self._inbox
        session = self._session
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            item: Message | _Closed
            if not inbox.empty():
                item = inbox.get_nowait()
            elif self._held:
                item = self._held.popleft()
            elif session.state is S.SessionState.CLOSED:
                raise session.closed_error()
            else:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    item = await asyncio.wait_for(inbox.get(), left)
                except TimeoutError:
                    return None
            if isinstance(item, _Closed):
                self._end_inbox()  # for the next reader
                if not self._held:
                    raise session.closed_error()
                item = self._held.popleft()
            if not S.Session.unanswerable(item, session.state):
                return item

    async def consume(self, timeout: float | None = None) -> AsyncIterator[Message]:
        """Iterate over received messages; stops after ``timeout`` seconds without one."""
        while True:
            message = await self.receive(timeout)
            if message is None:
                return
            yield message
