"""``broker bridge mqtt|amqp|zmq``: run a bridge between the local broker and another broker
(``zmq``: plain ZeroMQ sockets of existing applications, see
``broker.bridge.connectors.zmq_sockets``).

    broker bridge mqtt --url mqtt://127.0.0.1:1883 --map orders/1=zh/orders \\
        --map in:sensors/2=zh/sensors/# [--window 100] [--connect tcp://127.0.0.1:5680]
    broker bridge amqp --url amqp://guest:guest@127.0.0.1:5672/ --map orders/1=amq.direct/o \\
        --map in:sensors/2=sensor-queue

Runs until SIGINT/SIGTERM (exit 0).  A malformed ``--map``, URL or limit is one line and
exit 2 (usage), as is a missing client library (``pip install 'zerohub[bridges]'``); a
local broker that does not answer is exit 1.  The remote broker may be down at the start:
the bridge keeps trying with backoff.  Counters are logged every ``--stats-interval``.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import time
from typing import Any

from broker.bridge.config import (
    DEFAULT_BACKOFF,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_WINDOW,
    Direction,
    Route,
    Settings,
    parse_route,
    parse_url,
)
from broker.bridge.errors import ConfigError
from zerohub.cli import CommandError, UsageError

log = logging.getLogger("broker.bridge")

#: Seconds between two looks at the bridge thread (did it fail?) while the command runs.
_WATCH_SLICE = 0.2


_URLS = {
    "mqtt": "mqtt://[USER:PASS@]HOST[:PORT] (default port 1883)",
    "amqp": "amqp://[USER:PASS@]HOST[:PORT][/VHOST] (default port 5672, guest, vhost /)",
    "zmq": "(not used: each --map names its socket, e.g. in:CH/1=sub:tcp://HOST:PORT#TOPIC)",
    "stomp": "stomp://[USER:PASS@]HOST[:PORT][/VHOST] (default port 61613)",
}


def add_arguments(p: argparse.ArgumentParser, kind: str) -> None:
    p.add_argument("--url", required=kind != "zmq", help=f"remote broker, {_URLS[kind]}")
    p.add_argument(
        "--map",
        action="append",
        default=[],
        required=True,
        metavar="[out:|in:]CHANNEL/QUEUE=REMOTE",
        help="a route (repeat): out (default) local queue -> remote topic, in: remote "
        "topic filter -> local queue",
    )
    p.add_argument(
        "--window",
        type=int,
        default=DEFAULT_WINDOW,
        help="messages in flight per direction (default %(default)s)",
    )
    p.add_argument(
        "--max-message-size",
        type=int,
        default=DEFAULT_MAX_MESSAGE_SIZE,
        metavar="OCTETS",
        help="larger remote messages are dead-lettered (default %(default)s)",
    )
    p.add_argument(
        "--dead-letter",
        metavar="CHANNEL/QUEUE",
        help="local queue that gets a JSON record per dead-lettered message",
    )
    p.add_argument(
        "--backoff",
        default=f"{DEFAULT_BACKOFF[0]}:{DEFAULT_BACKOFF[1]}",
        metavar="FIRST:MAX",
        help="reconnect delays in seconds, doubled per failure (default %(default)s)",
    )
    p.add_argument(
        "--connect-timeout",
        type=float,
        default=DEFAULT_CONNECT_TIMEOUT,
        metavar="SECONDS",
        help="wait for the remote to accept a connection (default %(default)s)",
    )
    p.add_argument(
        "--stats-interval",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="log the counters this often (default %(default)s)",
    )
    if kind == "mqtt":
        p.add_argument(
            "--remote-client-id",
            metavar="ID",
            help="MQTT client id of the bridge's persistent session (default: from the routes)",
        )
    p.set_defaults(func=cmd_bridge, kind=kind)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="TOML file of [[bridge]] tables (see docs/bridges.md)")
    p.add_argument(
        "--stats-interval",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="log the counters this often (default %(default)s)",
    )
    p.set_defaults(func=cmd_bridge_run)


#: Keys of a ``[[bridge]]`` table in ``broker bridge run FILE.toml``.
_TOML_KEYS = frozenset(
    {"kind", "url", "map", "window", "backoff", "connect_timeout", "max_message_size",
     "dead_letter", "client_id"}
)  # fmt: skip


def build(spec: dict[str, Any]) -> tuple[Settings, Any]:
    """A bridge's settings and connector from one spec (the flags, or a TOML table);
    ``ConfigError`` if anything is wrong."""
    kind = spec.get("kind")
    if kind not in _URLS:
        raise ConfigError(f"kind must be mqtt, amqp, stomp or zmq, got {kind!r}")
    maps = spec.get("map")
    if not isinstance(maps, list) or not all(isinstance(m, str) for m in maps):
        raise ConfigError("map must be a list of [out:|in:]CHANNEL/QUEUE=REMOTE strings")
    backoff = spec.get("backoff", DEFAULT_BACKOFF)
    try:
        first, largest = (float(x) for x in backoff)
        window = int(spec.get("window", DEFAULT_WINDOW))
        max_size = int(spec.get("max_message_size", DEFAULT_MAX_MESSAGE_SIZE))
        connect_timeout = float(spec.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT))
    except (TypeError, ValueError):
        raise ConfigError("window, backoff [FIRST, MAX], timeouts and sizes must be numbers")
    dead_letter = None
    if spec.get("dead_letter"):
        dead = parse_route(f"{spec['dead_letter']}=dead-letter")
        dead_letter = (dead.channel, dead.queue_id)
    settings = Settings(
        routes=tuple(parse_route(text) for text in maps),
        window=window,
        backoff=(first, largest),
        connect_timeout=connect_timeout,
        max_message_size=max_size,
        dead_letter=dead_letter,
    )
    if kind == "zmq":
        from broker.bridge.connectors.zmq_sockets import ZmqConnector

        return settings, ZmqConnector(settings.routes, window=window)
    url = parse_url(str(spec.get("url", "")), kind)
    inbound = settings.routes_of(Direction.IN)
    if kind == "stomp":
        from broker.bridge.connectors.stomp import StompConnector

        return settings, StompConnector(url, inbound, window=window)
    if kind == "mqtt":
        from broker.bridge.connectors.mqtt import MqttConnector

        client_id = spec.get("client_id") or _default_client_id(settings.routes)
        return settings, MqttConnector(url, inbound, client_id=client_id, window=window)
    from broker.bridge.connectors.amqp import AmqpConnector

    return settings, AmqpConnector(url, inbound, window=window)


def _default_client_id(routes: tuple[Route, ...]) -> str:
    digest = hashlib.sha1("\n".join(sorted(map(str, routes))).encode()).hexdigest()
    return f"zerohub-bridge-{digest[:12]}"


def _backoff_flag(text: str) -> tuple[float, float]:
    first, sep, largest = text.partition(":")
    try:
        return float(first), float(largest if sep else first)
    except ValueError:
        raise ConfigError(f"--backoff wants FIRST:MAX seconds, got {text!r}")


def cmd_bridge(args: argparse.Namespace) -> int:
    """``broker bridge mqtt|amqp``: one bridge from the flags."""
    try:
        spec = {
            "kind": args.kind,
            "url": args.url,
            "map": args.map,
            "window": args.window,
            "backoff": _backoff_flag(args.backoff),
            "connect_timeout": args.connect_timeout,
            "max_message_size": args.max_message_size,
            "dead_letter": args.dead_letter,
            "client_id": getattr(args, "remote_client_id", None),
        }
        bridges = [build(spec)]
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    return _run(bridges, args)


def cmd_bridge_run(args: argparse.Namespace) -> int:
    """``broker bridge run FILE.toml``: every ``[[bridge]]`` table of the file."""
    import tomllib

    try:
        with open(args.file, "rb") as f:
            config = tomllib.load(f)
    except OSError as exc:
        raise UsageError(f"cannot read {args.file}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{args.file}: {exc}") from None
    extra = set(config) - {"bridge"}
    tables = config.get("bridge")
    if extra or not isinstance(tables, list) or not tables:
        raise UsageError(f"{args.file}: wants [[bridge]] tables only (found {sorted(config)})")
    bridges = []
    for number, table in enumerate(tables, 1):
        unknown = sorted(set(table) - _TOML_KEYS)
        try:
            if unknown:
                raise ConfigError(f"unknown key {unknown[0]!r}")
            bridges.append(build(table))
        except ConfigError as exc:
            raise UsageError(f"{args.file}: bridge #{number}: {exc}") from None
    return _run(bridges, args)


def _run(bridges: list[tuple[Settings, Any]], args: argparse.Namespace) -> int:
    import zmq

    from broker.bridge.runner import Bridge
    from zerohub.cli import stop_signals

    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    options = {"timeout": args.timeout, "token": args.token, "name": args.name or "bridge"}
    if args.server_key or args.curve_secret:
        options.update(server_key=args.server_key, curve_secret=args.curve_secret)
    running: list[Bridge] = []
    # SIGINT/SIGTERM ask for a stop (exit 0, one line) and raise nothing: a
    # KeyboardInterrupt raised by a handler can be dropped in a ZeroMQ frame's finaliser.
    # Taken before the first bridge starts: a signal that comes once the broker sees the
    # bridge (a test, a supervisor) found the default action there, and killed it.
    with stop_signals("broker bridge") as stop:
        try:
            for settings, connector in bridges:
                if stop.is_set():
                    break
                bridge = Bridge(
                    settings, connector, args.connect, context=context, client_options=options
                )
                bridge.start()
                running.append(bridge)
                log.info("bridging %s", ", ".join(map(str, settings.routes)))
            next_stats = time.monotonic() + args.stats_interval
            while all(bridge.running for bridge in running):
                if stop.wait(_WATCH_SLICE):
                    break
                if time.monotonic() >= next_stats:
                    for bridge in running:
                        log.info("counters: %s", bridge.stats())
                    next_stats += args.stats_interval
        finally:
            for bridge in running:
                bridge.stop()
            context.term()
    for bridge in running:
        log.info("counters: %s", bridge.stats())
        if bridge.failure is not None:
            raise CommandError(f"the bridge stopped: {bridge.failure}")
    return 0
