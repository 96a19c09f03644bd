"""An asyncio client of the zerohub broker (TMQP frames over a ``zmq.asyncio`` DEALER).

``AsyncClient`` speaks the same protocol as the blocking :class:`broker.client.Client`
and reuses its pieces: frames are built with the blocking client's helpers
(``broker.client``, ``broker.client_admin.operation_frame``), answers are judged by
``broker.client_errors.failure`` and received frames are :class:`broker.client_message.Message`.

Design: one background task owns the receiving side of the socket.  Every request
(acknowledged push, direct request, server operation) registers an ``asyncio.Future``
under its message id and awaits it, so any number may be outstanding at once
(``asyncio.gather`` them); the task settles the future when the ACK/RESPONSE arrives,
answers the broker's PINGs, and puts queue, direct and event messages into a bounded
inbox read by ``receive()``/``consume()``.  A full inbox makes the task wait (ZeroMQ
pushes back on the broker), which also holds up replies: keep consuming.

Liveness and reconnects: when nothing arrives for ``ping_interval`` the task sends a
PING; after ``peer_timeout`` of silence, a TERMINATE from the broker or a socket error the
session is lost: outstanding requests fail with ``ConnectionLost`` (as do calls made until
the session is back), and with ``reconnect`` (the default) the task starts a new one
after a backoff -- a new socket, the greeting, the connection info under the same client
id with the broker's session secret (``Session-Secret``), so that the broker hands this
client its own session at once, then the channels it joined are joined again.  A refusal
for good (401/406/400) closes the client with ``ConnectError``.

Not supported (use the blocking client for these): pull requests, event subscriptions
and CURVE.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import random
from collections.abc import AsyncIterator
from typing import Any

import zmq
import zmq.asyncio

from broker import tmqp
from broker.client.admin import STATS_LIST, next_page, operation_frame
from broker.client.core import SessionState, session_properties
from broker.client.errors import (
    ClientClosed,
    ClientError,
    ConnectError,
    ConnectionLost,
    failure,
)
from broker.client.frames import (
    Headers,
    ack_frame,
    as_bytes,
    direct_frame,
    join_frame,
    queue_frame,
    response_frame,
)
from broker.client.message import Message
from broker.paging import merge
from broker.protocol import (
    GREETING,
    ConnectionInfo,
    Header,
    MessageType,
    Operation,
    ResultCode,
    header,
)
from zproto.errors import DecodeError

__all__ = ["AsyncClient"]

log = logging.getLogger(__name__)

_PING = tmqp.encode(tmqp.Ping())[0]
_PONG = tmqp.encode(tmqp.Pong())[0]
_PING = tmqp.encode(tmqp.Ping())[0]
_TERMINATE = tmqp.encode(tmqp.Frame(message_type=MessageType.TERMINATE))[0]
_INBOX_TYPES = frozenset({MessageType.QUEUE, MessageType.DIRECT, MessageType.EVENT})
_REPLY_TYPES = frozenset({MessageType.ACK, MessageType.RESPONSE})
#: Refusals of the connection info that no retry can change.
_PERMANENT = frozenset({ResultCode.UNAUTHORIZED, ResultCode.UNACCEPTABLE, ResultCode.BAD_REQUEST})


class _Closed:
    """The inbox's end marker (put back by every reader that takes it)."""


_CLOSED = _Closed()


class _Refused(Exception):
    """The broker turned the connection info down (TERMINATE or a failed response)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"{reason} (status {code})")
        self.code = code


class AsyncClient:
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
        timeout: float = 10.0,
        linger: float = 1.0,
        hwm: int = 10_000,
        max_inbox: int = 10_000,
        ping_interval: float = 5.0,
        peer_timeout: float = 15.0,
        reconnect: bool = True,
        backoff: tuple[float, float] = (0.05, 5.0),
    ) -> None:
        self.endpoint = endpoint
        self.context = context
        self.timeout = timeout
        self.ping_interval = ping_interval
        self.linger = linger
        self.hwm = hwm
        self.ping_interval = ping_interval
        self.peer_timeout = peer_timeout
        self.reconnect = reconnect
        self.backoff = backoff
        self.client_id: str | None = client_id
        #: The broker's secret for this client's session (sent back when reconnecting).
        self.session_secret: str | None = None
        self._info = ConnectionInfo(client_id=client_id, name=name, type=type, token=token)
        self._prefix = f"{random.getrandbits(32):08x}-"
        self._counter = itertools.count(1)
        self._state = SessionState.IDLE
        self._error: ClientError | None = None
        self._lost_reason = ""
        self._sock: zmq.asyncio.Socket | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[str, asyncio.Future[tmqp.Frame]] = {}
        self._channels: dict[
            str, int | None
        ] = {}  # name -> prefetch asked  # joined, in order: joined again on reconnect
        self._inbox: asyncio.Queue[Message | _Closed] = asyncio.Queue(max_inbox)

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._state is SessionState.READY

    def new_id(self) -> str:
        return f"{self._prefix}{next(self._counter)}"

    async def connect(self) -> AsyncClient:
        """Greet the broker, send the connection info and wait for its answer.

        Raises ``ConnectError`` if the broker refuses or does not answer within ``timeout``.
        """
        if self._state is not SessionState.IDLE:
            raise ClientError("connect() may be called once per AsyncClient")
        sock = self._open_socket()
        try:
            reply = await asyncio.wait_for(self._handshake(sock), self.timeout)
        except TimeoutError:
            await self._shutdown(ConnectError(f"no answer from {self.endpoint} in time"))
            raise ConnectError(f"no answer from {self.endpoint} within {self.timeout} s") from None
        except _Refused as exc:
            err = ConnectError(f"the broker refused the connection: {exc}")
            await self._shutdown(err)
            raise err from None
        except BaseException:
            await self._shutdown(ClientClosed("client is closed"))
            raise
        self._ready(reply)
        self._reader = asyncio.create_task(self._run(), name="broker-aioclient-reader")
        return self

    async def close(self) -> None:
        """Send TERMINATE (within ``linger``), stop the reader, fail what is outstanding."""
        sock = self._sock
        if sock is not None and self._state is SessionState.READY:
            with contextlib.suppress(TimeoutError, zmq.ZMQError):
                await asyncio.wait_for(sock.send(_TERMINATE), self.linger)
        await self._shutdown(ClientClosed("client is closed"))

    async def __aenter__(self) -> AsyncClient:
        if self._state is SessionState.IDLE:
            await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _shutdown(self, err: ClientError) -> None:
        """Stop the reader, close the socket (``linger``), fail waiters, end the inbox."""
        if self._state is not SessionState.CLOSED:
            self._state = SessionState.CLOSED
            if self._error is None:
                self._error = err
        reader, self._reader = self._reader, None
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        self._close_socket(self.linger)
        self._fail_pending(self._error or err)
        self._end_inbox()

    def _close_socket(self, linger: float = 0.0) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close(linger=max(0, int(linger * 1000)))

    def _fail_pending(self, err: ClientError) -> None:
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(err)

    def _end_inbox(self) -> None:
        with contextlib.suppress(asyncio.QueueFull):  # full: no reader is waiting
            self._inbox.put_nowait(_CLOSED)

    def _closed_error(self) -> ClientError:
        if self._state is not SessionState.CLOSED and self._state is not SessionState.IDLE:
            return ConnectionLost(f"not connected now ({self._lost_reason}); reconnecting")
        return self._error or ClientClosed("client is closed")

    # -- the session -------------------------------------------------------------------

    def _open_socket(self) -> zmq.asyncio.Socket:
        sock = self.context.socket(zmq.DEALER)
        sock.linger = 0
        sock.sndhwm = self.hwm
        sock.rcvhwm = self.hwm
        sock.routing_id = b"\x01" + os.urandom(15)
        sock.connect(self.endpoint)
        self._sock = sock
        self._state = SessionState.HANDSHAKE
        return sock

    async def _handshake(self, sock: zmq.asyncio.Socket) -> tmqp.Frame:
        """Greeting and connection info; the broker's answer (``_Refused`` if negative)."""
        mid = self.new_id()
        props = session_properties(self._info.properties, self.session_secret)
        info = dataclasses.replace(self._info, client_id=self.client_id, properties=props)
        hello = dataclasses.replace(info.to_frame(mid), pending_response=True)
        await sock.send(GREETING)
        await sock.send(tmqp.encode(hello)[0])
        while True:
            data = await sock.recv()
            if data == GREETING:
                continue
            try:
                msg = tmqp.decode((data,))
            except DecodeError:
                continue
            if type(msg) is tmqp.Ping:
                await sock.send(_PONG)
            elif type(msg) is not tmqp.Frame:
                continue
            elif msg.message_type == MessageType.TERMINATE:
                raise _Refused(msg.content_type, header(msg, Header.REASON) or "no reason given")
            elif msg.message_type in _REPLY_TYPES and msg.message_id == mid:
                err = failure(msg)
                if err is not None:
                    raise _Refused(err.code, err.reason)
                return msg

    def _ready(self, reply: tmqp.Frame) -> None:
        self.client_id = header(reply, Header.CLIENT_ID) or reply.target or self.client_id
        self.session_secret = header(reply, Header.SESSION_SECRET)
        self._state = SessionState.READY
        log.debug("async session ready as %s", self.client_id)

    async def _run(self) -> None:
        """The background task: read the session; when it is lost, start a new one."""
        try:
            while True:
                sock = self._sock
                assert sock is not None
                reason = await self._read(sock)
                log.info("async session lost: %s", reason)
                if not self.reconnect:
                    self._lost(reason)
                    return
                self._lost_reason = reason
                self._state = SessionState.BACKOFF
                self._close_socket()
                self._fail_pending(ConnectionLost(reason))
                if not await self._resume():
                    return
        except Exception:
            log.exception("async client reader failed")
            self._lost("the reader task failed")

    async def _resume(self) -> bool:
        """New sessions, with backoff, until one is accepted (False: refused for good)."""
        low, high = self.backoff
        attempt = 0
        while True:
            delay = min(high, low * (2**attempt)) * (0.5 + random.random() / 2)
            attempt += 1
            await asyncio.sleep(delay)
            sock = self._open_socket()
            try:
                reply = await asyncio.wait_for(self._handshake(sock), self.timeout)
            except TimeoutError:
                self._lost_reason = "no answer to the connection info"
            except _Refused as exc:
                if exc.code in _PERMANENT:
                    self._close_socket()
                    self._lost(str(exc), ConnectError(f"the broker refused the connection: {exc}"))
                    return False
                self._lost_reason = f"connection refused for now: {exc}"
            except zmq.ZMQError as exc:
                self._lost_reason = f"socket error: {exc}"
            else:
                self._ready(reply)
                for name, prefetch in list(self._channels.items()):  # join again, not awaited
                    frame = join_frame(self.new_id(), name, prefetch)
                    await sock.send(tmqp.encode(frame)[0])
                return True
            self._state = SessionState.BACKOFF
            self._close_socket()

    async def _read(self, sock: zmq.asyncio.Socket) -> str:
        """Handle what arrives until the session is lost; returns why."""
        loop = asyncio.get_running_loop()
        last_rx = loop.time()
        pinged = False
        while True:
            limit = self.peer_timeout if pinged else self.ping_interval
            left = last_rx + limit - loop.time()
            try:
                ready = await sock.poll(max(0, int(left * 1000)) + 1) if left > 0 else 0
                if not ready:
                    if loop.time() - last_rx >= self.peer_timeout:
                        return f"no traffic from the broker for {self.peer_timeout} s"
                    if not pinged:
                        pinged = True
                        await sock.send(_PING)
                    continue
                data = await sock.recv()
            except zmq.ZMQError as exc:
                return f"socket error: {exc}"
            pinged = False
            reason = await self._dispatch(sock, data)
            if reason is not None:
                return reason
            last_rx = loop.time()  # after a wait for room in the inbox too

    async def _dispatch(self, sock: zmq.asyncio.Socket, data: bytes) -> str | None:
        """Handle one frame; why the session is over (TERMINATE), else None."""
        try:
            msg = tmqp.decode((data,))
        except DecodeError as exc:
            log.warning("undecodable frame from the broker: %s", exc.reason)
            return None
        if type(msg) is not tmqp.Frame:
            if type(msg) is tmqp.Ping:
                await sock.send(_PONG)
            return None
        mt = msg.message_type
        if mt in _REPLY_TYPES:
            self._settle(msg)
        elif mt in _INBOX_TYPES:
            await self._to_inbox(sock, Message(msg))
        elif mt == MessageType.PING:
            await sock.send(_PONG)
        elif mt == MessageType.TERMINATE:
            code = msg.content_type
            reason = header(msg, Header.REASON) or "no reason given"
            return f"the broker ended the session: {reason} (status {code})"
        elif mt != MessageType.PONG:
            log.debug("ignored frame type %#x from the broker", mt)
        return None

    async def _to_inbox(self, sock: zmq.asyncio.Socket, message: Message) -> None:
        """Put ``message`` in the inbox; while it is full, keep the session alive."""
        inbox = self._inbox
        if not inbox.full():
            inbox.put_nowait(message)
            return
        put = asyncio.ensure_future(inbox.put(message))
        try:
            while True:
                done, _ = await asyncio.wait({put}, timeout=self.ping_interval)
                if done:
                    return
                await sock.send(_PING)  # not reading is not being gone
        finally:
            if not put.done():
                put.cancel()

    def _settle(self, frame: tmqp.Frame) -> None:
        future = self._pending.pop(frame.message_id, None)
        err = failure(frame)
        if future is None or future.done():
            if err is not None:
                log.warning("broker reported for %r: %s", frame.message_id, err)
            return
        if err is not None:
            future.set_exception(err)
        else:
            future.set_result(frame)

    def _lost(self, reason: str, error: ClientError | None = None) -> None:
        """The session is over for good: fail waiters, end the inbox."""
        log.info("async session over: %s", reason)
        if self._state is not SessionState.CLOSED:
            self._state = SessionState.CLOSED
            self._error = error or ConnectionLost(reason)
        self._fail_pending(self._closed_error())
        self._end_inbox()

    # -- sending and requests ----------------------------------------------------------

    async def _send(self, data: bytes) -> None:
        sock = self._sock
        if sock is None or self._state is not SessionState.READY:
            raise self._closed_error()
        await sock.send(data)

    async def _request(self, frame: tmqp.Frame, timeout: float | None) -> tmqp.Frame:
        """Send ``frame`` and wait for the ACK/RESPONSE with its message id."""
        mid = frame.message_id
        sock = self._sock
        if sock is None or self._state is not SessionState.READY:
            raise self._closed_error()
        future: asyncio.Future[tmqp.Frame] = asyncio.get_running_loop().create_future()
        self._pending[mid] = future
        wait = self.timeout if timeout is None else timeout
        try:
            await sock.send(tmqp.encode(frame)[0])
            return await asyncio.wait_for(future, wait)
        except TimeoutError:
            raise TimeoutError(f"no answer to {mid} within {wait} s") from None
        finally:
            if self._pending.get(mid) is future:
                del self._pending[mid]

    # -- queues ------------------------------------------------------------------------

    async def join(
        self, channel: str, timeout: float | None = None, *, prefetch: int | None = None
    ) -> None:
        """Join a channel: its push/broadcast/round-robin queues deliver to this client.

        ``prefetch``: as for :meth:`broker.client.Client.join` (kept for reconnects).
        """
        await self._request(join_frame(self.new_id(), channel, prefetch), timeout)
        self._channels[channel] = prefetch

    async def leave(self, channel: str, timeout: float | None = None) -> None:
        self._channels.pop(channel, None)
        await self._request(operation_frame(self.new_id(), Operation.LEAVE, channel), timeout)

    async def push(
        self,
        channel: str,
        queue_id: int,
        payload: bytes | str,
        *,
        ack: bool = False,
        headers: Headers | None = None,
        high_priority: bool = False,
        timeout: float | None = None,
    ) -> str:
        """Push into a queue; with ``ack`` wait for the broker's acknowledge (``RemoteError``
        on a negative one).  Returns the message id."""
        mid = self.new_id()
        frame = queue_frame(
            mid,
            channel,
            queue_id,
            as_bytes(payload),
            source=self.client_id or "",
            ack=ack,
            headers=headers,
            high_priority=high_priority,
        )
        if ack:
            await self._request(frame, timeout)
        else:
            await self._send(tmqp.encode(frame)[0])
        return mid

    async def ack(self, message: Message) -> None:
        """Positive acknowledge of a received queue or direct message."""
        await self._send(tmqp.encode(ack_frame(message))[0])

    async def nack(self, message: Message, reason: str = "none") -> None:
        """Negative acknowledge (``Nack-Reason`` header)."""
        frame = ack_frame(message, ((Header.NACK_REASON, reason),))
        await self._send(tmqp.encode(frame)[0])

    # -- receiving ---------------------------------------------------------------------

    async def receive(self, timeout: float | None = None) -> Message | None:
        """Next queue/direct/event message, or None after ``timeout`` seconds.

        Raises ``ClientClosed`` (or ``ConnectionLost``) once the session is over and
        the messages received before that have been read.
        """
        inbox = self._inbox
        if not inbox.empty():
            item = inbox.get_nowait()
        elif self._state is SessionState.CLOSED:
            raise self._closed_error()
        else:
            try:
                item = await asyncio.wait_for(inbox.get(), timeout)
            except TimeoutError:
                return None
        if isinstance(item, _Closed):
            self._end_inbox()  # for the next reader
            raise self._closed_error()
        return item

    async def consume(self, timeout: float | None = None) -> AsyncIterator[Message]:
        """Iterate over received messages; stops after ``timeout`` seconds without one."""
        while True:
            message = await self.receive(timeout)
            if message is None:
                return
            yield message

    # -- direct messages ---------------------------------------------------------------

    async def send(
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
        await self._send(tmqp.encode(frame)[0])
        return mid

    async def request(
        self,
        target: str,
        payload: bytes | str = b"",
        *,
        content_type: int = 0,
        headers: Headers | None = None,
        timeout: float | None = None,
    ) -> Message:
        """Send a direct message and wait for the peer's response (``RemoteError`` if it
        fails or nobody matches ``target``)."""
        frame = direct_frame(
            self.new_id(),
            target,
            payload,
            content_type=content_type,
            headers=headers,
            response=True,
        )
        return Message(await self._request(frame, timeout))

    async def respond(
        self,
        message: Message,
        payload: bytes | str = b"",
        *,
        code: int = ResultCode.OK,
        headers: Headers | None = None,
    ) -> None:
        """Answer a direct message that waits for a response."""
        frame = response_frame(message, payload, code=code, headers=headers)
        await self._send(tmqp.encode(frame)[0])

    # -- server operations -------------------------------------------------------------

    async def _operation(
        self,
        operation: int,
        target: str = "",
        *,
        payload: Any = None,
        queue_id: int | None = None,
        response: bool = False,
    ) -> Any:
        frame = operation_frame(
            self.new_id(), operation, target, payload=payload, queue_id=queue_id, response=response
        )
        reply = await self._request(frame, None)
        if not response:
            return None
        value = Message(reply).json()
        path = STATS_LIST if operation == Operation.STATS else ()
        seen: set[str] = set()
        request = next_page(frame, reply, self.new_id(), seen)
        while request is not None:  # a list the broker sends in pages
            reply = await self._request(request, None)
            merge(value, Message(reply).json(), path)
            request = next_page(request, reply, self.new_id(), seen)
        return value

    async def create_channel(self, name: str, options: dict[str, Any] | None = None) -> None:
        await self._operation(Operation.CHANNEL_CREATE, name, payload=options)

    async def delete_channel(self, name: str) -> None:
        await self._operation(Operation.CHANNEL_DELETE, name)

    async def channels(self, pattern: str = "") -> Any:
        return await self._operation(Operation.CHANNEL_LIST, pattern, response=True)

    async def channel_info(self, name: str) -> Any:
        return await self._operation(Operation.CHANNEL_INFO, name, response=True)

    async def create_queue(
        self, channel: str, queue_id: int, options: dict[str, Any] | None = None
    ) -> None:
        await self._operation(Operation.QUEUE_CREATE, channel, payload=options, queue_id=queue_id)

    async def update_queue(self, channel: str, queue_id: int, options: dict[str, Any]) -> None:
        await self._operation(Operation.QUEUE_UPDATE, channel, payload=options, queue_id=queue_id)

    async def delete_queue(self, channel: str, queue_id: int) -> None:
        await self._operation(Operation.QUEUE_DELETE, channel, queue_id=queue_id)

    async def queues(self, channel: str) -> Any:
        return await self._operation(Operation.QUEUE_LIST, channel, response=True)

    async def queue_info(self, channel: str, queue_id: int) -> Any:
        return await self._operation(
            Operation.QUEUE_INFO, channel, queue_id=queue_id, response=True
        )

    async def clients(self, client_type: str = "") -> Any:
        return await self._operation(Operation.CLIENT_LIST, client_type, response=True)

    async def stats(self) -> Any:
        """The server's transport counters and the engine's statistics."""
        return await self._operation(Operation.STATS, response=True)
