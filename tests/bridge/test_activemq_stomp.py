"""The STOMP bridge against a real ActiveMQ (Debian ``activemq`` 5.17, started by the
fixture with ``java -jar``, no systemd): both ways, client-individual acks end to end.

Slow: the JVM broker takes ~5-20 s to listen on a loaded 2-core machine.  Skipped, with
the reason, where the package is not installed (``.ci/run`` does not install it: see
docs/bridges.md).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from broker.bridge.config import Direction, Route, Settings, parse_url
from broker.bridge.runner import Bridge
from broker.client.blocking import Client
from broker.server.server import Server
from tests.bridge.peers import ActiveMQ
from tests.polling import wait_until

pytest.importorskip("stomp", reason="stomp.py not installed ([bridges])")
import stomp

from broker.bridge.connectors.stomp import StompConnector

Ctx = zmq.Context[zmq.Socket[bytes]]
WAIT = 30.0

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def activemq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ActiveMQ]:
    broker = ActiveMQ(tmp_path_factory.mktemp("activemq"))
    broker.start()
    yield broker
    broker.stop()


class StompPeer:
    """The test's own stomp.py connection to ActiveMQ: send with receipts, read a queue."""

    def __init__(self, activemq: ActiveMQ) -> None:
        self.got: list[bytes] = []
        self.lock = threading.Lock()
        self.conn = stomp.Connection12([("127.0.0.1", activemq.stomp_port)], auto_decode=False)
        peer = self

        class Listener(stomp.ConnectionListener):  # type: ignore[misc]
            def on_message(self, frame: Any) -> None:
                with peer.lock:
                    peer.got.append(bytes(frame.body))

        self.conn.set_listener("peer", Listener())
        self.conn.connect(wait=True, headers={"host": "localhost"})

    def send(self, destination: str, payload: bytes) -> None:
        self.conn.send(destination, payload, headers={"persistent": "true"})

    def read(self, destination: str) -> None:
        self.conn.subscribe(destination, id="peer-read", ack="auto")

    def taken(self) -> list[bytes]:
        with self.lock:
            return list(self.got)

    def close(self) -> None:
        if self.conn.is_connected():
            self.conn.disconnect()


def make_bridge(zctx: Ctx, server: Server, activemq: ActiveMQ, *routes: Route) -> Bridge:
    settings = Settings(routes=routes, backoff=(0.1, 1.0), window=10)
    connector = StompConnector(
        parse_url(activemq.stomp_url, "stomp"), settings.routes_of(Direction.IN),
        window=settings.window,
    )  # fmt: skip
    assert server.endpoint is not None
    return Bridge(
        settings, connector, server.endpoint, context=zctx, client_options={"timeout": 5.0}
    )


def test_stomp_bridge_round_trips_through_activemq_acked_both_ways(
    zctx: Ctx, server: Server, activemq: ActiveMQ, local: Client
) -> None:
    routes = (
        Route(Direction.OUT, "orders", 1, "/queue/amq.out"),
        Route(Direction.IN, "sensors", 2, "/queue/amq.in"),
    )
    peer = StompPeer(activemq)
    try:
        local.create_queue("sensors", 2, {"Status": "Push"})
        local.join("sensors")
        with make_bridge(zctx, server, activemq, *routes) as bridge:
            out = {f"o{i}".encode() for i in range(50)}
            for payload in sorted(out):
                local.push("orders", 1, payload)
            # acknowledged locally only once ActiveMQ's RECEIPT came
            assert wait_until(lambda: bridge.stats()["out_accepted"] == 50, WAIT), bridge.stats()
            assert wait_until(lambda: local.queue_info("orders", 1)["Acks"] == 50, WAIT)
            peer.read("/queue/amq.out")
            assert wait_until(lambda: len(peer.taken()) >= 50, WAIT)
            assert sorted(peer.taken()) == sorted(out)
            incoming = {f"i{i}".encode() for i in range(50)}
            for payload in sorted(incoming):
                peer.send("/queue/amq.in", payload)
            got: list[bytes] = []

            def taken() -> set[bytes]:
                for m in local.consume(timeout=0.2):
                    got.append(bytes(m.payload))
                    local.ack(m)
                return set(got)

            assert wait_until(lambda: taken() == incoming, WAIT)
            assert wait_until(lambda: bridge.stats()["in_accepted"] == 50, WAIT)
            assert len(got) == 50  # no copies: nothing was redelivered
    finally:
        peer.close()


def test_a_message_activemq_redelivers_arrives_flagged(
    zctx: Ctx, server: Server, activemq: ActiveMQ, local: Client
) -> None:
    """Another consumer took three messages (client-individual) and went away without
    acknowledging them: ActiveMQ hands them out again with ``redelivered:true``, and the
    bridge pushes them locally with ``Bridge-Redelivered: true`` (the only inbound
    copies that may be duplicates)."""
    peer = StompPeer(activemq)
    first = stomp.Connection12([("127.0.0.1", activemq.stomp_port)], auto_decode=False)
    seen: list[bytes] = []

    class Taker(stomp.ConnectionListener):  # type: ignore[misc]
        def on_message(self, frame: Any) -> None:
            seen.append(bytes(frame.body))

    try:
        for i in range(3):
            peer.send("/queue/amq.again", f"a{i}".encode())
        first.set_listener("taker", Taker())
        first.connect(wait=True, headers={"host": "localhost"})
        first.subscribe("/queue/amq.again", id="taker", ack="client-individual")
        assert wait_until(lambda: len(seen) == 3, WAIT)
        first.disconnect()  # none acknowledged: ActiveMQ keeps them for the next consumer
        local.create_queue("again", 1, {"Status": "Push"})
        local.join("again")
        route = Route(Direction.IN, "again", 1, "/queue/amq.again")
        got: list[tuple[bytes, str | None]] = []

        def taken() -> int:
            for m in local.consume(timeout=0.2):
                got.append((bytes(m.payload), m.header("Bridge-Redelivered")))
                local.ack(m)
            return len(got)

        with make_bridge(zctx, server, activemq, route):
            assert wait_until(lambda: taken() >= 3, WAIT)
        assert sorted(got) == [(f"a{i}".encode(), "true") for i in range(3)]
    finally:
        if first.is_connected():
            first.disconnect()
        peer.close()
