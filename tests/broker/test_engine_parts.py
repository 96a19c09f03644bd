"""The engine is one class that has its parts (issue 9), sharing their tables."""

from __future__ import annotations

from broker.engine import Engine
from broker.engine.channels import ChannelRegistry
from broker.engine.clients import ClientRegistry
from broker.engine.router import RouteMethod, Router, RouterTable
from broker.protocol import ConnectionInfo


def test_the_engine_is_composed_not_layered() -> None:
    assert Engine.__mro__ == (Engine, object)
    engine = Engine()
    assert isinstance(engine.channel_registry, ChannelRegistry)
    assert isinstance(engine.client_registry, ClientRegistry)
    assert isinstance(engine.router_table, RouterTable)


def test_the_parts_share_one_table_of_each_kind() -> None:
    engine = Engine()
    client_id, _ = engine.connect(ConnectionInfo(client_id="a"), 0.0)
    # the queues' host finds the client the client registry admitted
    assert engine.services.client(client_id) is engine.clients[client_id]
    assert engine.client_registry.clients is engine.clients
    engine.create_channel("c")
    engine.create_queue("c", 1)
    assert engine.channel_registry.channels is engine.channels
    assert engine.queue_count == 1 and engine.stats()["queues"] == 1
    engine.add_router(Router("r", RouteMethod.DISTRIBUTE))
    assert engine.parts.routers.routers is engine.routers and "r" in engine.routers
    engine.disconnect(client_id, 1.0)
    assert engine.services.client(client_id) is None
