"""``broker bridge mqtt|amqp``: run a bridge between the local broker and another broker.

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
import threading
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
}


def add_arguments(p: argparse.ArgumentParser, kind: str) -> None:
    p.add_argument("--url", required=True, help=f"remote broker, {_URLS[kind]}")
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
        p.set_defaults(func=cmd_bridge_mqtt)
    else:
        p.set_defaults(func=cmd_bridge_amqp)


def _settings(args: argparse.Namespace) -> Settings:
    routes = tuple(parse_route(text) for text in args.map)
    first, sep, largest = args.backoff.partition(":")
    try:
        backoff = (float(first), float(largest if sep else first))
    except ValueError:
        raise ConfigError(f"--backoff wants FIRST:MAX seconds, got {args.backoff!r}")
    dead_letter = None
    if args.dead_letter:
        dead = parse_route(f"{args.dead_letter}=dead-letter")
        dead_letter = (dead.channel, dead.queue_id)
    return Settings(
        routes=routes,
        window=args.window,
        backoff=backoff,
        connect_timeout=args.connect_timeout,
        max_message_size=args.max_message_size,
        dead_letter=dead_letter,
    )


def _default_client_id(routes: tuple[Route, ...]) -> str:
    digest = hashlib.sha1("\n".join(sorted(map(str, routes))).encode()).hexdigest()
    return f"zerohub-bridge-{digest[:12]}"


def cmd_bridge_mqtt(args: argparse.Namespace) -> int:
    try:
        settings = _settings(args)
        url = parse_url(args.url, "mqtt")
        from broker.bridge.connectors.mqtt import MqttConnector

        connector = MqttConnector(
            url,
            settings.routes_of(Direction.IN),
            client_id=args.remote_client_id or _default_client_id(settings.routes),
            window=settings.window,
        )
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    return _run(settings, connector, args)


def cmd_bridge_amqp(args: argparse.Namespace) -> int:
    try:
        settings = _settings(args)
        url = parse_url(args.url, "amqp")
        from broker.bridge.connectors.amqp import AmqpConnector

        connector = AmqpConnector(url, settings.routes_of(Direction.IN), window=settings.window)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    return _run(settings, connector, args)


def _run(settings: Settings, connector: Any, args: argparse.Namespace) -> int:
    import zmq

    from broker.bridge.runner import Bridge
    from broker.cli import _sigterm_interrupts

    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    options = {"timeout": args.timeout, "token": args.token, "name": args.name or "bridge"}
    if args.server_key or args.curve_secret:
        options.update(server_key=args.server_key, curve_secret=args.curve_secret)
    try:
        bridge = Bridge(settings, connector, args.connect, context=context, client_options=options)
        bridge.start()
        log.info("bridging %s", ", ".join(map(str, settings.routes)))
        stop = threading.Event()  # never set: wait() is the interruptible sleep
        next_stats = time.monotonic() + args.stats_interval
        try:
            with _sigterm_interrupts():
                while bridge.running:
                    stop.wait(_WATCH_SLICE)
                    if time.monotonic() >= next_stats:
                        log.info("counters: %s", bridge.stats())
                        next_stats += args.stats_interval
        except KeyboardInterrupt:
            pass
        finally:
            bridge.stop()
        if bridge.failure is not None:
            raise CommandError(f"the bridge stopped: {bridge.failure}")
        log.info("counters: %s", bridge.stats())
    finally:
        context.term()
    return 0
