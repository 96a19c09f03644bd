"""Authorization: tokens at connect, a hook per operation, and what refusals look like."""

from __future__ import annotations

import pytest

from broker import tmqp
from broker.engine.auth import ALL_ACTIONS, Action, TokenAuthorizer
from broker.engine.engine import ClientRejected
from broker.protocol import (
    ConnectionInfo,
    EventName,
    Header,
    MessageType,
    NackReason,
    NoContent,
    Operation,
    QueueStatus,
    ResultCode,
    header,
)
from tests.broker.engine_kit import Kit, acks

CONSUMER = {Action.JOIN, Action.PULL, Action.QUEUE_LIST, Action.CHANNEL_LIST}
PRODUCER = {Action.PUSH, Action.CHANNEL_CREATE, Action.QUEUE_CREATE}


def secured() -> Kit:
    auth = TokenAuthorizer(
        {"admin": ALL_ACTIONS, "prod": PRODUCER, "cons": CONSUMER},
        anonymous={Action.DIRECT},
    )
    return Kit(authorizer=auth)


def test_unknown_token_and_duplicate_id_are_rejected_at_connect() -> None:
    kit = secured()
    with pytest.raises(ClientRejected) as bad:
        kit.engine.connect(ConnectionInfo(client_id="x", token="Bearer wrong"), kit.now)
    assert bad.value.code == ResultCode.UNAUTHORIZED
    kit.connect("x", token="Bearer prod")
    with pytest.raises(ClientRejected) as dup:
        kit.engine.connect(ConnectionInfo(client_id="x", token="prod"), kit.now)
    assert dup.value.code == ResultCode.ALREADY_CREATED
    with pytest.raises(ClientRejected) as invalid:
        kit.engine.connect(ConnectionInfo(client_id="@name:x"), kit.now)
    assert invalid.value.code == ResultCode.BAD_REQUEST


def test_require_token_refuses_anonymous_clients() -> None:
    kit = Kit(authorizer=TokenAuthorizer({"t": ALL_ACTIONS}, require_token=True))
    with pytest.raises(ClientRejected):
        kit.engine.connect(ConnectionInfo(), kit.now)
    assert kit.connect(token="t")


def test_push_needs_the_push_action() -> None:
    kit = secured()
    consumer = kit.connect("c", token="cons")
    producer = kit.connect("p", token="prod")
    kit.push(consumer, "ch", 1, ack=True)
    (nack,) = acks(kit.take(consumer))
    assert header(nack, Header.NACK_REASON) == NackReason.UNAUTHORIZED
    kit.push(producer, "ch", 1, ack=True)
    assert header(acks(kit.take(producer))[0], Header.NACK_REASON) is None


def test_join_pull_and_admin_operations_are_checked() -> None:
    kit = secured()
    producer = kit.connect("p", token="prod")
    consumer = kit.connect("c", token="cons")
    admin = kit.connect("a", token="admin")
    kit.queue(producer, "ch", 1, status=QueueStatus.PULL)
    kit.push(producer, "ch", 1, b"x")
    assert kit.op(producer, Operation.JOIN, "ch").content_type == ResultCode.UNAUTHORIZED
    kit.join(consumer, "ch")
    got = kit.pull(consumer, "ch", 1)
    assert [f.payload for f in got if not header(f, Header.NO_CONTENT)] == [b"x"]
    assert kit.op(producer, Operation.CLIENT_LIST, response=True).content_type == 401
    assert len(kit.json(admin, Operation.CLIENT_LIST)) == 3
    assert kit.op(consumer, Operation.CHANNEL_DELETE, "ch").content_type == 401
    update = kit.update(consumer, "ch", 1, Status="Push")
    assert update.content_type == 401 and header(update, Header.NACK_REASON) == "unauthorized"


def test_pull_without_the_pull_action_is_unauthorized() -> None:
    auth = TokenAuthorizer({"t": ALL_ACTIONS - {Action.PULL}})
    kit = Kit(authorizer=auth)
    c = kit.connect("c", token="t")
    kit.queue(c, "ch", 1, status=QueueStatus.PULL)
    kit.join(c, "ch")
    markers = [header(f, Header.NO_CONTENT) for f in kit.pull(c, "ch", 1)]
    assert markers == [NoContent.UNAUTHORIZED, NoContent.END]


def test_events_and_direct_messages_are_checked() -> None:
    kit = secured()
    anon = kit.connect("anon")
    other = kit.connect("other")
    mid = kit.mid()
    kit.send(
        anon,
        tmqp.Frame(
            message_type=MessageType.EVENT,
            target=EventName.CLIENT_CONNECTED,
            content_type=1,
            message_id=mid,
            pending_ack=True,
        ),
    )
    (ack,) = kit.take(anon)
    assert ack.content_type == ResultCode.UNAUTHORIZED
    kit.send(anon, tmqp.Frame(message_type=MessageType.DIRECT, target=other, payload=b"ok"))
    assert [f.payload for f in kit.take(other)] == [b"ok"]
    producer = kit.connect("p", token="prod")
    kit.send(
        producer,
        tmqp.Frame(
            message_type=MessageType.DIRECT, target=other, message_id="d", pending_response=True
        ),
    )
    (reply,) = kit.take(producer)
    assert reply.content_type == ResultCode.UNAUTHORIZED


def test_channel_patterns_limit_a_token() -> None:
    auth = TokenAuthorizer(
        {"t": {Action.PUSH, Action.CHANNEL_CREATE, Action.QUEUE_CREATE}},
        channels={"t": ["orders.*"]},
    )
    kit = Kit(authorizer=auth)
    p = kit.connect("p", token="t")
    kit.push(p, "orders.eu", 1, ack=True)
    kit.push(p, "billing", 1, ack=True)
    reasons = [header(a, Header.NACK_REASON) for a in acks(kit.take(p))]
    assert reasons == [None, NackReason.UNAUTHORIZED]
