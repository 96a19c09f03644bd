"""Event subscriptions and event messages."""

from __future__ import annotations

import json
from typing import Any

from broker import tmqp
from broker.protocol import EventName, Header, MessageType, Operation, ResultCode, header
from tests.broker.engine_kit import Kit


def subscribe(
    kit: Kit,
    client: str,
    name: str,
    *,
    on: bool = True,
    channel: str | None = None,
    queue: int | None = None,
) -> tmqp.Frame:
    headers: list[tuple[str, str]] = []
    if channel is not None:
        headers.append((Header.CHANNEL_NAME, channel))
    if queue is not None:
        headers.append((Header.QUEUE_ID, str(queue)))
    mid = kit.mid()
    kit.send(
        client,
        tmqp.Frame(
            message_type=MessageType.EVENT,
            target=name,
            content_type=1 if on else 0,
            message_id=mid,
            headers=tuple(headers),
            pending_ack=True,
        ),
    )
    (ack,) = [f for f in kit.take(client) if f.message_id == mid]
    return ack


def events(kit: Kit, client: str) -> list[tuple[str, dict[str, Any], tmqp.Frame]]:
    return [
        (f.target, json.loads(f.payload), f)
        for f in kit.take(client)
        if f.message_type == MessageType.EVENT
    ]


def test_client_connected_and_disconnected() -> None:
    kit = Kit()
    watcher = kit.connect("watcher")
    assert subscribe(kit, watcher, EventName.CLIENT_CONNECTED).content_type == 0
    subscribe(kit, watcher, EventName.CLIENT_DISCONNECTED)
    kit.connect("newbie", name="N", type="T")
    kit.disconnect("newbie")
    got = events(kit, watcher)
    assert [(name, model) for name, model, _ in got] == [
        ("ClientConnected", {"Id": "newbie", "Name": "N", "Type": "T"}),
        ("ClientDisconnected", {"Id": "newbie", "Name": "N", "Type": "T"}),
    ]
    frame = got[0][2]
    assert frame.source == "ClientConnected" and frame.content_type == 0


def test_channel_filtered_join_and_leave_events() -> None:
    kit = Kit()
    watcher = kit.connect("watcher")
    subscribe(kit, watcher, EventName.CLIENT_JOINED, channel="a")
    subscribe(kit, watcher, EventName.CLIENT_LEFT)
    c = kit.connect("c", name="cn")
    kit.join(c, "a")
    kit.join(c, "b")
    kit.ok(c, Operation.LEAVE, "b")
    got = [(name, model) for name, model, _ in events(kit, watcher)]
    assert got == [
        (
            "ClientJoined",
            {"Channel": "a", "ClientId": "c", "ClientName": "cn", "ClientType": None},
        ),
        ("ClientLeft", {"Channel": "b", "ClientId": "c", "ClientName": "cn", "ClientType": None}),
    ]
    kit.disconnect(c)  # leaves "a" too
    assert [name for name, _, _ in events(kit, watcher)] == ["ClientLeft"]


def test_channel_and_queue_lifecycle_events() -> None:
    kit = Kit()
    watcher = kit.connect("watcher")
    for name in (
        "ChannelCreated",
        "ChannelRemoved",
        "QueueCreated",
        "QueueUpdated",
        "QueueRemoved",
    ):
        subscribe(kit, watcher, name)
    admin = kit.connect("admin")
    kit.ok(admin, Operation.CHANNEL_CREATE, "ch", payload={"ClientLimit": 5})
    kit.queue(admin, "ch", 7, tag="orders")
    kit.update(admin, "ch", 7, Status="Pull")
    kit.ok(admin, Operation.QUEUE_DELETE, "ch", headers=((Header.QUEUE_ID, "7"),))
    kit.ok(admin, Operation.CHANNEL_DELETE, "ch")
    got = events(kit, watcher)
    assert [name for name, _, _ in got] == [
        "ChannelCreated",
        "QueueCreated",
        "QueueUpdated",
        "QueueRemoved",
        "ChannelRemoved",
    ]
    assert got[0][1] == {"Name": "ch", "ActiveClient": 0, "ClientLimit": 5}
    assert got[2][1]["Status"] == "Pull" and got[2][1]["Tag"] == "orders"
    queue_frame = got[1][2]
    assert header(queue_frame, Header.CHANNEL_NAME) == "ch"
    assert header(queue_frame, Header.QUEUE_ID) == "7"
    assert queue_frame.content_type == 7


def test_message_produced_only_for_the_subscribed_queue() -> None:
    kit = Kit()
    watcher = kit.connect("watcher")
    subscribe(kit, watcher, EventName.MESSAGE_PRODUCED, channel="ch", queue=2)
    producer = kit.connect("p", name="prod")
    kit.push(producer, "ch", 1, b"not watched")
    mid = kit.push(producer, "ch", 2, b"watched")
    ((name, model, frame),) = events(kit, watcher)
    assert name == "MessageProduced"
    assert model == {
        "Channel": "ch",
        "Queue": 2,
        "Id": mid,
        "Saved": False,
        "ProducerId": "p",
        "ProducerName": "prod",
        "ProducerType": None,
    }
    assert header(frame, Header.CHANNEL_NAME) == "ch" and frame.content_type == 2


def test_unsubscribe_stops_events() -> None:
    kit = Kit()
    watcher = kit.connect("watcher")
    subscribe(kit, watcher, EventName.CLIENT_CONNECTED)
    subscribe(kit, watcher, EventName.CLIENT_CONNECTED, on=False)
    kit.connect("x")
    assert events(kit, watcher) == []


def test_bad_subscriptions_are_refused() -> None:
    kit = Kit()
    watcher = kit.connect("watcher")
    ack = subscribe(kit, watcher, "NoSuchEvent")
    assert ack.content_type == ResultCode.NOT_FOUND
    assert header(ack, Header.NACK_REASON) is not None
    ack = subscribe(kit, watcher, EventName.MESSAGE_PRODUCED, channel="c", queue=70000)
    assert ack.content_type == ResultCode.BAD_REQUEST


def test_disconnect_drops_subscriptions() -> None:
    kit = Kit()
    watcher = kit.connect("watcher")
    subscribe(kit, watcher, EventName.CLIENT_CONNECTED)
    kit.disconnect(watcher)
    kit.connect("x")
    assert kit.take(watcher) == []
    assert not kit.engine.events.has(EventName.CLIENT_CONNECTED)
