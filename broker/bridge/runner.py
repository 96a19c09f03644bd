"""The bridge driver: one thread feeds the core and carries out its actions.

It owns the connector (used from this thread only), runs the connector's network for
short slices (:data:`PUMP_SLICE`) and, between them, takes the events the local client's
I/O thread and the connector queued.  ``stop()`` closes both sides: outbound messages not
yet accepted stay unacknowledged locally (the broker hands them out again), inbound ones
stay unacknowledged remotely (the remote delivers them again).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from broker.bridge.config import Settings
from broker.bridge.connectors import Connector
from broker.bridge.core import (
    AckLocal,
    AckRemote,
    Action,
    BridgeCore,
    Connect,
    DeadLetter,
    Publish,
    PushLocal,
)
from broker.bridge.errors import ConnectorError
from broker.bridge.events import (
    Event,
    LocalAccepted,
    LocalDelivery,
    LocalRefused,
    RemoteAccepted,
    RemoteMessage,
    RemoteRefused,
)
from broker.bridge.local import LocalSide
from broker.protocol import Header

log = logging.getLogger(__name__)

#: Seconds the connector's network runs before the driver looks at its queue again.
PUMP_SLICE = 0.01
#: Seconds the driver waits for an event while the remote is down.
IDLE_SLICE = 0.05


class Bridge:
    """A running bridge: ``start()``, ``stop()``, ``stats()``; also a context manager."""

    def __init__(
        self,
        settings: Settings,
        connector: Connector,
        local_endpoint: str,
        *,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        client_options: dict[str, Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.core = BridgeCore(settings)
        self.connector = connector
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.local = LocalSide(
            local_endpoint,
            settings,
            self._events.put,
            context=context,
            client_options=client_options,
        )
        self._clock = clock
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._open = False
        self._lock = threading.Lock()
        self.failure: BaseException | None = None

    def __enter__(self) -> Bridge:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.local.start()
        self._thread = threading.Thread(target=self._main, name="broker-bridge", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self.local.close()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stats(self) -> dict[str, int]:
        """The core's counters plus the messages in flight each way and the connection."""
        with self._lock:
            counts = self.core.counters.snapshot()
            counts["out_in_flight"] = self.core.out_in_flight
            counts["in_in_flight"] = self.core.in_in_flight
            counts["connected"] = int(self.core.up)
        return counts

    # -- the driver thread -------------------------------------------------------------

    def _main(self) -> None:
        try:
            while not self._stopping.is_set():
                self._turn()
        except BaseException as exc:  # the bridge must say why it stopped
            log.exception("bridge driver failed")
            self.failure = exc
        finally:
            self._close_remote()

    def _turn(self) -> None:
        self._run(self._locked(lambda: self.core.poll(self._clock())))
        if self._open:
            try:
                self.connector.pump(PUMP_SLICE)
            except ConnectorError as exc:
                self._lost(exc)
            block = False
        else:
            block = True
        self._drain(block)

    def _drain(self, block: bool) -> None:
        try:
            event = self._events.get(timeout=IDLE_SLICE) if block else self._events.get_nowait()
        except queue.Empty:
            return
        while True:
            self._run(self._locked(lambda e=event: self._feed(e)))  # type: ignore[misc]
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                return

    def _locked(self, step: Callable[[], list[Action]]) -> list[Action]:
        with self._lock:
            return step()

    def _feed(self, event: Event) -> list[Action]:
        core = self.core
        match event:
            case LocalDelivery(route, message):
                again = (message.header(Header.REDELIVERED) or "").lower() == "true"
                return core.local_message(route, message.payload, message, again)
            case RemoteAccepted(token, generation):
                return core.remote_accepted(token, generation)
            case RemoteRefused(token, generation, reason):
                log.warning("remote refused a message: %s", reason)
                return core.remote_refused(token, generation)
            case RemoteMessage(route, payload, ref, generation, headers):
                return core.remote_message(route, payload, ref, headers, generation)
            case LocalAccepted(token):
                return core.local_accepted(token)
            case LocalRefused(token, reason):
                log.warning("local broker did not take a message (retrying): %s", reason)
                return core.local_refused(token, self._clock())
        return []

    def _lost(self, exc: ConnectorError) -> None:
        log.warning("remote connection lost: %s", exc)
        self._close_remote()
        self._run(self._locked(lambda: self.core.lost(self._clock())))

    def _run(self, actions: list[Action]) -> None:
        for action in actions:
            match action:
                case Publish(token, route, payload, resent):
                    self._to_remote(self.connector.publish, token, route.remote, payload, resent)
                case AckLocal(ref):
                    self.local.ack(ref)
                case PushLocal(token, route, payload, headers):
                    self.local.push(token, route, payload, headers)
                case AckRemote(ref):
                    self._to_remote(self.connector.ack, ref)
                case DeadLetter(route, reason, size):
                    self._dead_letter(route, reason, size)
                case Connect():
                    self._connect()

    def _to_remote(self, call: Callable[..., None], *args: Any) -> None:
        """Publish or ack on the open connection; a failure is a lost connection (the
        core publishes again after the reconnect; an ack not sent means a redelivery)."""
        if not self._open:
            return  # already lost in this batch of actions
        try:
            call(*args)
        except ConnectorError as exc:
            self._lost(exc)

    def _connect(self) -> None:
        generation = self.core.generation + 1
        try:
            self.connector.open(self._events.put, generation, self.settings.connect_timeout)
        except ConnectorError as exc:
            log.warning("cannot connect to the remote broker: %s", exc)
            self._run(self._locked(lambda: self.core.connect_failed(self._clock())))
            return
        self._open = True
        log.info("connected to the remote broker")
        self._run(self._locked(lambda: self.core.connected(self._clock())))

    def _close_remote(self) -> None:
        if self._open:
            self._open = False
            try:
                self.connector.close()
            except ConnectorError as exc:
                log.debug("closing the remote connection: %s", exc)

    def _dead_letter(self, route: Any, reason: str, size: int) -> None:
        where = str(route) if route is not None else "no route"
        log.warning("dead-lettered a remote message (%s): %s", where, reason)
        record = {"route": where, "reason": reason, "size": size, "time": time.time()}
        self.local.dead_letter(record)
