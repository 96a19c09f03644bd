"""The console's live overview lists the broker's connected clients (``/api/status``,
``broker.client_list``): who, from where, since when, in which channels, with how many
deliveries unacknowledged; at most ``Limits.max_listed_clients``, ``clients_more``
counting the rest."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import zmq

from broker.client.blocking import Client
from broker.engine.limits import Limits
from tests.polling import wait_until
from zerohub.config import BrokerConfig, ConsoleConfig, FilesConfig, HubConfig, PublishConfig
from zerohub.hub import Hub, HubEndpoints, build


def broker_status(console: str) -> dict[str, Any]:
    with urllib.request.urlopen(console + "/api/status", timeout=30) as answer:
        status: dict[str, Any] = json.loads(answer.read())
    return dict(status["broker"])


def row_of(console: str, client_id: str | None) -> dict[str, Any] | None:
    rows = [c for c in broker_status(console)["client_list"] if c["id"] == client_id]
    return rows[0] if rows else None


def test_status_lists_connected_clients_with_their_channels_and_unacked(
    hub: tuple[Hub, HubEndpoints, Path], zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    _hub, endpoints, _tmp = hub
    console = endpoints.http["console"]
    consumer = Client(
        endpoints.broker, context=zctx, timeout=10, name="<i>worker</i>", client_type="billing"
    ).connect()
    producer = Client(endpoints.broker, context=zctx, timeout=10).connect()
    try:
        consumer.create_queue("orders", 1, {"Status": 1, "RequestAcknowledge": True})
        consumer.join("orders")
        for i in range(2):
            producer.push("orders", 1, f"order {i}".encode())
        first, second = consumer.receive(timeout=10), consumer.receive(timeout=10)
        assert first is not None and second is not None and first.needs_ack

        assert wait_until(lambda: (row_of(console, consumer.client_id) or {}).get("unacked") == 2)
        row = row_of(console, consumer.client_id)
        assert row is not None
        assert row["name"] == "<i>worker</i>" and row["type"] == "billing"
        assert row["address"] == "127.0.0.1"
        assert row["channels"] == ["orders"]
        assert row["unsent"] == 0
        assert 0 <= row["connected_s"] < 600
        other = row_of(console, producer.client_id)
        assert other is not None and other["channels"] == [] and other["unacked"] == 0
        assert other["name"] is None and other["type"] is None
        status = broker_status(console)
        assert status["clients_more"] == 0
        assert status["clients"] == len(status["client_list"]) >= 2

        consumer.ack(first)
        assert wait_until(lambda: (row_of(console, consumer.client_id) or {}).get("unacked") == 1)
    finally:
        consumer.close()
        producer.close()
    # a client that went away leaves the list
    assert wait_until(lambda: row_of(console, consumer.client_id) is None)
    assert wait_until(lambda: row_of(console, producer.client_id) is None)


def test_the_client_list_is_cut_at_its_limit_and_says_how_many_more(
    tmp_path: Path, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    public = tmp_path / "public"
    public.mkdir()
    config = HubConfig(
        files=FilesConfig(
            bind="tcp://127.0.0.1:*", publish=(PublishConfig(public, "/"),), state=False
        ),
        broker=BrokerConfig(bind="tcp://127.0.0.1:*"),
        limits=Limits(max_listed_clients=2),
        console=ConsoleConfig(enabled=True, address="127.0.0.1:0"),
    )
    the_hub = build(config, zctx)
    endpoints = the_hub.start()
    clients: list[Client] = []
    try:
        console = endpoints.http["console"]
        for _ in range(5):
            clients.append(Client(endpoints.broker, context=zctx, timeout=10).connect())
        ids = [c.client_id for c in clients]

        assert wait_until(lambda: broker_status(console)["clients"] >= 5)
        status = broker_status(console)
        listed = [c["id"] for c in status["client_list"]]
        assert len(listed) == 2  # the bound, though 5 or more are connected
        assert status["clients_more"] == status["clients"] - 2 >= 3
        assert listed == ids[:2]  # oldest connections first
    finally:
        for c in clients:
            c.close()
        the_hub.stop()
