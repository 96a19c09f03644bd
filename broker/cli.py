"""``broker`` command line: serve, push, consume, pull, browse, trash, dsub, admin, stats,
bridge.

The server binds ``tcp://127.0.0.1:5680`` unless ``--bind`` (or the config file) says
otherwise; clients connect to ``--connect`` (default: the same, or ``$BROKER_ENDPOINT``).
A non-loopback bind needs CURVE (``--curve-secret SERVER.key_secret --allow DIR``) or
``--insecure``; CURVE clients pass ``--server-key SERVER.key --curve-secret CLIENT.key_secret``
(make keys with ``filemq keys new NAME``).

Config file (``--config FILE``, JSON, or TOML when the name ends in ``.toml``)::

    {"server": {"bind": "...", "curve_secret": "...", "allow": "...", "insecure": false,
                "max_frame_size": 16777216, "ping_interval": 5, "peer_timeout": 15},
     "broker": {"node_name": "zerohub", "auto_create_channel": true,
                "auto_create_queue": true,
                "channel_defaults": {"Status": 1, "RequestAcknowledge": false}},
     "limits": {"max_clients": 10000, "max_channels": 10000, "max_cc": 64, ...},
     "tokens": {"TOKEN": ["push", "join", "pull"], "ADMIN-TOKEN": "all"},
     "anonymous": ["push", "join"], "require_token": false}

``limits`` takes the fields of ``broker.limits.Limits`` (every one listed in docs/broker.md);
``server`` also takes ``handshake_timeout``, ``max_handshakes`` and ``max_connections``.

Command-line options override the file.  ``auto_create_channel`` / ``auto_create_queue``
(default true): a push to an unknown queue creates its channel and queue, a join of an
unknown channel creates the channel, a queue create in an unknown channel creates the
channel (each needs the client's CHANNEL_CREATE/QUEUE_CREATE rights); false answers
those with 404 instead.  Everything the broker holds (channels, queues, messages,
clients) lives in memory: a restart starts empty -- unless ``serve --data DIR``: then
channel and queue definitions, and the messages of queues whose
``MessageDeliveryHandler`` is ``persistent``, are kept in the durable log in DIR and
come back on restart; a producer's acknowledge leaves only once its message is fsync'ed.
Without ``--data`` the directory is ``$XDG_DATA_HOME/zerohub/broker`` (else
``~/.local/share/zerohub/broker``); ``--data none`` keeps everything in memory.
``--durability fsync|batch|os`` (default fsync) and ``--batch-interval MS`` (default 10)
choose when a save counts as done (``broker.store.log.Durability``).

Exit codes (``zerohub.cli.ExitCode``, the same in every zerohub command): 0 ok;
1 failure (no answer, an error status from the broker, an endpoint in use); 2 usage
(bad option or config file, malformed endpoint, a non-loopback bind without CURVE or
--insecure); 3 access refused (CURVE handshake failed, token refused, status 401);
130 interrupted (Ctrl-C) before done; 141 output pipe closed by the reader
(``broker stats | head -3``: the command stops quietly, as a tool killed by SIGPIPE
would).  ``serve``, ``consume`` and ``bridge`` stop on SIGINT/SIGTERM with 0.  Errors are one
line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from broker.protocol import DEFAULT_ENDPOINT
from zerohub.cli import (
    ArgumentParser,
    CommandError,
    ExitCode,
    UsageError,
    bind_endpoint,
    check_endpoint,
    connect_endpoint,
    log_level,
    run,
    stop_signals,
    verbosity_flags,
)

log = logging.getLogger("broker.cli")

#: Exit status when the reader of our output went away (128 + SIGPIPE, as the shell shows).
EXIT_BROKEN_PIPE = ExitCode.BROKEN_PIPE


def _load_config(path: str | None) -> dict[str, Any]:
    if path is None:
        return {}
    file = Path(path)
    try:
        text = file.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read config {path}: {exc.strerror}") from None
    try:
        if file.suffix == ".toml":
            import tomllib

            data: Any = tomllib.loads(text.decode("utf-8"))
        else:
            data = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"config {path}: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"config {path}: expected an object at the top level")
    return data


def _build_engine(
    config: dict[str, Any], max_frame_size: int | None = None, store: Any = None
) -> Any:
    import dataclasses
    import time as _time

    from broker.engine.auth import ALL_ACTIONS, Action, TokenAuthorizer
    from broker.engine.delivery import PerMessageDeliveryHandler, PersistentDeliveryHandler
    from broker.engine.engine import Engine, EngineError
    from broker.engine.limits import Limits, LimitsError
    from broker.engine.options import BrokerConfig, ChannelOptions, OptionsError
    from broker.engine.per_message import PER_MESSAGE
    from broker.server.server import REPLY_OVERHEAD

    section = dict(config.get("broker") or {})
    try:
        if "channel_defaults" in section:
            section["channel_defaults"] = ChannelOptions.from_json(section["channel_defaults"])
        names = {f.name for f in dataclasses.fields(BrokerConfig)} - {"wall_clock", "limits"}
        unknown = set(section) - names
        if unknown:
            raise UsageError(f"config broker: unknown keys {sorted(unknown)}")
        table = config.get("limits") or {}
        if not isinstance(table, dict):
            raise UsageError("config limits: expected a table of limits")
        limits = Limits.from_mapping(table)
        if max_frame_size is not None and "max_reply_size" not in table:
            limits = limits.fitting(max_frame_size, REPLY_OVERHEAD)  # replies fit a frame
        broker_config = BrokerConfig(**section, wall_clock=_time.time, limits=limits)
    except LimitsError as exc:
        raise UsageError(f"config {exc}") from None
    except (OptionsError, TypeError) as exc:
        raise UsageError(f"config broker: {exc}") from None

    def actions(value: Any, where: str) -> frozenset[Action]:
        if value == "all":
            return ALL_ACTIONS
        try:
            return frozenset(Action(v) for v in value)
        except (TypeError, ValueError):
            known = ", ".join(a.value for a in Action)
            raise UsageError(f"config {where}: actions are 'all' or a list of: {known}") from None

    authorizer = None
    if "tokens" in config:
        grants = {str(t): actions(v, "tokens") for t, v in dict(config["tokens"]).items()}
        authorizer = TokenAuthorizer(
            grants,
            anonymous=actions(config.get("anonymous", []), "anonymous"),
            require_token=bool(config.get("require_token", False)),
        )
    try:
        return Engine(
            config=broker_config,
            authorizer=authorizer,
            store=store,
            handlers={
                "persistent": PersistentDeliveryHandler(),
                PER_MESSAGE: PerMessageDeliveryHandler(broker_config.wall_clock),
            },
        )
    except EngineError as exc:  # the routers of the config: invalid, or too many
        raise UsageError(f"config broker: {exc.reason}") from None


def cmd_serve(args: argparse.Namespace) -> int:
    from broker.heap import one_arena

    one_arena()  # before any thread allocates (broker.heap: one system call per held payload)
    import zmq

    from broker.server.server import Server, ServerError, ServerOptions

    config = _load_config(args.config)
    section = dict(config.get("server") or {})
    known = SERVER_KEYS
    if set(section) - known:
        raise UsageError(f"config server: unknown keys {sorted(set(section) - known)}")
    for key in known:
        value = getattr(args, key, None)
        if value not in (None, False):
            section[key] = value
    endpoint = str(section.get("bind", DEFAULT_ENDPOINT))
    check_endpoint(endpoint, bind=True)
    curve = section.get("curve_secret") is not None
    if curve != (section.get("allow") is not None):
        raise UsageError("serve: --curve-secret and --allow go together")
    from zerohub import zmqkit

    fanout = section.get("fanout")
    try:
        zmqkit.check_bind(endpoint, curve=curve, insecure=bool(section.get("insecure")))
        if fanout is not None:
            check_endpoint(str(fanout), bind=True)
            zmqkit.check_bind(str(fanout), curve=curve, insecure=bool(section.get("insecure")))
    except zmqkit.SecurityError as exc:
        raise UsageError(str(exc)) from None
    try:
        default = ServerOptions(endpoint=endpoint)  # the one home of the [server] defaults
        options = ServerOptions(
            endpoint=endpoint,
            curve_secret=section.get("curve_secret"),
            allow_dir=section.get("allow"),
            insecure=bool(section.get("insecure", False)),
            max_frame_size=int(section.get("max_frame_size", default.max_frame_size)),
            ping_interval=float(section.get("ping_interval", default.ping_interval)),
            peer_timeout=float(section.get("peer_timeout", default.peer_timeout)),
            handshake_timeout=float(section.get("handshake_timeout", default.handshake_timeout)),
            max_handshakes=int(section.get("max_handshakes", default.max_handshakes)),
            max_connections=int(section.get("max_connections", default.max_connections)),
            fanout=str(fanout) if fanout is not None else None,
            fanout_hwm=int(section.get("fanout_hwm", default.fanout_hwm)),
        )
    except (TypeError, ValueError) as exc:
        raise UsageError(f"server options: {exc}") from None
    stomp = _stomp_listen_options(args, config.get("stomp"), bool(section.get("insecure")))
    if args.data is None:  # the user's data directory (federation keeps its id there too)
        args.data = str(default_data_dir())
    federation_settings = _federation_settings(args, config, options)
    federation_secret = None
    if federation_settings is not None:  # the reserved client id: its own client only
        from broker.federation.runner import local_proof

        curve = options.curve_secret is not None
        federation_secret, federation_key = local_proof(
            federation_settings.curve_secret if curve else None
        )
        options = dataclasses.replace(
            options, federation_secret=federation_secret, federation_key=federation_key
        )
    store = _open_data(args)
    recovered = 0
    try:
        engine = _build_engine(config, options.max_frame_size, store)
        if store is not None:
            recovered = engine.recover(time.monotonic())
    except BaseException:
        if store is not None:
            store.close()
        raise
    gc.set_threshold(*SERVE_GC_THRESHOLDS)
    door = None
    if stomp is not None:
        from broker.stomp.engine_backend import EngineDoor

        door = engine = EngineDoor(engine)
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        server = Server(engine, options, context=context, durable=store)
    except ServerError as exc:
        context.term()
        if store is not None:
            store.close()
        raise UsageError(str(exc)) from None
    listener = None
    federation = None
    if door is not None:
        from broker.stomp.engine_backend import listen

        listener = listen(door, server.add_reader, stomp, gate=server.gate)

    # From here on a signal asks the server to stop and nothing else (a KeyboardInterrupt
    # raised by a handler was once dropped in a ZeroMQ frame's finaliser: the loop never
    # stopped), for as long as it runs and stops: a second one does not cut the stop short.
    with stop_signals("broker") as stop:
        try:
            endpoint = server.bind()
            also = ""
            if listener is not None:
                try:
                    listener.start()
                except OSError as exc:
                    raise ServerError(f"cannot serve STOMP on {args.stomp}: {exc}") from None
                except ImportError:
                    raise ServerError(
                        "--stomp-ws needs the stomp-ws extra (pip install 'zerohub[stomp-ws]')"
                    ) from None
                host = listener.options.host
                also = f" (STOMP on tcp://{host}:{listener.port}"
                if listener.options.ws_port is not None:
                    also += f" and ws://{host}:{listener.ws_port}"
                also += ")"
            print(f"broker serving on {endpoint}{also}", file=sys.stderr, flush=True)
            if store is not None:
                print(f"broker recovered {recovered} messages from {args.data}", file=sys.stderr)
            server.start()
            if federation_settings is not None:
                federation = _start_federation(
                    federation_settings, server, context, options, federation_secret
                )
            while not stop.wait(_STOP_POLL):
                if not server.serving:  # the loop failed (its error is logged): stop too
                    raise CommandError("the server loop ended unexpectedly")
        except ServerError as exc:  # the endpoint is in use, a key file is unreadable, ...
            raise CommandError(str(exc)) from None
        finally:
            _stop_serving(server, listener, door, context, store, federation)
    return 0


#: Seconds between two looks at the serving thread while waiting for a signal.
_STOP_POLL = 0.5
#: The serving process's cyclic collector thresholds (young allocations, then passes of
#: the next generation).  A broker makes a few container objects per message and keeps
#: many alive (queued messages, deliveries in flight): CPython's default (700, 10, 10)
#: ran a young collection every few dozen messages and a full one, walking every queued
#: message, every few thousand.  Measured with STOMP, raw clients, 2 x 20,000 messages:
#: broker CPU 68-70 -> 64-68 us per message (session 12, bench/bench_stomp.py).  The
#: garbage that only the collector frees (cycles) waits at most 10,000 allocations more.
SERVE_GC_THRESHOLDS = (10_000, 20, 20)


def _stop_serving(
    server: Any, listener: Any, door: Any, context: Any, store: Any, federation: Any = None
) -> None:
    """Stop what ``serve`` started, every part whatever another one raises."""
    from broker.server.server import ServerError

    try:
        if federation is not None:
            federation.stop()
        if listener is not None:
            listener.stop()
        try:
            server.stop()
        except ServerError as exc:  # its thread did not stop in time
            raise CommandError(str(exc)) from None
        finally:
            if door is not None:
                door.close()
    finally:
        # destroy, not term: a socket a cut-short shutdown left open must not keep
        # the process waiting for ever (the server closed its own with their linger)
        context.destroy(linger=0)
        if store is not None:
            store.close()


def federation_flags(serve: argparse.ArgumentParser) -> None:
    """``broker serve`` flags of the federation (broker.federation)."""
    group = serve.add_argument_group("federation (links to other zerohub brokers)")
    group.add_argument(
        "--link",
        action="append",
        metavar="tcp://HOST:PORT[?mode=both|out|in&channels=P,..]",
        help="link to another broker (repeatable); mode out: only forward to it",
    )
    group.add_argument("--federate", action="store_true", help="accept links from brokers")
    group.add_argument(
        "--broker-id", help="this broker's id in Hops (default: kept in --data, else random)"
    )
    group.add_argument(
        "--link-depth",
        type=int,
        help="Depth of a message published without one (-1 unlimited, the default; 0 local)",
    )
    group.add_argument(
        "--link-accept",
        action="append",
        metavar="PATTERN",
        help="channels linked brokers may send and ask for (repeatable; default *)",
    )
    group.add_argument(
        "--link-server-key", metavar="FILE", help="the linked brokers' public .key file (CURVE)"
    )
    group.add_argument("--link-secret", metavar="FILE", help="the links' .key_secret file (CURVE)")


def _federation_settings(args: argparse.Namespace, config: dict[str, Any], options: Any) -> Any:
    """Federation settings from the flags and the config's ``[federation]`` table, or None
    when this broker does not federate."""
    from broker.federation.errors import ConfigError
    from broker.federation.settings import (
        DEFAULT_EXCHANGE_INTERVAL,
        DEFAULT_PEER_IN_FLIGHT,
        DEFAULT_PEER_TIMEOUT,
        FederationSettings,
        broker_id_for,
        parse_link,
        seen_file_for,
    )

    table = dict(config.get("federation") or {})
    known = {"links", "broker_id", "depth", "accept", "server_key", "secret", "federate",
             "exchange_interval", "peer_timeout", "peer_in_flight"}  # fmt: skip
    if set(table) - known:
        raise UsageError(f"config federation: unknown keys {sorted(set(table) - known)}")
    links = list(table.get("links") or []) + list(args.link or [])
    wanted = links or args.federate or table.get("federate") or args.broker_id
    if not wanted:
        return None
    try:
        settings = FederationSettings(
            broker_id=broker_id_for(args.broker_id or table.get("broker_id"), args.data),
            links=tuple(parse_link(str(link)) for link in links),
            accept=tuple(args.link_accept or table.get("accept") or ("*",)),
            default_depth=int(
                args.link_depth if args.link_depth is not None else table.get("depth", -1)
            ),
            server_key=args.link_server_key or table.get("server_key"),
            curve_secret=args.link_secret or table.get("secret"),
            seen_file=seen_file_for(args.data),
            exchange_interval=float(table.get("exchange_interval", DEFAULT_EXCHANGE_INTERVAL)),
            peer_timeout=float(table.get("peer_timeout", DEFAULT_PEER_TIMEOUT)),
            peer_in_flight=int(table.get("peer_in_flight", DEFAULT_PEER_IN_FLIGHT)),
        )
    except (ConfigError, TypeError, ValueError) as exc:
        raise UsageError(f"federation: {exc}") from None
    from zerohub import zmqkit

    try:  # unreadable key files: one line now, not a link that never connects
        if settings.curve_secret is not None:
            zmqkit.load_secret(settings.curve_secret)
        for key in {link.server_key or settings.server_key for link in settings.links}:
            if key is not None:
                zmqkit.load_public(key)
    except zmqkit.SecurityError as exc:
        raise UsageError(f"federation: {exc}") from None
    if options.curve_secret is not None and settings.curve_secret is None:
        raise UsageError("federation on a CURVE broker needs --link-secret (its key allowed here)")
    return settings


def _start_federation(
    settings: Any, server: Any, context: Any, options: Any, secret: str | None
) -> Any:
    """Start the federation client on this broker's own endpoint (served from then on);
    ``secret``: the one the server gives the federation's reserved client id for."""
    from broker.federation.runner import Federation

    endpoint = str(server.endpoint).replace("tcp://0.0.0.0:", "tcp://127.0.0.1:")
    keys = None
    if options.curve_secret is not None:
        keys = (str(options.curve_secret), str(settings.curve_secret))
    from broker.federation.errors import ConfigError

    try:
        federation = Federation(
            settings, endpoint, context=context, local_keys=keys, local_secret=secret
        )
    except ConfigError as exc:  # its seen window's file cannot be read
        raise CommandError(f"federation: {exc}") from None
    federation.start()
    print(f"broker federation: id {settings.broker_id}", file=sys.stderr, flush=True)
    return federation


def default_data_dir() -> Path:
    """Where ``broker serve`` keeps its data unless told: ``$XDG_DATA_HOME/zerohub/broker``
    (an absolute ``XDG_DATA_HOME`` only, as the XDG spec says), else
    ``~/.local/share/zerohub/broker``."""
    base = os.environ.get("XDG_DATA_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".local" / "share"
    return root / "zerohub" / "broker"


def _open_data(args: argparse.Namespace) -> Any:
    """The durable store ``serve`` asked for (None for ``--data none``); UsageError for bad
    options, CommandError if it cannot open."""
    data = args.data
    if data == "none":
        return None
    if data is None:
        data = args.data = str(default_data_dir())
    from broker.store.durable import DurableStore
    from broker.store.log import Durability, LogOptions, LogStore, StoreError

    extra: dict[str, int] = {}
    if args.segment_size is not None:  # a record never spans two segments
        extra["segment_size"] = args.segment_size
        extra["max_record_size"] = min(LogOptions().max_record_size, args.segment_size - 64)
    if args.preallocate is not None:
        extra["preallocate"] = args.preallocate
    try:
        options = LogOptions(
            durability=Durability(args.durability),
            batch_interval=args.batch_interval / 1000.0,
            **extra,
        )
    except (StoreError, ValueError) as exc:
        raise UsageError(f"serve: {exc}") from None
    try:
        return DurableStore(LogStore(data, options))
    except StoreError as exc:
        raise CommandError(f"serve --data {data}: {exc}") from None


#: Keys of the config file's ``[server]`` table (``ServerOptions`` fields and the CURVE /
#: bind settings); a key not listed is a usage error.  Their defaults are ``ServerOptions``'.
SERVER_KEYS = frozenset(
    {
        "bind",
        "curve_secret",
        "allow",
        "insecure",
        "max_frame_size",
        "ping_interval",
        "peer_timeout",
        "handshake_timeout",
        "max_handshakes",
        "max_connections",
        "fanout",
        "fanout_hwm",
    }
)

#: Keys of the config file's ``[stomp]`` table (the STOMP session options; see docs/stomp.md).
STOMP_KEYS = {
    "add_user_header": str,
    "add_timestamp_header": str,
    "add_redeliveries_header": str,
    "max_header_length": int,
    "max_headers": int,
    "max_data_length": int,
    "die_delay": float,
    "require_host": bool,
    "max_connections": int,
    "max_subscriptions": int,
    "max_wildcard_subscriptions": int,
    "max_transactions": int,
    "max_transaction_frames": int,
    "max_transaction_bytes": int,
}


def _stomp_listen_options(args: argparse.Namespace, table: Any, insecure: bool) -> Any:
    """``--stomp tcp://HOST:PORT`` (``--stomp-ws ws://HOST:PORT``, ``--stomp-tls-cert``/
    ``--stomp-tls-key``, the config's ``[stomp]`` table) as listener options (None: no
    STOMP listener).

    Off by default; a non-loopback host needs TLS or ``--insecure``: a STOMP
    ``passcode`` is the engine client token the broker's authorizer checks."""
    url: str | None = args.stomp
    if url is None:
        if args.stomp_ws is not None or args.stomp_tls_cert is not None:
            raise UsageError("--stomp-ws and --stomp-tls-* need --stomp tcp://HOST:PORT")
        return None
    import dataclasses
    import ssl

    from broker.stomp.cli import parse_address
    from broker.stomp.frames import Limits
    from broker.stomp.server import ListenerOptions
    from broker.stomp.session import SessionConfig

    bind = parse_address(url, "tcp")
    ws = parse_address(args.stomp_ws, "ws") if args.stomp_ws is not None else None
    if ws is not None and ws.host != bind.host:
        raise UsageError("--stomp-ws must use the same host as --stomp")
    if (args.stomp_tls_cert is None) != (args.stomp_tls_key is None):
        raise UsageError("--stomp-tls-cert and --stomp-tls-key go together")
    if not _is_loopback(bind.host) and args.stomp_tls_cert is None and not insecure:
        raise UsageError(
            f"--stomp {url}: not a loopback address (add --stomp-tls-cert/-key or --insecure)"
        )
    context: ssl.SSLContext | None = None
    if args.stomp_tls_cert is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(args.stomp_tls_cert, args.stomp_tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise CommandError(f"cannot load the STOMP TLS certificate: {exc}") from None
    settings = _stomp_settings(table)
    limits = Limits(
        **{
            name: settings.pop(key)
            for key, name in (
                ("max_header_length", "max_header_length"),
                ("max_headers", "max_headers"),
                ("max_data_length", "max_body"),
            )
            if key in settings
        }
    )
    listener = {k: settings.pop(k) for k in ("max_connections",) if k in settings}
    session = dataclasses.replace(SessionConfig(), limits=limits, **settings)
    return ListenerOptions(
        host=bind.host,
        port=bind.port,
        ws_port=ws.port if ws is not None else None,
        ssl=context,
        session=session,
        **listener,
    )


def _stomp_settings(table: Any) -> dict[str, Any]:
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise UsageError("config stomp: expected a table")
    unknown = set(table) - set(STOMP_KEYS) - {"virtual_hosts"}
    if unknown:
        raise UsageError(f"config stomp: unknown keys {sorted(unknown)}")
    settings: dict[str, Any] = {}
    if "virtual_hosts" in table:  # [[stomp.virtual_hosts]]: name, host_names
        from broker.stomp.errors import VirtualHostError
        from broker.stomp.vhosts import parse_virtual_hosts

        try:
            settings["virtual_hosts"] = parse_virtual_hosts(table["virtual_hosts"])
        except VirtualHostError as exc:
            raise UsageError(f"config stomp: {exc}") from None
    for key, value in table.items():
        if key == "virtual_hosts":
            continue
        kind = STOMP_KEYS[key]
        ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            ok, value = True, float(value)
        if not ok or (kind in (int, float) and value < 0) or (kind is str and not value):
            raise UsageError(f"config stomp: {key} must be a {kind.__name__} (got {value!r})")
        settings[key] = value
    return settings


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@contextlib.contextmanager
def _session(args: argparse.Namespace) -> Iterator[Any]:
    """A connected client (no reconnect) on its own context, closed afterwards."""
    import zmq

    from broker.client.blocking import Client

    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        client = Client(
            args.connect,
            context=context,
            client_id=args.client_id,
            name=args.name,
            token=args.token,
            server_key=args.server_key,
            curve_secret=args.curve_secret,
            timeout=args.timeout,
            reconnect=False,
        )
        client.connect()  # (closes the client itself if it fails or is interrupted)
        try:
            yield client
        finally:
            client.close()
    finally:
        context.term()


def _headers(items: Sequence[str]) -> tuple[tuple[str, str], ...]:
    out = []
    for item in items:
        key, sep, value = item.partition(":")
        if not sep or not key.strip():
            raise UsageError(f"--header wants KEY:VALUE, got {item!r}")
        out.append((key.strip(), value.strip()))
    return tuple(out)


def _emit(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True, default=str))


def cmd_push(args: argparse.Namespace) -> int:
    if args.data is None or args.data == "-":
        payload = sys.stdin.buffer.read()
    else:
        payload = args.data.encode("utf-8")
    with _session(args) as client:
        for _ in range(args.count):
            mid = client.push(
                args.channel,
                args.queue,
                payload,
                ack=args.ack,
                high_priority=args.high_priority,
                headers=_headers(args.header),
            )
            if args.ack:
                print(mid)
    return 0


def _print_message(message: Any, as_json: bool) -> None:
    if as_json:
        try:
            text: Any = message.payload.decode("utf-8")
        except UnicodeDecodeError:
            text = message.payload.hex()
        record = {
            "kind": message.kind.value,
            "id": message.id,
            "source": message.source,
            "target": message.target,
            "content_type": message.content_type,
            "headers": dict(message.headers),
            "payload": text,
        }
        print(json.dumps(record), flush=True)
    else:
        sys.stdout.buffer.write(message.payload + b"\n")
        sys.stdout.buffer.flush()


#: Longest wait for a message before ``broker consume`` looks whether a stop was asked.
_CONSUME_SLICE = 0.2


def _join_rules(args: argparse.Namespace) -> tuple[str | None, tuple[int, int] | None]:
    """``--selector`` (parsed here: a bad one is a usage error before any connection)
    and ``--credit COUNT,SIZE`` of ``broker consume``."""
    from broker.engine.errors import OperationError
    from broker.engine.join_rules import parse_credit
    from broker.selector import SelectorError, parse_selector

    if args.pattern and (args.selector is not None or args.credit is not None):
        raise UsageError("--selector and --credit apply to channels, not to --pattern joins")
    selector = args.selector
    if selector is not None:
        try:
            parse_selector(selector)
        except SelectorError as exc:
            raise UsageError(f"--selector: {exc}") from None
    credit = None
    if args.credit is not None:
        try:
            credit = parse_credit(args.credit)
        except OperationError as exc:
            raise UsageError(f"--credit: {exc.reason}") from None
    return selector, credit


def cmd_consume(args: argparse.Namespace) -> int:
    seen = 0
    selector, credit = _join_rules(args)
    with _session(args) as client:
        for channel in args.channel:
            if args.pattern:
                client.join_pattern(channel)
            else:
                client.join(channel, selector=selector, credit=credit)
        # SIGINT/SIGTERM ask for a stop (exit 0) and raise nothing: a KeyboardInterrupt
        # raised by a handler can be dropped in a ZeroMQ frame's finaliser, or cut a
        # message between its printing and its acknowledge.
        with stop_signals("broker consume") as stop:
            idle_until = None if args.wait is None else time.monotonic() + args.wait
            while not stop.is_set():
                wait = _CONSUME_SLICE
                if idle_until is not None:
                    wait = max(0.0, min(wait, idle_until - time.monotonic()))
                message = client.receive(wait)
                if message is None:
                    if idle_until is not None and time.monotonic() >= idle_until:
                        break  # --wait seconds without a message
                    continue
                _print_message(message, args.json)
                if message.needs_ack and not args.no_ack:
                    client.ack(message)
                seen += 1
                if args.count and seen >= args.count:
                    break
                if args.wait is not None:
                    idle_until = time.monotonic() + args.wait
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    with _session(args) as client:
        client.join(args.channel)  # pull requests are for the channel's consumers
        messages = client.pull(
            args.channel,
            args.queue,
            args.count,
            clear=args.clear,
            order=args.order,
            info=args.info,
        )
        for message in messages:
            _print_message(message, args.json)
            if message.needs_ack:
                client.ack(message)
    return 0


def _browse_line(sequence: int, message: Any, as_json: bool, reason: str | None = None) -> str:
    """One line per browsed message: ``SEQ<TAB>PAYLOAD`` (a payload that is not one line
    of UTF-8 text is shown as ``hex:`` and its octets in hex), or a JSON record; a trashed
    message's ``reason`` goes between them (``SEQ<TAB>REASON<TAB>PAYLOAD``)."""
    raw = bytes(message.payload)
    try:
        text = raw.decode("utf-8")
        if "\n" in text or "\r" in text:
            raise ValueError("several lines")
    except ValueError:
        text = "hex:" + raw.hex()
    if not as_json:
        return f"{sequence}\t{text}" if reason is None else f"{sequence}\t{reason}\t{text}"
    record: dict[str, Any] = {} if reason is None else {"reason": reason}
    record |= {
        "sequence": sequence,
        "id": message.message_id,
        "source": message.source,
        "headers": dict(message.headers),
        "high_priority": message.high_priority,
        "payload": text,
    }
    return json.dumps(record)


def cmd_browse(args: argparse.Namespace) -> int:
    if args.from_seq < -1:
        raise UsageError("browse: --from-seq must be -1 (after the last), 0 (first) or more")
    if args.limit < 1:
        raise UsageError("browse: --limit must be at least 1")
    with _session(args) as client:
        start, left = args.from_seq, args.limit
        while left > 0:
            page = client.browse(args.channel, args.queue, start, min(left, 1000))
            if not page:
                break
            for item in page:
                print(_browse_line(item.sequence, item.message, args.json), flush=True)
            left -= len(page)
            start = page[-1].sequence + 1
    return 0


def cmd_trash(args: argparse.Namespace) -> int:
    from broker.protocol import Header

    chosen = args.seq or None
    if chosen is not None and any(n < 1 for n in chosen):
        raise UsageError("trash: --seq takes sequence numbers (1 or more)")
    if args.action == "list" and chosen is not None:
        raise UsageError("trash list: --seq is for resubmit and purge")
    with _session(args) as client:
        if args.action == "list":
            start, left = 0, args.limit
            while left > 0:
                page = client.trash_list(args.channel, args.queue, start, min(left, 1000))
                if not page:
                    break
                for item in page:
                    reason = dict(item.message.headers).get(Header.TRASH_REASON, "")
                    print(_browse_line(item.sequence, item.message, args.json, reason), flush=True)
                left -= len(page)
                start = page[-1].sequence + 1
        elif args.action == "resubmit":
            print(client.trash_resubmit(args.channel, args.queue, chosen), flush=True)
        else:
            print(client.trash_purge(args.channel, args.queue, chosen), flush=True)
    return 0


def cmd_dsub(args: argparse.Namespace) -> int:
    if args.action != "list" and not args.id:
        raise UsageError(f"dsub {args.action} needs an ID")
    if args.action == "create" and not args.topics:
        raise UsageError("dsub create needs at least one TOPIC channel")
    if args.action != "create" and args.topics:
        raise UsageError(f"dsub {args.action}: TOPIC is for create")
    if args.action == "list" and args.id:
        raise UsageError("dsub list takes no ID")
    with _session(args) as client:
        if args.action == "list":
            for sub in client.durable_subscriptions():
                if args.json:
                    print(json.dumps(sub, sort_keys=True), flush=True)
                else:
                    topics = ",".join(sub.get("Topics", ()))
                    print(f"{sub['Id']}\t{topics}\t{sub.get('Messages', 0)}\t"
                          f"{sub.get('Consumers', 0)}", flush=True)  # fmt: skip
        elif args.action == "create":
            client.create_durable_subscription(args.id, args.topics)
        else:
            client.destroy_durable_subscription(args.id)
    return 0


def _options(text: str | None) -> Any:
    if text is None:
        return None
    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text("utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read {text[1:]}: {exc.strerror}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UsageError(f"--options is not JSON: {exc}") from None


def cmd_admin(args: argparse.Namespace) -> int:
    action, channel, queue = args.action, args.channel, args.queue
    if action in ("create", "delete", "update", "info") and channel is None:
        raise UsageError(f"admin {action} needs a CHANNEL")
    options = _options(args.options)
    if action == "update" and options is None:
        raise UsageError("admin update needs --options JSON")
    with _session(args) as client:
        if action == "create":
            if queue is None:
                client.create_channel(channel, options)
            else:
                client.create_queue(channel, queue, options)
        elif action == "update":
            if queue is None:
                client.update_channel(channel, options)
            else:
                client.update_queue(channel, queue, options)
        elif action == "delete":
            if queue is None:
                client.delete_channel(channel)
            else:
                client.delete_queue(channel, queue)
        elif action == "list":
            _emit(client.channels() if channel is None else client.queues(channel))
        elif action == "info":
            if queue is None:
                _emit(client.channel_info(channel))
            else:
                _emit(client.queue_info(channel, queue))
        elif action == "clients":
            _emit(client.clients(channel or ""))
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    with _session(args) as client:
        _emit(client.stats())
    return 0


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="broker",
        description="The zerohub message broker (TMQP over ZeroMQ) and its client commands.",
        parents=[verbosity_flags(top=True)],
    )
    flags = verbosity_flags(top=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> ArgumentParser:
        made: ArgumentParser = sub.add_parser(
            name, help=help, description=help[0].upper() + help[1:] + ".", parents=[flags]
        )
        return made

    serve = command("serve", f"run the broker (default bind {DEFAULT_ENDPOINT})")
    serve.add_argument(
        "--bind",
        type=bind_endpoint,
        metavar="ENDPOINT",
        help=f"endpoint to bind (default {DEFAULT_ENDPOINT})",
    )
    serve.add_argument("--config", metavar="FILE", help="JSON or TOML config file (.toml)")
    serve.add_argument(
        "--curve-secret",
        metavar="SERVER.key_secret",
        help="the server's .key_secret file (enables CURVE)",
    )
    serve.add_argument("--allow", metavar="DIR", help="folder of allowed client public .key files")
    serve.add_argument("--insecure", action="store_true", help="allow plain text off loopback")
    serve.add_argument(
        "--fanout",
        type=bind_endpoint,
        metavar="ENDPOINT",
        help="bind a PUB socket there for broadcast fan-out to consumers that ask for it",
    )
    serve.add_argument(
        "--fanout-hwm", type=int, help="runs of messages queued per fan-out subscriber (1000)"
    )
    serve.add_argument("--max-frame-size", type=int, help="largest frame accepted (octets)")
    serve.add_argument("--ping-interval", type=float, help="seconds before pinging a quiet peer")
    serve.add_argument(
        "--peer-timeout", type=float, help="seconds before a silent peer is dropped"
    )
    serve.add_argument(
        "--stomp",
        metavar="tcp://HOST:PORT",
        help="also serve STOMP 1.0-1.2 on this address (off by default; e.g. "
        "tcp://127.0.0.1:61613), on the same engine as TMQP",
    )
    serve.add_argument(
        "--stomp-ws",
        metavar="ws://HOST:PORT",
        help="also serve STOMP over WebSocket (same host as --stomp; e.g. ws://127.0.0.1:61614)",
    )
    serve.add_argument("--stomp-tls-cert", metavar="FILE", help="STOMP listeners' TLS certificate")
    serve.add_argument("--stomp-tls-key", metavar="FILE", help="its private key (PEM)")
    serve.add_argument(
        "--data",
        metavar="DIR",
        default=None,
        help="keep definitions and persistent queues in DIR (default: "
        "$XDG_DATA_HOME/zerohub/broker, else ~/.local/share/zerohub/broker; none: memory only)",
    )
    serve.add_argument(
        "--durability",
        choices=("fsync", "batch", "os"),
        default="fsync",
        help="when a persistent message counts as saved: fsync'ed (default), written and "
        "fsync'ed every --batch-interval, or written to the kernel only",
    )
    serve.add_argument(
        "--batch-interval",
        type=float,
        default=10.0,
        metavar="MS",
        help="milliseconds between fsyncs with --durability batch (default %(default)s)",
    )
    serve.add_argument(
        "--segment-size",
        type=int,
        default=None,
        metavar="OCTETS",
        help="size of one log segment file (default 64 MiB; at least 4096); a persistent "
        "message larger than a segment is refused (negative acknowledge 'failed')",
    )
    serve.add_argument(
        "--preallocate",
        type=int,
        default=None,
        metavar="OCTETS",
        help="octets of zeros kept written ahead of the log's head (fsync/batch modes; "
        "default: the store's, see docs/broker.md 'Zeros ahead of the head'; 0: off)",
    )
    federation_flags(serve)
    serve.set_defaults(func=cmd_serve)

    def client_command(name: str, help: str) -> ArgumentParser:
        p = command(name, help)
        client_options(p)
        return p

    def client_options(p: ArgumentParser) -> None:
        p.add_argument(
            "--connect",
            type=connect_endpoint,
            default=os.environ.get("BROKER_ENDPOINT", DEFAULT_ENDPOINT),
            metavar="ENDPOINT",
            help="broker endpoint (default $BROKER_ENDPOINT or %(default)s)",
        )
        p.add_argument(
            "--server-key", metavar="SERVER.key", help="the server's public .key file (CURVE)"
        )
        p.add_argument(
            "--curve-secret",
            metavar="CLIENT.key_secret",
            help="this client's .key_secret file (CURVE)",
        )
        p.add_argument("--client-id", metavar="ID", help="client id to ask for (default: new)")
        p.add_argument("--name", help="client name the broker shows in client lists")
        p.add_argument("--token", help="Client-Token sent when connecting")
        p.add_argument(
            "--timeout",
            type=float,
            default=10.0,
            metavar="SECONDS",
            help="seconds to wait for the broker to answer (default %(default)s)",
        )

    push = client_command("push", "push a message into a queue")
    push.add_argument("channel", help="channel name")
    push.add_argument("queue", type=int, help="queue id (0..65535)")
    push.add_argument("data", nargs="?", help="payload text, or - (default) for stdin")
    push.add_argument("--ack", action="store_true", help="wait for the broker's acknowledge")
    push.add_argument("--high-priority", action="store_true", help="ahead of regular messages")
    push.add_argument(
        "--header", action="append", default=[], metavar="KEY:VALUE", help="add a header"
    )
    push.add_argument("--count", type=int, default=1, help="send the payload this many times")
    push.set_defaults(func=cmd_push)

    consume = client_command("consume", "join channels and print delivered messages")
    consume.add_argument("channel", nargs="+", help="channels to join")
    consume.add_argument("--count", type=int, default=0, help="stop after N messages")
    consume.add_argument("--wait", type=float, default=None, help="stop after S idle seconds")
    consume.add_argument("--json", action="store_true", help="one JSON record per message")
    consume.add_argument("--no-ack", action="store_true", help="do not acknowledge messages")
    consume.add_argument(
        "--pattern",
        action="store_true",
        help="the names are patterns (. segments, *, **, {regex}): join every channel they "
        "match, now and as they are created",
    )
    consume.add_argument(
        "--selector",
        metavar="EXPR",
        help="SQL-92 selector over message headers: only the messages it selects "
        "(queues with MessageDeliveryHandler per-message)",
    )
    consume.add_argument(
        "--credit",
        metavar="COUNT,SIZE",
        help="credit windows: at most COUNT unacknowledged deliveries and SIZE octets",
    )
    consume.set_defaults(func=cmd_consume)

    pull = client_command("pull", "pull messages from a pull or cache queue")
    pull.add_argument("channel", help="channel name")
    pull.add_argument("queue", type=int, help="queue id")
    pull.add_argument("--count", type=int, default=1, help="messages to take (default 1)")
    pull.add_argument(
        "--clear",
        choices=["none", "all", "high-priority", "default-priority"],
        help="after pulling, remove these remaining messages",
    )
    pull.add_argument("--order", choices=["FIFO", "LIFO"], help="oldest (FIFO) or newest first")
    pull.add_argument("--info", action="store_true", help="ask for the remaining counts")
    pull.add_argument("--json", action="store_true", help="one JSON record per message")
    pull.set_defaults(func=cmd_pull)

    browse = client_command("browse", "read a queue by sequence number without consuming")
    browse.add_argument("channel", help="channel name")
    browse.add_argument("queue", type=int, help="queue id")
    browse.add_argument(
        "--from-seq",
        type=int,
        default=0,
        metavar="N",
        help="first sequence number (0: the oldest held, the default; -1: after the last)",
    )
    browse.add_argument(
        "--limit", type=int, default=1000, metavar="N", help="messages at most (default 1000)"
    )
    browse.add_argument("--json", action="store_true", help="one JSON record per message")
    browse.set_defaults(func=cmd_browse)

    trash = client_command("trash", "list, resubmit or purge what a queue's trash holds")
    trash.add_argument("action", choices=["list", "resubmit", "purge"], help="what to do")
    trash.add_argument("channel", help="channel name")
    trash.add_argument("queue", type=int, help="queue id")
    trash.add_argument(
        "--seq",
        type=int,
        action="append",
        metavar="N",
        help="resubmit/purge only this sequence number (repeatable; default: all)",
    )
    trash.add_argument(
        "--limit", type=int, default=1000, metavar="N", help="list: messages at most"
    )
    trash.add_argument("--json", action="store_true", help="list: one JSON record per message")
    trash.set_defaults(func=cmd_trash)

    dsub = client_command("dsub", "list, create or delete durable subscriptions")
    dsub.add_argument("action", choices=["list", "create", "delete"], help="what to do")
    dsub.add_argument("id", nargs="?", help="subscription id (create, delete)")
    dsub.add_argument("topics", nargs="*", metavar="TOPIC",
                      help="create: the topic channels it collects from")  # fmt: skip
    dsub.add_argument("--json", action="store_true", help="list: one JSON record per line")
    dsub.set_defaults(func=cmd_dsub)

    admin = client_command("admin", "create/update/delete/list/info channels and queues")
    admin.add_argument(
        "action",
        choices=["create", "update", "delete", "list", "info", "clients"],
        help="what to do",
    )
    admin.add_argument("channel", nargs="?", help="channel (for clients: a Client-Type filter)")
    admin.add_argument("queue", nargs="?", type=int, help="queue id (else: the channel)")
    admin.add_argument("--options", help="options JSON, or @FILE")
    admin.set_defaults(func=cmd_admin)

    stats = client_command("stats", "print the broker's counters")
    stats.set_defaults(func=cmd_stats)

    from broker.bridge import cli as bridge_cli

    bridge = command("bridge", "bridge the broker to another broker (see broker.bridge.cli)")
    kinds = bridge.add_subparsers(dest="kind", required=True, metavar="KIND")
    for kind, help in (
        ("mqtt", "bridge local queues and an MQTT broker (QoS 1, both ways)"),
        ("amqp", "bridge local queues and an AMQP 0-9-1 broker (confirms, manual acks)"),
        ("zmq", "bridge local queues and ZeroMQ sockets (SUB/PULL in, PUB/PUSH out)"),
        ("stomp", "bridge local queues and a STOMP 1.2 broker (receipts, client acks)"),
    ):
        made: ArgumentParser = kinds.add_parser(
            kind, help=help, description=help[0].upper() + help[1:] + ".", parents=[flags]
        )
        client_options(made)
        bridge_cli.add_arguments(made, kind)
    help = "run the bridges of a TOML file ([[bridge]] tables)"
    run_file: ArgumentParser = kinds.add_parser(
        "run", help=help, description=help[0].upper() + help[1:] + ".", parents=[flags]
    )
    client_options(run_file)
    bridge_cli.add_run_arguments(run_file)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: this program's arguments); the exit code."""
    return run("broker", lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=log_level(args, logging.WARNING),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    from broker.client.blocking import ClientError, RemoteError
    from broker.client.errors import AccessRefused

    started = time.monotonic()
    try:
        return int(args.func(args))
    except AccessRefused as exc:
        raise CommandError(str(exc), ExitCode.REFUSED) from None
    except RemoteError as exc:
        code = ExitCode.REFUSED if exc.code == 401 else ExitCode.FAILURE
        raise CommandError(str(exc), code) from None
    except (ClientError, TimeoutError) as exc:
        raise CommandError(str(exc)) from None
    finally:
        log.debug("%s took %.3f s", args.command, time.monotonic() - started)


if __name__ == "__main__":
    sys.exit(main())
