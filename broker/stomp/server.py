"""The STOMP TCP listener: asyncio in a thread of its own, ``start()`` / ``stop()``.

One :class:`~broker.stomp.session.Session` per connection; this module only moves bytes
and time between sockets and sessions.  Limits (defaults in :class:`ListenerOptions`):

* ``max_connections`` (1000): a connection beyond it gets an ERROR frame and is closed;
* ``max_outbound`` (1 MiB): when a connection's unsent bytes reach it, the connection
  stops taking deliveries (its queue messages stay queued for others; topic copies
  for it are dropped) and its input is no longer read (no receipt can pile up) until
  the buffer drains below a quarter of it.  A client that never reads costs at most
  this much plus one frame;
* read side: asyncio's transport reads what the socket holds (CPython's selector
  transport: up to 256 KiB per call), and the parser holds at most one limit's worth of
  an unfinished frame (see :class:`~broker.stomp.frames.Limits`);
* a connection that asked to close (DISCONNECT) or was sent an ERROR is aborted if
  its last bytes are not taken within ``close_timeout`` (2 s).

The backend is called only from the listener's thread; :meth:`StompListener.call` runs
a function there (tests and admin use it to look at the backend).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from broker.stomp.backend import Backend
from broker.stomp.frames import Command, make_frame, serialize
from broker.stomp.session import Authenticator, Session, SessionConfig, allow_anyone
from broker.stomp.wire import PlainWire, Wire

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_PORT = 61613


@dataclass(frozen=True, slots=True)
class ListenerOptions:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT  # 0: the OS picks one (see StompListener.port)
    #: STOMP over WebSocket on this port too (None: off; 0: the OS picks one; needs the
    #: ``stomp-ws`` extra).  Same host, same TLS context.
    ws_port: int | None = None
    ws_max_message: int = 16 * 1024 * 1024
    ssl: ssl.SSLContext | None = None
    max_connections: int = 1000
    max_outbound: int = 1024 * 1024
    close_timeout: float = 2.0
    session: SessionConfig = field(default_factory=SessionConfig)


class _Connection(asyncio.Protocol):
    def __init__(self, listener: StompListener, connection_id: int, wire: Wire) -> None:
        self.listener = listener
        self.id = connection_id
        self.wire = wire
        self.transport: asyncio.Transport | None = None
        self.session: Session | None = None
        self.writable = True
        self.timer: asyncio.TimerHandle | None = None
        self.closing = False
        self.refused = False  # a delivery was refused: tell the backend when room is back

    # -- asyncio callbacks --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        options = self.listener.options
        # Paused exactly when _room says full: a plain transport pauses once its buffer is
        # *above* ``high`` (TLS: at or above), and _room refuses deliveries once the unsent
        # bytes *reach* max_outbound.  With high = max_outbound a buffer of exactly
        # max_outbound bytes refused every delivery without a pause, so no resume_writing
        # came and the held deliveries waited forever (tests/stomp/test_outbound_edge.py).
        high = max(options.max_outbound - 1, 0)
        transport.set_write_buffer_limits(high=high, low=min(options.max_outbound // 4, high))
        peer = transport.get_extra_info("peername")
        peer_text = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        if len(self.listener.connections) >= options.max_connections:
            error = make_frame(
                Command.ERROR,
                [("message", f"too many connections (max {options.max_connections})")],
            )
            if self.wire.open:
                transport.write(serialize(error))
            self._close(abort_after=options.close_timeout)
            return
        self.listener.connections[self.id] = self
        now = self.listener.now()
        self.session = Session(
            self.listener.backend,
            self.id,
            now,
            config=options.session,
            authenticator=self.listener.authenticator,
            peer=peer_text,
            writable=self._writable,
            on_delivery=self._mark_dirty,
            room=self._room,
        )
        self.after_event(now)

    def data_received(self, data: bytes) -> None:
        if self.session is None or self.closing:
            return
        stomp = self.wire.receive(data)
        now = self.listener.now()
        if stomp:
            self.session.receive(stomp, now)
        self._mark_dirty()
        self.listener.flush_all(now)

    def eof_received(self) -> bool | None:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.listener.connections.pop(self.id, None)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.session is not None:
            self.session.connection_lost()
            self.listener.flush_all()

    def pause_writing(self) -> None:
        self.writable = False
        self._sync_reading()

    def resume_writing(self) -> None:
        self.writable = True
        self._sync_reading()
        if self.session is not None and self.session.info is not None:
            self.refused = False
            self.listener.backend.resume(self.id)
        # written once the transport's callback that called this returned: a write that
        # failed in it (the peer reset meanwhile) made asyncio tear the connection down
        # twice, an ERROR logged (CPython gh-156512; tests/stomp/test_adversary_resume.py)
        self.listener.loop.call_soon(self.listener.flush_all)

    # -- plumbing -----------------------------------------------------------------------

    def _writable(self) -> bool:
        """May one more delivery be taken?  (Unsent bytes, ours and the transport's.)"""
        if self._room() > 0:
            return True
        self.refused = True
        return False

    def _room(self) -> int:
        """Bytes of deliveries that may still be taken before the unsent ones (ours and
        the transport's) reach ``max_outbound``; 0 while the transport takes none -- nor
        once it is closing (a write failed: the peer is gone, asyncio tears it down on a
        later turn; what comes meanwhile stays held and goes back to its queue)."""
        transport = self.transport
        if not self.writable or self.closing or transport is None or self.session is None:
            return 0
        if not self.wire.open or transport.is_closing():
            return 0
        unsent = transport.get_write_buffer_size() + self.session.pending_output
        return self.listener.options.max_outbound - unsent

    def _sync_reading(self) -> None:
        """Read while the transport has room and the session handles what it reads
        (not while its SENDs wait for answers: ``Session.reading_paused``)."""
        transport, session = self.transport, self.session
        if transport is None or self.closing or transport.is_closing():
            return
        want = self.writable and not (session is not None and session.reading_paused)
        if want and not transport.is_reading():
            transport.resume_reading()
        elif not want and transport.is_reading():
            transport.pause_reading()

    def _mark_dirty(self) -> None:
        self.listener.dirty.add(self)

    def flush(self, now: float) -> None:
        session, transport = self.session, self.transport
        if session is None or transport is None or self.closing or transport.is_closing():
            return  # (closing: a write failed, connection_lost follows; nothing to write)
        wire = self.wire
        if wire.open:
            wire.send(session.take_output(now))
        if session.closed:
            wire.close()
        raw = wire.take()
        if raw:
            transport.write(raw)  # may call pause_writing
        if session.closed or wire.finished:
            self._close(abort_after=self.listener.options.close_timeout)
            return
        self._sync_reading()
        if self.refused and self.writable and session.info is not None:
            # refused for our own pending bytes, which are now in a transport with room
            self.refused = False
            self.listener.backend.resume(self.id)

    def after_event(self, now: float) -> None:
        self.flush(now)
        self._schedule()

    def _schedule(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.session is None or self.closing:
            return
        deadline = self.session.next_deadline()
        if deadline is not None:
            self.timer = self.listener.loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self.timer = None
        if self.session is None or self.closing:
            return
        now = self.listener.now()
        self.session.tick(now)
        self.listener.dirty.add(self)
        self.listener.flush_all(now)

    def _close(self, abort_after: float) -> None:
        if self.closing or self.transport is None:
            return
        self.closing = True
        if self.timer is not None:
            self.timer.cancel()
        transport = self.transport
        transport.close()  # sends what is buffered, then closes
        self.timer = self.listener.loop.call_later(abort_after, transport.abort)


class StompListener:
    """A STOMP listener on ``options.host:options.port`` serving ``backend``."""

    def __init__(
        self,
        backend: Backend,
        options: ListenerOptions | None = None,
        *,
        authenticator: Authenticator = allow_anyone,
    ) -> None:
        self.backend = backend
        self.options = options or ListenerOptions()
        self.authenticator = authenticator
        self.connections: dict[int, _Connection] = {}
        self.dirty: set[_Connection] = set()
        self._next_id = 1
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._port: int | None = None
        self._ws_server: asyncio.Server | None = None
        self._ws_port: int | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "listener not started"
        return self._loop

    @property
    def port(self) -> int:
        assert self._port is not None, "listener not started"
        return self._port

    @property
    def ws_port(self) -> int:
        assert self._ws_port is not None, "WebSocket listener not started"
        return self._ws_port

    def now(self) -> float:
        return self.loop.time()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("listener already started")
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._run, args=(started,), name="stomp-listener", daemon=True
        )
        self._thread.start()
        try:
            started.result()
        except BaseException:
            self._thread.join()
            self._thread = None
            raise

    def stop(self) -> None:
        if self._thread is None or self._loop is None:
            return
        loop = self._loop
        asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join()
        self._thread = None

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` in the listener's thread and return its result."""

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result()

    def outbound_bytes(self) -> dict[int, int]:
        """Unsent bytes per connection id (call it through :meth:`call`)."""
        return {
            cid: conn.transport.get_write_buffer_size()
            for cid, conn in self.connections.items()
            if conn.transport is not None
        }

    def flush_all(self, now: float | None = None) -> None:
        """Write what sessions produced (a delivery may land on any connection); the
        loop's clock read once for all of them (``now``: the caller read it)."""
        dirty = self.dirty
        if not dirty:
            return
        if now is None:
            now = self.now()
        while dirty:
            dirty.pop().after_event(now)

    # -- thread ---------------------------------------------------------------------------

    def _run(self, started: concurrent.futures.Future[None]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            server = loop.run_until_complete(self._bind(self.options.port, PlainWire))
            if self.options.ws_port is not None:
                from broker.stomp.websocket import WebSocketWire

                max_message = self.options.ws_max_message
                self._ws_server = loop.run_until_complete(
                    self._bind(self.options.ws_port, lambda: WebSocketWire(max_message))
                )
                self._ws_port = self._ws_server.sockets[0].getsockname()[1]
        except BaseException as exc:
            loop.close()
            started.set_exception(exc)
            return
        self._server = server
        self._port = server.sockets[0].getsockname()[1]
        started.set_result(None)
        try:
            loop.run_forever()
        finally:
            loop.close()

    async def _bind(self, port: int, wire: Callable[[], Wire]) -> asyncio.Server:
        def new_connection() -> _Connection:
            conn = _Connection(self, self._next_id, wire())
            self._next_id += 1
            return conn

        return await self.loop.create_server(
            new_connection, self.options.host, port, ssl=self.options.ssl
        )

    async def _shutdown(self) -> None:
        servers = [s for s in (self._server, self._ws_server) if s is not None]
        for server in servers:
            server.close()
        for conn in list(self.connections.values()):
            if conn.transport is not None:
                conn.transport.abort()
        for server in servers:
            await server.wait_closed()
        await asyncio.sleep(0)  # let connection_lost callbacks run
