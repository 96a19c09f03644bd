"""One process serving files and messages: a FILEMQ server and the broker on one context.

The composition sits above both packages (``filemq`` and ``broker`` never import each
other); ``zerohub serve`` (:mod:`zerohub.main`) runs it from the command line, built by
:func:`build` from one :class:`~zerohub.config.HubConfig`.  Beside the two services the
hub may serve its metrics (:mod:`zerohub.metrics`) and its web console
(:mod:`zerohub.console`) over HTTP on loopback.  Every socket is bound before a
published directory is walked or hashed, so an endpoint or port in use fails at once
and nothing was done for nothing.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from broker.engine.auth import Authorizer
from broker.engine.delivery import PersistentDeliveryHandler
from broker.engine.engine import Engine
from broker.engine.limits import Limits
from broker.engine.options import BrokerConfig as EngineConfig
from broker.server.options import ServerError, ServerOptions
from broker.server.server import REPLY_OVERHEAD, Server
from broker.store.durable import DurableStore
from broker.store.log import LogStore, StoreError
from filemq.filters import Filters, read_pattern_file
from filemq.live import LiveFileServer
from filemq.server import Mount
from filemq.state import default_state_dir
from zerohub.config import ConfigError, HubConfig, split_address
from zerohub.httpd import HttpServer
from zerohub.rates import QueueRates

__all__ = ["STATUS_TTL", "Hub", "HubEndpoints", "build"]

#: Seconds one read of the broker's figures serves every reader (metrics, console).
STATUS_TTL = 0.5


@dataclass(frozen=True, slots=True)
class HubEndpoints:
    """Where the hub listens (the bound endpoints: a ``*`` or 0 port is resolved)."""

    files: str
    broker: str
    #: Base URLs of the HTTP front doors (``metrics``, ``console``) that are on.
    http: dict[str, str]


class Hub:
    """A :class:`LiveFileServer`, a broker :class:`Server` and optional HTTP front doors,
    started and stopped together.

    Both services are built by the caller on the same ZeroMQ context (injected; the
    caller terminates it after :meth:`stop`), but for contexts in ``owned``, which the
    hub made (the broker's, when it allows other CURVE keys than the file server).
    """

    def __init__(
        self,
        files: LiveFileServer,
        broker: Server,
        http: Sequence[HttpServer] = (),
        *,
        owned: Sequence[zmq.Context[Any]] = (),
        events: tuple[str, int] | None = None,
        federation: Any = None,
        events_keys: tuple[str, str] | None = None,
        federation_keys: tuple[str, str] | None = None,
        federation_secret: str | None = None,
        store: LogStore | None = None,
    ) -> None:
        self.files = files
        self.broker = broker
        self.http = list(http)
        #: (``CHANNEL[/QUEUE]``, buffer): file events to the hub's own broker, or None.
        self.events_spec = events
        self.events: Any = None  # the publisher, once started
        #: (broker's key file, client's .key_secret) of a CURVE broker, for the events
        #: client and the federation client, or None.
        self.events_keys = events_keys
        self.federation_keys = federation_keys
        #: The secret the broker gives the federation's reserved client id for
        #: (``broker.federation.runner.local_proof``), or None.
        self.federation_secret = federation_secret
        #: Federation settings of the broker (``broker.federation``), or None.
        self.federation_settings = federation
        self.federation: Any = None  # the running federation
        #: Contexts the hub made itself (terminated by :meth:`stop`).
        self.owned = list(owned)
        #: The broker's durable log (with ``data``): closed by :meth:`stop`.
        self.store = store
        #: The token the console's actions need ("" without a console).
        self.console_token = ""
        #: Per-queue rates, updated each time the broker's figures are read.
        self.rates = QueueRates()
        #: Seconds one read of the broker's figures serves (metrics, console, several
        #: readers at once: one read of the engine, ``broker_snapshot``).
        self.status_ttl = STATUS_TTL
        self._snapshot: tuple[float, dict[str, Any]] | None = None
        self._snapshot_lock = threading.Lock()

    def start(self) -> HubEndpoints:
        """Bind every socket, then start serving (walks and hashes the published trees).

        Raises what the file server, the broker or an HTTP server raises when a bind
        fails; whatever was started by then is stopped again.
        """
        try:
            files_endpoint = self.files.server.bind()
            broker_endpoint = self.broker.start()
            for door in self.http:
                door.bind()
            if self.events_spec is not None:
                self._start_events(broker_endpoint)
            if self.federation_settings is not None:
                from broker.federation.runner import Federation

                local = broker_endpoint.replace("tcp://0.0.0.0:", "tcp://127.0.0.1:")
                self.federation = Federation(
                    self.federation_settings,
                    local,
                    context=self.broker.context,
                    local_keys=self.federation_keys,
                    local_secret=self.federation_secret,
                )
                self.federation.start()
            self.files.start()
            urls = {door.name: door.start() for door in self.http}
        except BaseException:
            self.stop()
            raise
        return HubEndpoints(files=files_endpoint, broker=broker_endpoint, http=urls)

    def _start_events(self, broker_endpoint: str) -> None:
        from filemq.broker_events import EventTarget
        from zerohub.file_events import publisher

        assert self.events_spec is not None
        channel, buffer = self.events_spec
        local = broker_endpoint.replace("tcp://0.0.0.0:", "tcp://127.0.0.1:")
        server_key, secret = self.events_keys or (None, None)
        target = EventTarget.parse(
            local, channel, buffer=buffer, server_key=server_key, curve_secret=secret
        )
        self.events = publisher(target, f"zerohub serve {self.files.server.endpoint}",
                                self.broker.context)  # fmt: skip
        self.files.server.events = self.events

    def stop(self, timeout: float = 5.0) -> None:
        """Stop everything (idempotent): HTTP first, the file server, then the broker.

        Every part is stopped even when stopping another one raised (a second Ctrl-C,
        say): a part left running would keep its sockets open, and the caller's
        ``context.term()`` would wait for them for ever.  The first error is raised
        once all are stopped.
        """
        steps: list[Callable[[], object]] = [door.stop for door in self.http]
        steps.append(lambda: self.files.stop(timeout))
        if self.events is not None:  # after the files (their last events), before the broker
            steps.append(lambda: self.events.stop(timeout))
        if self.federation is not None:
            steps.append(lambda: self.federation.stop(timeout))
        steps.append(lambda: self.broker.stop(timeout))
        store, self.store = self.store, None
        if store is not None:
            steps.append(store.close)
        steps += [context.term for context in self.owned]
        self.owned = []
        first: BaseException | None = None
        for step in steps:
            try:
                step()
            except BaseException as exc:
                first = first or exc
        if first is not None:
            raise first

    def broker_snapshot(self) -> dict[str, Any]:
        """The broker's figures (:func:`zerohub.status.broker_status`, with the queues'
        rates), read again once ``status_ttl`` seconds have passed: the metrics and the
        console share a read.  The dict is shared: read it, never change it."""
        from zerohub.status import broker_status

        with self._snapshot_lock:
            now = time.monotonic()
            if self._snapshot is not None and now - self._snapshot[0] < self.status_ttl:
                return self._snapshot[1]
            broker = broker_status(self.broker)
            if "queue_list" in broker:
                self.rates.update(broker["queue_list"])
            self._snapshot = (now, broker)
            return broker

    def status(self) -> dict[str, Any]:
        """What the console shows (``zerohub.status``)."""
        from zerohub.status import files_status

        return {"files": files_status(self.files), "broker": self.broker_snapshot()}


def _console_curve(config: HubConfig) -> dict[str, Any]:
    """How the console's client reaches a CURVE broker: its certificate (checked: the
    broker's ``allow`` folder holds its public key), or why its actions cannot."""
    b, console = config.broker, config.console
    if b.curve_secret is None:
        return {}
    if console.curve_secret is None:
        return {
            "unavailable": "the broker uses CURVE: set [console] curve_secret to a client "
            "certificate whose public key is in [broker] allow"
        }
    from zerohub import zmqkit

    try:
        public = zmqkit.load_secret(console.curve_secret)[0]
    except zmqkit.SecurityError as exc:
        raise ConfigError("console.curve_secret", str(exc)) from None
    allowed = set()
    assert b.allow is not None  # (checked with broker.curve_secret)
    for key_file in sorted(Path(b.allow).glob("*.key")):
        try:
            allowed.add(zmqkit.load_public(key_file))
        except zmqkit.SecurityError:
            continue  # (the broker's authenticator skips it too)
    if public not in allowed:
        raise ConfigError(
            "console.curve_secret",
            f"its public key is not in broker.allow ({b.allow}): copy its .key file there",
        )
    return {"server_key": str(b.curve_secret), "curve_secret": str(console.curve_secret)}


def _open_data(data: Path | None) -> tuple[LogStore | None, DurableStore | None]:
    """The broker's durable log in ``data`` and the engine's store over it (None, None:
    in memory); ServerError if it cannot be opened."""
    if data is None:
        return None, None
    try:
        log_store = LogStore(data)
    except StoreError as exc:
        raise ServerError(f"--data {data}: {exc}") from None
    return log_store, DurableStore(log_store)


def _federation(config: HubConfig) -> Any:
    """The broker's federation settings, or None (``[federation]``)."""
    fed = config.federation
    if not fed.links and not fed.federate:
        return None
    if config.broker.curve_secret is not None and fed.secret is None:
        raise ConfigError("federation", "with a CURVE broker the federation needs a secret "
                          "(its client's key on the broker, allowed there)")  # fmt: skip
    from broker.federation.errors import ConfigError as FederationConfigError
    from broker.federation.settings import (
        FederationSettings,
        broker_id_for,
        parse_link,
        seen_file_for,
    )

    data = None if config.broker.data is None else str(config.broker.data)
    try:
        return FederationSettings(
            broker_id=broker_id_for(fed.broker_id or None, data),
            seen_file=seen_file_for(data),
            links=tuple(parse_link(link) for link in fed.links),
            accept=fed.accept,
            default_depth=fed.depth,
            server_key=None if fed.server_key is None else str(fed.server_key),
            curve_secret=None if fed.secret is None else str(fed.secret),
        )
    except FederationConfigError as exc:
        raise ConfigError("federation", str(exc)) from None


def _filters(config: HubConfig) -> Filters | None:
    lines: list[str] = []
    for path in config.files.exclude_from:
        lines.extend(read_pattern_file(path))
    lines.extend(config.files.exclude)
    return Filters(lines) if lines else None


def build(
    config: HubConfig, context: zmq.Context[Any], *, authorizer: Authorizer | None = None
) -> Hub:
    """The hub ``config`` describes, on ``context`` (nothing bound or started yet).

    ``authorizer`` decides what the broker's clients (the console's among them) may do
    (default: everything).
    """
    f, b = config.files, config.broker
    state_dir = None
    if f.state:
        state_dir = f.state_dir or default_state_dir()
    files = LiveFileServer(
        context,
        [Mount(p.dir, p.at) for p in f.publish],
        watch=f.watch,
        settle=f.settle,
        poll_interval=f.poll_interval if f.poll else None,
        state_dir=state_dir,
        endpoint=f.bind,
        wire=f.wire,
        curve_secret=f.curve_secret,
        allow_dir=f.allow,
        insecure=f.insecure,
        chunk_size=f.chunk_size,
        client_ttl=f.client_ttl,
        deny=f.deny,
        max_clients=f.max_clients,
        rescan_interval=f.rescan,
        bwlimit=f.bwlimit or None,
        filters=_filters(config),
        links=f.links,
    )
    limits = config.limits
    if limits.max_reply_size == Limits().max_reply_size:  # not set: replies fit a frame
        limits = limits.fitting(b.max_frame_size, REPLY_OVERHEAD)
    # One ZAP handler per context: the broker gets a context of its own when the two
    # services allow different key folders (zerohub.zmqkit.start_authenticator).
    owned: list[zmq.Context[Any]] = []
    broker_context = context
    if f.allow is not None and b.allow is not None and f.allow.resolve() != b.allow.resolve():
        broker_context = zmq.Context()
        owned.append(broker_context)
    events = None
    if f.events:
        from filemq.broker_events import EventsConfigError, EventTarget

        if b.curve_secret is not None and f.events_secret is None:
            raise ConfigError("files.events", "with a CURVE broker file events need "
                              "events_secret (a key allowed by the broker)")  # fmt: skip
        try:
            EventTarget.parse(b.bind, f.events, buffer=f.events_buffer)
        except EventsConfigError as exc:
            raise ConfigError("files.events", str(exc)) from None
        events = (f.events, f.events_buffer)
    federation = _federation(config)
    federation_secret = federation_key = None
    if federation is not None:  # the reserved client id: the hub's own federation only
        from broker.federation.runner import local_proof
        from zerohub.zmqkit import SecurityError

        try:
            federation_secret, federation_key = local_proof(
                None if b.curve_secret is None else str(federation.curve_secret)
            )
        except SecurityError as exc:
            raise ConfigError("federation", str(exc)) from None
    log_store, durable = _open_data(b.data)
    try:
        engine = Engine(
            config=EngineConfig(node_name=b.node_name, wall_clock=time.time, limits=limits),
            authorizer=authorizer,
            store=durable,
            handlers={"persistent": PersistentDeliveryHandler()},
        )
        if durable is not None:
            engine.recover(time.monotonic())
        broker = Server(
            engine,
            ServerOptions(
                endpoint=b.bind,
                curve_secret=None if b.curve_secret is None else str(b.curve_secret),
                allow_dir=None if b.allow is None else str(b.allow),
                insecure=b.insecure,
                max_frame_size=b.max_frame_size,
                ping_interval=b.ping_interval,
                peer_timeout=b.peer_timeout,
                max_connections=b.max_connections,
                federation_secret=federation_secret,
                federation_key=federation_key,
            ),
            context=broker_context,
            durable=durable,
        )
    except BaseException:
        if log_store is not None:
            log_store.close()
        raise
    curve = None if b.curve_secret is None else str(b.curve_secret)
    hub = Hub(
        files,
        broker,
        owned=owned,
        events=events,
        federation=federation,
        store=log_store,
        events_keys=None if curve is None else (curve, str(f.events_secret)),
        federation_keys=None if curve is None or federation is None
        else (curve, str(federation.curve_secret)),
        federation_secret=federation_secret,
    )  # fmt: skip
    if config.metrics.enabled:
        from zerohub.metrics import LinksCollector, metrics_server, registry

        address = split_address(config.metrics.address)
        links = LinksCollector(
            lambda: None if hub.federation is None else hub.federation.stats(),
            lambda: None if hub.events is None else hub.events.stats(),
        )
        metrics = registry(files, broker, log_store, broker_read=hub.broker_snapshot, links=links)
        hub.http.append(metrics_server(address, metrics))
    if config.console.enabled:
        from zerohub.console import console_server
        from zerohub.console.actions import ConsoleActions

        console = config.console
        address = split_address(console.address)
        hub.console_token = console.token or secrets.token_urlsafe(24)
        actions = ConsoleActions(
            lambda: broker.endpoint,
            broker_context,
            broker_token=console.broker_token or None,
            **_console_curve(config),
        )
        hub.http.append(
            console_server(
                address,
                hub.status,
                refresh=console.refresh,
                actions=actions,
                token=hub.console_token,
            )
        )
    return hub
