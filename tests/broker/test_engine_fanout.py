"""The engine's side of broadcast fan-out (``broker.engine.fanout``), sans-IO."""

from __future__ import annotations

from typing import Any

from broker import tmqp
from broker.engine.fanout import Publish
from broker.fanout import FANOUT, FANOUT_TOKEN, TOKEN_SIZE, read_head
from broker.protocol import MessageType, Operation, QueueStatus, header
from tests.broker.engine_kit import Kit

CHANNEL = "news"


def _kit() -> Kit:
    kit = Kit()
    kit.engine.enable_fanout("tcp://127.0.0.1:5999")
    return kit


def _fan_join(kit: Kit, client: str) -> bytes:
    reply = kit.op(client, Operation.JOIN, CHANNEL, headers=((FANOUT, "1"),), response=True)
    assert reply.content_type == 0
    token = header(reply, FANOUT_TOKEN)
    assert token is not None
    return bytes.fromhex(token)


def _published(outs: list[Any]) -> list[tuple[bytes, int]]:
    return [read_head(o.client_id) for o in outs if isinstance(o, Publish)]


def test_a_member_gets_one_publish_per_message_and_no_copy_of_its_own() -> None:
    kit = _kit()
    producer, member, direct = kit.connect(), kit.connect(), kit.connect()
    kit.queue(producer, CHANNEL, 1, status=QueueStatus.BROADCAST)
    token = _fan_join(kit, member)
    kit.join(direct, CHANNEL)  # no fan-out asked: one by one
    outs: list[Any] = []
    for i in range(3):
        outs += kit.send(producer, _push_frame(kit, producer, str(i).encode()))
    assert _published(outs) == [(token, 1), (token, 2), (token, 3)]
    assert kit.payloads(direct) == [b"0", b"1", b"2"]
    assert kit.payloads(member) == []


def test_refused_topics_and_the_token_retired_with_the_last_member() -> None:
    kit = _kit()
    producer, a, b = kit.connect(), kit.connect(), kit.connect()
    kit.queue(producer, CHANNEL, 1, status=QueueStatus.BROADCAST)
    token = _fan_join(kit, a)
    assert _fan_join(kit, b) == token  # one stream per channel
    engine = kit.engine
    for topic in (b"", token[:1], token[:-1], token + b"x", bytes(TOKEN_SIZE)):
        assert engine.fanout_check(topic) is None
    assert engine.fanout_check(token) is not None
    kit.ok(a, Operation.LEAVE, CHANNEL)
    assert engine.fanout_check(token) is not None  # b still reads it
    kit.disconnect(b)
    assert engine.fanout_check(token) is None  # retired: an old SUB reads nothing new
    c = kit.connect()
    assert _fan_join(kit, c) != token


def test_a_queue_with_acknowledges_keeps_the_one_by_one_path() -> None:
    kit = _kit()
    producer, member = kit.connect(), kit.connect()
    kit.queue(producer, CHANNEL, 1, status=QueueStatus.BROADCAST, request_acknowledge=True)
    _fan_join(kit, member)
    outs = kit.send(producer, _push_frame(kit, producer, b"a"))
    assert _published(outs) == []
    assert kit.payloads(member) == [b"a"]


def test_a_join_without_fanout_ends_the_membership() -> None:
    """A client re-joining after a reconnect (no fan-out asked) gets every message one by
    one again: its membership would otherwise leave it with nothing."""
    kit = _kit()
    producer, member = kit.connect(), kit.connect()
    kit.queue(producer, CHANNEL, 1, status=QueueStatus.BROADCAST)
    _fan_join(kit, member)
    kit.join(member, CHANNEL)
    outs = kit.send(producer, _push_frame(kit, producer, b"a"))
    assert _published(outs) == []
    assert kit.payloads(member) == [b"a"]


def test_an_ack_answered_join_is_not_granted() -> None:
    """A grant must reach the client: a JOIN asking for fan-out but answered by an ACK
    (no headers) keeps the one-by-one path."""
    kit = _kit()
    producer, member = kit.connect(), kit.connect()
    kit.queue(producer, CHANNEL, 1, status=QueueStatus.BROADCAST)
    reply = kit.op(member, Operation.JOIN, CHANNEL, headers=((FANOUT, "1"),))
    assert reply.content_type == 0 and header(reply, FANOUT_TOKEN) is None
    kit.send(producer, _push_frame(kit, producer, b"a"))
    assert kit.payloads(member) == [b"a"]


def _push_frame(kit: Kit, producer: str, payload: bytes) -> tmqp.Frame:
    return tmqp.Frame(
        message_type=MessageType.QUEUE, content_type=1, target=CHANNEL,
        message_id=kit.mid(), source=producer, payload=payload,
    )  # fmt: skip


def test_a_message_asking_for_a_receipt_goes_one_by_one() -> None:
    """A receipt counts the consumers that received the message: a publish cannot."""
    kit = _kit()
    producer, member = kit.connect(), kit.connect()
    kit.queue(producer, CHANNEL, 1, status=QueueStatus.BROADCAST)
    _fan_join(kit, member)
    frame = _push_frame(kit, producer, b"a").replace(headers=(("Receipt", "ALL"),))
    outs = kit.send(producer, frame)
    assert _published(outs) == []
    assert kit.payloads(member) == [b"a"]
