"""The statistics' ``client_list`` (``Engine.stats``): who is connected, in which
channels, with how many deliveries unacknowledged or unsent; at most
``Limits.max_listed_clients`` rows, oldest connection first (fake clock, no sockets)."""

from __future__ import annotations

from typing import Any

from broker.engine.limits import Limits
from broker.engine.options import BrokerConfig
from broker.protocol import QueueStatus
from tests.broker.engine_kit import Kit, queue_messages


def rows(kit: Kit) -> dict[str, dict[str, Any]]:
    listed: list[dict[str, Any]] = kit.engine.stats()["client_list"]  # type: ignore[assignment]
    return {row["Id"]: row for row in listed}


def test_each_client_with_its_channels_unacked_and_unsent_deliveries() -> None:
    kit = Kit(auto_transmit=False)
    producer = kit.connect("producer", name="orders-app", type="web")
    kit.queue(producer, "work", 1, status=QueueStatus.ROUND_ROBIN, request_acknowledge=True)
    kit.queue(producer, "news", 2, status=QueueStatus.PUSH)
    kit.now += 5
    a, b = kit.connect("a"), kit.connect("b")
    for name in (a, b):
        kit.join(name, "work")
    kit.join(a, "news")
    for i in range(3):
        kit.push(producer, "work", 1, f"job {i}".encode())
    kit.push(producer, "news", 2, b"hello")

    seen = rows(kit)
    assert seen[producer] == {
        "Id": producer,
        "Name": "orders-app",
        "Type": "web",
        "ConnectedAt": 100.0,
        "Channels": [],
        "Unacked": 0,
        "Unsent": 0,
    }
    assert seen[a]["ConnectedAt"] == 105.0 and seen[a]["Name"] is None
    assert seen[a]["Channels"] == ["work", "news"]  # join order
    # round robin: a has jobs 0 and 2, b job 1; the news copy needs no acknowledge
    assert (seen[a]["Unacked"], seen[a]["Unsent"]) == (2, 3)
    assert (seen[b]["Unacked"], seen[b]["Unsent"]) == (1, 1)

    kit.transmit(a)
    kit.transmit(b)
    seen = rows(kit)
    assert (seen[a]["Unacked"], seen[a]["Unsent"]) == (2, 0)
    delivered = [m for m in queue_messages(kit.take(a)) if m.pending_ack]
    kit.ack(a, delivered[0])
    assert rows(kit)[a]["Unacked"] == 1

    kit.disconnect(a)  # gone: not listed; what it held went to b
    seen = rows(kit)
    assert a not in seen
    kit.transmit(b)
    assert seen[b]["Unacked"] == 2


def test_the_list_holds_the_oldest_clients_up_to_the_limit() -> None:
    config = BrokerConfig(wall_clock=lambda: 1_700_000_000.0, limits=Limits(max_listed_clients=3))
    kit = Kit(config=config)
    ids = []
    for i in range(50):
        ids.append(kit.connect(f"c{i:02}"))
        kit.now += 1
    stats = kit.engine.stats()
    assert stats["clients"] == 50
    assert list(rows(kit)) == ids[:3]
    kit.disconnect(ids[1])
    assert list(rows(kit)) == [ids[0], ids[2], ids[3]]
    assert Limits().max_listed_clients == 500  # the documented default
