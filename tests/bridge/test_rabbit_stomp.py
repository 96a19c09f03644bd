"""The STOMP bridge against a real rabbitmq-server (``rabbitmq_stomp``): both ways,
client-individual acks end to end, and a kill -9 and restart of RabbitMQ mid-stream.

At-least-once: nothing may be lost, and every duplicate must be a flagged copy (the
bridge's ``zerohub-resent`` on what it published again, RabbitMQ's ``redelivered`` turned
into ``Bridge-Redelivered`` on what it delivered again).
"""

from __future__ import annotations

import signal
from collections import Counter
from typing import Any

import pytest
import zmq

from broker.bridge.config import Direction, Route, Settings, parse_url
from broker.bridge.runner import Bridge
from broker.client.blocking import Client, Message
from broker.server.server import Server
from tests.bridge.amqp_peer import AmqpPeer
from tests.bridge.peers import RabbitMQ
from tests.polling import wait_until

pytest.importorskip("stomp", reason="stomp.py not installed ([bridges])")
from broker.bridge.connectors.stomp import StompConnector

Ctx = zmq.Context[zmq.Socket[bytes]]
WAIT = 30.0
RESTART_WAIT = 90.0  # a RabbitMQ node takes ~10 s to boot on a loaded 2-core machine


def make_bridge(zctx: Ctx, server: Server, rabbit: RabbitMQ, *routes: Route, **kw: Any) -> Bridge:
    settings = Settings(routes=routes, backoff=(0.1, 1.0), **kw)
    connector = StompConnector(
        parse_url(rabbit.stomp_url, "stomp"), settings.routes_of(Direction.IN),
        window=settings.window,
    )  # fmt: skip
    assert server.endpoint is not None
    return Bridge(
        settings, connector, server.endpoint, context=zctx, client_options={"timeout": 5.0}
    )


def unflagged_duplicates(copies: list[tuple[bytes, bool]]) -> list[bytes]:
    """Payloads seen more than once without a flag on all but one copy."""
    plain = Counter(payload for payload, flagged in copies if not flagged)
    return sorted(p for p, n in plain.items() if n > 1)


def take(local: Client, into: list[tuple[bytes, bool]], timeout: float) -> set[bytes]:
    """Read (and acknowledge) what the local consumer gets within ``timeout``; the
    distinct payloads taken so far."""
    for m in local.consume(timeout=timeout):
        into.append((bytes(m.payload), _redelivered(m)))
        local.ack(m)
    return {p for p, _ in into}


def _redelivered(m: Message) -> bool:
    return (m.header("Bridge-Redelivered") or "") == "true"


def test_stomp_bridge_round_trips_through_rabbitmq_acked_both_ways(
    zctx: Ctx, server: Server, rabbit: RabbitMQ, local: Client
) -> None:
    peer = AmqpPeer(rabbit)
    try:
        local.create_queue("sensors", 2, {"Status": "Push"})
        local.join("sensors")
        routes = (
            Route(Direction.OUT, "orders", 1, "/queue/st.out"),
            Route(Direction.IN, "sensors", 2, "/queue/st.in"),
        )
        incoming = {f"i{i}".encode() for i in range(100)}
        with make_bridge(zctx, server, rabbit, *routes, window=10) as bridge:
            out = {f"o{i}".encode() for i in range(100)}
            for payload in sorted(out):
                local.push("orders", 1, payload)
            # acknowledged locally only once RabbitMQ's RECEIPT came (its confirm)
            assert wait_until(lambda: bridge.stats()["out_accepted"] == 100, WAIT)
            assert wait_until(lambda: local.queue_info("orders", 1)["Acks"] == 100, WAIT)
            got_out = peer.drain_flagged("st.out")
            assert {p for p, _ in got_out} == out and len(got_out) == 100
            for payload in sorted(incoming):
                peer.publish("st.in", payload)
            copies: list[tuple[bytes, bool]] = []
            assert wait_until(lambda: take(local, copies, 0.2) == incoming, WAIT)
            assert wait_until(lambda: bridge.stats()["in_accepted"] == 100, WAIT)
        # the bridge is gone: anything it took but had not ACKed would be ready again
        assert peer.depth("st.in") == 0
        assert not unflagged_duplicates(copies)
    finally:
        peer.close()


def test_stomp_bridge_leaves_unaccepted_remote_messages_on_rabbitmq(
    zctx: Ctx, server: Server, rabbit: RabbitMQ, local: Client
) -> None:
    """A message the local broker refuses is never ACKed on RabbitMQ (client-individual):
    when the bridge goes away it is ready there again, none lost."""
    peer = AmqpPeer(rabbit)
    try:
        # a queue the local broker refuses every push into (payloads over its size limit)
        local.create_queue("full", 1, {"Status": "Push", "MessageSizeLimit": 1})
        peer.declare("st.refused")  # the SUBSCRIBE's declare may come after the publish
        route = Route(Direction.IN, "full", 1, "/queue/st.refused")
        with make_bridge(zctx, server, rabbit, route, window=5) as bridge:
            assert wait_until(lambda: bridge.stats()["connects"] >= 1, WAIT)
            for i in range(5):
                peer.publish("st.refused", f"r{i}".encode())
            assert wait_until(lambda: bridge.stats()["in_refused"] >= 5, WAIT), bridge.stats()
            assert bridge.stats()["in_accepted"] == 0
        assert wait_until(lambda: peer.depth("st.refused") == 5, WAIT)
    finally:
        peer.close()


@pytest.mark.slow
def test_rabbit_killed_and_restarted_mid_stream_stomp_loses_nothing(
    zctx: Ctx, server: Server, rabbit: RabbitMQ, local: Client
) -> None:
    """kill -9 of RabbitMQ with both directions in flight, then a restart: every message
    arrives, and a payload seen twice always has a flagged copy.

    The queues are declared first and the node restarted gracefully: RabbitMQ confirms
    (so RECEIPTs) messages into a queue declared just before whose definition may not
    be on its disk yet, and a kill -9 then loses the queue with them
    (``RabbitMQ.settle``).  What it guarantees is tested: a confirmed persistent message
    in a durable queue whose definition is on disk survives."""
    peer = AmqpPeer(rabbit)
    peer.declare("rs.st.out", "rs.st.in")  # durable, as RabbitMQ's STOMP declares them
    peer.close()
    rabbit.settle()
    peer = AmqpPeer(rabbit)
    incoming = [f"i{i}".encode() for i in range(200)]
    try:
        local.create_queue("sensors", 3, {"Status": "Push"})
        local.join("sensors")
        routes = (
            Route(Direction.OUT, "orders", 3, "/queue/rs.st.out"),
            Route(Direction.IN, "sensors", 3, "/queue/rs.st.in"),
        )
        copies: list[tuple[bytes, bool]] = []
        with make_bridge(zctx, server, rabbit, *routes, window=10) as bridge:
            assert wait_until(lambda: bridge.stats()["connects"] >= 1, WAIT)
            for payload in incoming:
                peer.publish("rs.st.in", payload)
            peer.close()
            sent = [f"o{i}".encode() for i in range(300)]
            for payload in sent[:150]:
                local.push("orders", 3, payload)
            assert wait_until(lambda: bridge.stats()["out_accepted"] >= 30, WAIT)
            assert wait_until(lambda: len(take(local, copies, 0.1)) >= 20, WAIT)
            rabbit.stop(signal.SIGKILL)  # kill -9 mid-stream, both directions in flight
            for payload in sent[150:]:
                local.push("orders", 3, payload)
            rabbit.start()
            assert wait_until(lambda: bridge.stats()["connects"] >= 2, RESTART_WAIT), (
                bridge.stats()
            )
            assert wait_until(
                lambda: take(local, copies, 0.5) == set(incoming),
                RESTART_WAIT,
            ), sorted(set(incoming) - {p for p, _ in copies})[:10]
            assert wait_until(lambda: local.queue_info("orders", 3)["Acks"] == 300, RESTART_WAIT)
        assert not unflagged_duplicates(copies)
        peer = AmqpPeer(rabbit)
        got_out = peer.drain_flagged("rs.st.out")
        # receipted = confirmed = on disk (in a queue whose definition is on disk)
        missing = sorted(set(sent) - {p for p, _ in got_out}, key=lambda p: int(p[1:]))
        assert not missing, missing
        assert not unflagged_duplicates(got_out)
        assert peer.depth("rs.st.in") == 0
    finally:
        peer.close()
