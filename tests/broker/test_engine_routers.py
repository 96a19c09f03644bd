"""Routers: queue and direct bindings, distribute / only-first / round-robin, wire operations."""

from __future__ import annotations

from broker import tmqp
from broker.engine.router import DirectBinding, Interaction, QueueBinding, RouteMethod, Router
from broker.protocol import Header, MessageType, NackReason, QueueStatus, RouterOperation, header
from tests.broker.engine_kit import Kit, acks, queue_messages


def publish(
    kit: Kit,
    client: str,
    router: str,
    payload: bytes = b"r",
    *,
    ack: bool = False,
    response: bool = False,
    mid: str | None = None,
) -> str:
    mid = kit.mid() if mid is None else mid
    kit.send(
        client,
        tmqp.Frame(
            message_type=MessageType.ROUTER,
            target=router,
            message_id=mid,
            payload=payload,
            pending_ack=ack,
            pending_response=response,
        ),
    )
    return mid


def pull_queues(kit: Kit, producer: str, *queues: int) -> None:
    for qid in queues:
        kit.queue(producer, "ch", qid, status=QueueStatus.PULL)


def queued(kit: Kit, qid: int) -> int:
    return kit.engine.channels["ch"].queues[qid].message_count


def test_distribute_reaches_every_binding() -> None:
    kit = Kit()
    producer = kit.connect("p")
    worker = kit.connect("w", type="worker")
    pull_queues(kit, producer, 1, 2)
    router = kit.engine.add_router(Router("fanout", RouteMethod.DISTRIBUTE))
    router.add(QueueBinding("q1", "ch", 1))
    router.add(QueueBinding("q2", "ch", 2))
    router.add(DirectBinding("workers", "@type:worker", content_type=9))
    mid = publish(kit, producer, "fanout", b"all")
    assert (queued(kit, 1), queued(kit, 2)) == (1, 1)
    (direct,) = kit.take(worker)
    assert direct.message_type == MessageType.DIRECT and direct.content_type == 9
    assert direct.message_id != mid  # no interaction: a fresh id per binding
    assert direct.source == producer


def test_only_first_uses_the_highest_priority_and_fails_over() -> None:
    kit = Kit()
    producer = kit.connect("p")
    router = kit.engine.add_router(Router("primary", RouteMethod.ONLY_FIRST))
    router.add(DirectBinding("backup", "backup-client", priority=1))
    router.add(DirectBinding("main", "main-client", priority=10))
    main, backup = kit.connect("main-client"), kit.connect("backup-client")
    publish(kit, producer, "primary")
    assert (len(kit.take(main)), len(kit.take(backup))) == (1, 0)
    kit.disconnect(main)
    publish(kit, producer, "primary")
    assert len(kit.take(backup)) == 1


def test_round_robin_rotates_and_skips_failing_bindings() -> None:
    kit = Kit()
    producer = kit.connect("p")
    pull_queues(kit, producer, 1, 2)
    router = kit.engine.add_router(Router("rr", RouteMethod.ROUND_ROBIN))
    for qid in (1, 2):
        router.add(QueueBinding(f"q{qid}", "ch", qid))
    for _ in range(4):
        publish(kit, producer, "rr")
    assert (queued(kit, 1), queued(kit, 2)) == (2, 2)
    kit.update(producer, "ch", 2, Status="Stopped")
    for _ in range(2):
        publish(kit, producer, "rr")
    assert (queued(kit, 1), queued(kit, 2)) == (4, 0)


def test_ack_interaction_passes_the_queue_acknowledge_to_the_publisher() -> None:
    kit = Kit()
    producer = kit.connect("p")
    consumer = kit.connect("c")
    kit.queue(producer, "ch", 1, request_acknowledge=True)
    kit.join(consumer, "ch")
    router = kit.engine.add_router(Router("acked"))
    router.add(QueueBinding("q", "ch", 1, interaction=Interaction.ACKNOWLEDGE))
    mid = publish(kit, producer, "acked", ack=True)
    (delivered,) = queue_messages(kit.take(consumer))
    assert delivered.message_id == mid
    assert acks(kit.take(producer)) == []
    kit.ack(consumer, delivered)
    (ack,) = acks(kit.take(producer))
    assert ack.message_id == mid and ack.source == consumer


def test_response_interaction_lets_the_receiver_answer_the_publisher() -> None:
    kit = Kit()
    producer, service = kit.connect("p"), kit.connect("svc")
    router = kit.engine.add_router(Router("rpc"))
    router.add(DirectBinding("svc", "svc", interaction=Interaction.RESPONSE))
    mid = publish(kit, producer, "rpc", b"question", response=True)
    (request,) = kit.take(service)
    assert request.pending_response and request.message_id == mid
    kit.send(
        service,
        tmqp.Frame(
            message_type=MessageType.RESPONSE,
            target=request.source,
            message_id=request.message_id,
            payload=b"answer",
        ),
    )
    (reply,) = kit.take(producer)
    assert reply.payload == b"answer" and reply.message_id == mid


def test_server_acknowledges_when_no_binding_interacts() -> None:
    kit = Kit()
    producer = kit.connect("p")
    pull_queues(kit, producer, 1)
    kit.engine.add_router(Router("plain")).add(QueueBinding("q", "ch", 1))
    mid = publish(kit, producer, "plain", ack=True)
    (ack,) = acks(kit.take(producer))
    assert ack.message_id == mid and ack.content_type == 0


def test_no_route_and_unknown_router_are_reported() -> None:
    kit = Kit()
    producer = kit.connect("p")
    publish(kit, producer, "missing", ack=True)
    (nack,) = acks(kit.take(producer))
    assert header(nack, Header.NACK_REASON) == NackReason.NO_ROUTE
    kit.engine.add_router(Router("empty")).add(DirectBinding("x", "nobody"))
    publish(kit, producer, "empty", response=True)
    (reply,) = kit.take(producer)
    assert reply.message_type == MessageType.RESPONSE and reply.content_type == 404


def test_router_management_over_the_wire() -> None:
    kit = Kit()
    admin = kit.connect("admin")
    pull_queues(kit, admin, 1)
    kit.ok(admin, RouterOperation.ROUTER_CREATE, "r", payload={"Method": "OnlyFirst"})
    assert kit.op(admin, RouterOperation.ROUTER_CREATE, "r").content_type == 481
    binding = {"Name": "b1", "Type": "Queue", "Target": "ch", "Queue": 1, "Priority": 3}
    kit.ok(admin, RouterOperation.BINDING_ADD, "r", payload=binding)
    assert (
        kit.op(admin, RouterOperation.BINDING_ADD, "r", payload={"Name": "x"}).content_type == 400
    )
    (listed,) = kit.json(admin, RouterOperation.ROUTER_LIST)
    assert listed["Method"] == "OnlyFirst" and listed["Bindings"][0]["Priority"] == 3
    publish(kit, admin, "r")
    assert queued(kit, 1) == 1
    kit.ok(admin, RouterOperation.BINDING_REMOVE, "r", payload={"Name": "b1"})
    assert kit.json(admin, RouterOperation.BINDING_LIST, "r") == []
    kit.ok(admin, RouterOperation.ROUTER_REMOVE, "r")
    assert kit.op(admin, RouterOperation.ROUTER_REMOVE, "r").content_type == 404


def test_routers_from_the_broker_config() -> None:
    from broker.engine.options import BrokerConfig

    spec = {
        "Name": "cfg",
        "Method": "RoundRobin",
        "Bindings": [{"Name": "q", "Type": "Queue", "Target": "ch", "Queue": 3}],
    }
    kit = Kit(config=BrokerConfig(routers=(spec,)))
    producer = kit.connect("p")
    publish(kit, producer, "cfg")
    assert queued(kit, 3) == 1  # auto-created push queue without consumers keeps it
    assert kit.engine.routers["cfg"].method is RouteMethod.ROUND_ROBIN
