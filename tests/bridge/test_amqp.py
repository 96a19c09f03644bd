"""The AMQP 0-9-1 bridge against a real rabbitmq-server and a real zerohub Server.

At-least-once: distinct payloads are counted; RabbitMQ keeps confirmed persistent
messages across a kill -9 in durable queues whose definitions are on its disk (the
restart test restarts it gracefully after declaring them: ``RabbitMQ.settle``), so a
restart may duplicate, never lose.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from typing import Any

import pytest
import zmq

from broker.bridge.config import Direction, Route, Settings, parse_url
from broker.bridge.runner import Bridge
from broker.client.blocking import Client
from broker.server.server import Server
from tests.bridge.amqp_peer import AmqpPeer
from tests.bridge.peers import RabbitMQ
from tests.bridge.test_mqtt import WAIT, consume
from tests.bridge.test_rabbit_stomp import take, unflagged_duplicates
from tests.polling import wait_until

pika = pytest.importorskip("pika", reason="pika not installed ([bridges])")
from broker.bridge.connectors.amqp import AmqpConnector  # noqa: E402

Ctx = zmq.Context[zmq.Socket[bytes]]
RESTART_WAIT = 90.0  # a RabbitMQ node takes ~10 s to boot on a loaded 2-core machine


def make_bridge(zctx: Ctx, server: Server, rabbit: RabbitMQ, *routes: Route, **kw: Any) -> Bridge:
    settings = Settings(routes=routes, backoff=(0.1, 1.0), **kw)
    connector = AmqpConnector(
        parse_url(rabbit.url, "amqp"), settings.routes_of(Direction.IN), window=settings.window
    )
    assert server.endpoint is not None
    return Bridge(
        settings, connector, server.endpoint, context=zctx, client_options={"timeout": 5.0}
    )


def test_amqp_round_trips_both_ways(
    zctx: Ctx, server: Server, rabbit: RabbitMQ, local: Client
) -> None:
    peer = AmqpPeer(rabbit)
    try:
        peer.declare("rt.out", "rt.in")
        local.create_queue("sensors", 2, {"Status": "Push"})
        local.join("sensors")
        routes = (
            Route(Direction.OUT, "orders", 1, "rt.out"),
            Route(Direction.IN, "sensors", 2, "rt.in"),
        )
        with make_bridge(zctx, server, rabbit, *routes) as bridge:
            out = {f"o{i}".encode() for i in range(100)}
            for payload in sorted(out):
                local.push("orders", 1, payload)
            assert wait_until(lambda: bridge.stats()["out_accepted"] == 100, WAIT)
            assert wait_until(lambda: local.queue_info("orders", 1)["Acks"] == 100, WAIT)
            assert set(peer.drain("rt.out")) == out
            incoming = {f"i{i}".encode() for i in range(100)}
            for payload in sorted(incoming):
                peer.publish("rt.in", payload)
            assert consume(local, len(incoming)) == incoming
            assert wait_until(lambda: bridge.stats()["in_accepted"] == 100, WAIT)
            # every delivery acked on RabbitMQ: nothing is left unacked or ready there
            assert wait_until(lambda: peer.depth("rt.in") == 0, WAIT)
    finally:
        peer.close()


def test_unroutable_publish_is_refused_and_not_acked_locally(
    zctx: Ctx, server: Server, rabbit: RabbitMQ, local: Client
) -> None:
    route = Route(Direction.OUT, "lost", 1, "no.such.queue")
    with make_bridge(zctx, server, rabbit, route) as bridge:
        local.push("lost", 1, b"nowhere")
        assert wait_until(lambda: bridge.stats()["out_refused"] >= 2, WAIT)
        assert bridge.stats()["out_accepted"] == 0
        assert local.queue_info("lost", 1)["Acks"] == 0
        peer = AmqpPeer(rabbit)
        try:
            peer.declare("no.such.queue")  # the route appears: the next attempt goes through
            assert wait_until(lambda: bridge.stats()["out_accepted"] == 1, WAIT)
            assert peer.drain("no.such.queue") == [b"nowhere"]
        finally:
            peer.close()


@pytest.mark.slow
def test_rabbit_killed_and_restarted_mid_stream_loses_nothing(
    zctx: Ctx, server: Server, rabbit: RabbitMQ, local: Client
) -> None:
    """kill -9 of RabbitMQ mid-stream both ways, then a restart: nothing lost, and a
    payload seen twice always has a flagged copy (resent / redelivered)."""
    peer = AmqpPeer(rabbit)
    peer.declare("rs.out", "rs.in")
    peer.close()
    rabbit.settle()  # the queues' definitions on RabbitMQ's disk (see RabbitMQ.settle)
    peer = AmqpPeer(rabbit)
    incoming = [f"i{i}".encode() for i in range(200)]
    for payload in incoming:
        peer.publish("rs.in", payload)
    peer.close()
    local.create_queue("sensors", 3, {"Status": "Push"})
    local.join("sensors")
    routes = (
        Route(Direction.OUT, "orders", 3, "rs.out"),
        Route(Direction.IN, "sensors", 3, "rs.in"),
    )
    copies: list[tuple[bytes, bool]] = []
    with make_bridge(zctx, server, rabbit, *routes, window=10) as bridge:
        sent = [f"o{i}".encode() for i in range(300)]
        for payload in sent[:150]:
            local.push("orders", 3, payload)
        assert wait_until(lambda: bridge.stats()["out_accepted"] >= 30, WAIT)
        assert wait_until(lambda: len(take(local, copies, 0.1)) >= 20, WAIT)
        rabbit.stop(signal.SIGKILL)  # kill -9 mid-stream, both directions in flight
        for payload in sent[150:]:
            local.push("orders", 3, payload)
        rabbit.start()
        assert wait_until(lambda: bridge.stats()["connects"] >= 2, RESTART_WAIT), bridge.stats()
        # redeliveries (duplicates) come too: read until every payload was seen
        assert wait_until(
            lambda: take(local, copies, 0.5) == set(incoming),
            RESTART_WAIT,
        ), sorted(set(incoming) - {p for p, _ in copies})[:10]
        assert wait_until(lambda: local.queue_info("orders", 3)["Acks"] == 300, RESTART_WAIT)
    assert not unflagged_duplicates(copies)
    peer = AmqpPeer(rabbit)
    try:
        got_out = peer.drain_flagged("rs.out")
        assert {p for p, _ in got_out} == set(sent)  # confirmed = on disk: all there
        assert not unflagged_duplicates(got_out)
    finally:
        peer.close()


def test_bridge_amqp_command_publishes_with_confirms_and_stops_on_sigterm(
    rabbit: RabbitMQ, local: Client, server: Server
) -> None:
    peer = AmqpPeer(rabbit)
    try:
        peer.declare("cli.out")
        assert server.endpoint is not None
        bridge = subprocess.Popen(
            [sys.executable, "-m", "broker", "bridge", "amqp", "--url", rabbit.url,
             "--connect", server.endpoint, "--map", "cli/1=cli.out"],
            stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            assert wait_until(lambda: _queue_ready(local, "cli", 1), WAIT)
            for i in range(10):
                local.push("cli", 1, f"c{i}".encode())
            assert wait_until(lambda: local.queue_info("cli", 1)["Acks"] == 10, WAIT)
            assert sorted(peer.drain("cli.out")) == sorted(f"c{i}".encode() for i in range(10))
            bridge.send_signal(signal.SIGTERM)
            assert bridge.wait(15) == 0
            assert bridge.stderr is not None and b"Traceback" not in bridge.stderr.read()
        finally:
            if bridge.poll() is None:
                bridge.kill()
                bridge.wait(10)
            if bridge.stderr is not None:
                bridge.stderr.close()
    finally:
        peer.close()


def _queue_ready(local: Client, channel: str, queue_id: int) -> bool:
    from broker.client.blocking import RemoteError

    try:
        return bool(local.queue_info(channel, queue_id)["RequestAcknowledge"])
    except RemoteError:
        return False
