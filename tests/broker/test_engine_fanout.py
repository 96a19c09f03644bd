"""The engine's side of broadcast fan-out (``broker.engine.fanout``), sans-IO."""

from __future__ import annotations

from typing import Any

import pytest

import broker.engine.fanout as fanout_module
from broker import tmqp
from broker.engine.fanout import HOLD_BEATS, Publish
from broker.fanout import (
    FANOUT,
    FANOUT_SEQ,
    FANOUT_TICKET,
    FANOUT_TOKEN,
    ROTATED,
    SOURCE,
    TOKEN_SIZE,
    VERSION,
    read_head,
)
from broker.protocol import Header, MessageType, Operation, QueueStatus, header
from tests.broker.engine_kit import Kit

CHANNEL = "news"


def _kit() -> Kit:
    kit = Kit()
    kit.engine.enable_fanout("tcp://127.0.0.1:5999")
    return kit


_tickets: dict[tuple[int, str], bytes] = {}


def _fan_join(kit: Kit, client: str) -> bytes:
    """JOIN asking for fan-out; the stream token (the member's ticket: ``_ticket``)."""
    reply = kit.op(client, Operation.JOIN, CHANNEL, headers=((FANOUT, VERSION),), response=True)
    assert reply.content_type == 0
    token, ticket = header(reply, FANOUT_TOKEN), header(reply, FANOUT_TICKET)
    assert token is not None and ticket is not None
    _tickets[id(kit), client] = bytes.fromhex(ticket)
    return bytes.fromhex(token)


def _ticket(kit: Kit, client: str) -> bytes:
    return _tickets[id(kit), client]


def _claim(kit: Kit, ticket: bytes) -> tuple[bytes, list[Any]]:
    claim = kit.engine.fanout_claim(ticket)
    assert claim is not None
    return claim


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
    ticket = _ticket(kit, a)
    # only a ticket is applied (as the token): never the token itself, a prefix, a guess
    for topic in (b"", token, ticket[:1], ticket[:-1], ticket + b"x", bytes(TOKEN_SIZE)):
        assert engine.fanout_claim(topic) is None
    applied, outs = _claim(kit, ticket)
    assert applied == token
    assert _published(outs) == [(token, 0)]  # the marker: nothing published yet
    kit.ok(a, Operation.LEAVE, CHANNEL)
    assert engine.fanout_claim(ticket) is None  # the leaver's ticket is void at once
    kit.disconnect(b)
    assert engine.fanout_claim(_ticket(kit, b)) is None  # retired with the last member
    c = kit.connect()
    assert _fan_join(kit, c) != token


def _rotation(kit: Kit, client: str) -> tuple[bytes, bytes, int]:
    """The (token, ticket, last number) of the one token change ``client`` was told."""
    news = [f for f in kit.take(client) if f.content_type == ROTATED]
    assert len(news) == 1
    frame = news[0]
    assert frame.message_type == MessageType.DIRECT and frame.source == SOURCE
    assert header(frame, Header.CHANNEL_NAME) == CHANNEL
    token, ticket, seq = (header(frame, h) for h in (FANOUT_TOKEN, FANOUT_TICKET, FANOUT_SEQ))
    assert token is not None and ticket is not None and seq is not None
    return bytes.fromhex(token), bytes.fromhex(ticket), int(seq)


def _push(kit: Kit, producer: str, *payloads: bytes) -> list[Any]:
    outs: list[Any] = []
    for payload in payloads:
        outs += kit.send(producer, _push_frame(kit, producer, payload))
    return outs


def test_a_leave_replaces_the_token_and_holds_the_stream_until_the_others_claimed() -> None:
    """The adversary: a member that leaves keeps its SUB (subscribed to the old token).
    Nothing published after the leave carries that token; the others get the new one
    and lose nothing: what is pushed meanwhile is numbered on and held until they
    claimed it, then published in order behind their marker."""
    kit = _kit()
    producer, leaver, b, c = kit.connect(), kit.connect(), kit.connect(), kit.connect()
    kit.queue(producer, CHANNEL, 1, status=QueueStatus.BROADCAST)
    old = _fan_join(kit, leaver)
    for m in (leaver, b, c):
        _fan_join(kit, m)
        _claim(kit, _ticket(kit, m))
    assert _published(_push(kit, producer, b"0", b"1")) == [(old, 1), (old, 2)]
    kit.ok(leaver, Operation.LEAVE, CHANNEL)
    assert kit.take(leaver) == []  # the leaver is told nothing
    new_b, ticket_b, seq_b = _rotation(kit, b)
    new_c, ticket_c, seq_c = _rotation(kit, c)
    assert new_b == new_c != old and seq_b == seq_c == 2 and ticket_b != ticket_c
    assert _published(_push(kit, producer, b"2", b"3")) == []  # held
    applied, outs = _claim(kit, ticket_b)
    assert applied == new_b and _published(outs) == [(new_b, 2)]  # c still to claim
    assert _published(_push(kit, producer, b"4")) == []
    applied, outs = _claim(kit, ticket_c)
    assert applied == new_c
    assert _published(outs) == [(new_c, 2), (new_c, 3), (new_c, 4), (new_c, 5)]
    assert [o.frame.payload for o in outs if o.frame is not None] == [b"2", b"3", b"4"]
    assert _published(_push(kit, producer, b"5")) == [(new_c, 6)]
    assert all(token != old for token, _ in _published(kit.engine.fanout_beat()))


def test_a_session_end_replaces_the_token_too() -> None:
    kit = _kit()
    producer, gone, stays = kit.connect(), kit.connect(), kit.connect()
    kit.queue(producer, CHANNEL, 1, status=QueueStatus.BROADCAST)
    old = _fan_join(kit, gone)
    _fan_join(kit, stays)
    kit.disconnect(gone)
    new, ticket, seq = _rotation(kit, stays)
    assert new != old and seq == 0
    assert kit.engine.fanout_claim(_ticket(kit, gone)) is None
    assert _claim(kit, ticket)[0] == new


def test_a_hold_lets_go_after_its_beats_or_its_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """A member that never claims the new token cannot stall the others for long: the
    hold ends after HOLD_BEATS server beats (or HOLD_MAX messages); what it held is
    published in order (the late member sees those as a reported gap)."""
    kit = _kit()
    producer, leaver, idle = kit.connect(), kit.connect(), kit.connect()
    kit.queue(producer, CHANNEL, 1, status=QueueStatus.BROADCAST)
    _fan_join(kit, leaver)
    _fan_join(kit, idle)
    kit.ok(leaver, Operation.LEAVE, CHANNEL)
    new, _ticket_idle, _ = _rotation(kit, idle)
    assert _published(_push(kit, producer, b"a", b"b")) == []
    engine = kit.engine
    for _ in range(HOLD_BEATS - 1):
        assert _published(engine.fanout_beat()) == []  # no marker: nothing sent yet
    assert _published(engine.fanout_beat()) == [(new, 1), (new, 2), (new, 2)]
    # a second leave with nobody claiming: HOLD_MAX messages end it
    other = kit.connect()
    _fan_join(kit, other)
    kit.ok(other, Operation.LEAVE, CHANNEL)
    newer, _, seq = _rotation(kit, idle)
    assert seq == 2
    limit = 50  # (HOLD_MAX, 10,000, made small: the kit encodes every frame it routes)
    monkeypatch.setattr(fanout_module, "HOLD_MAX", limit)
    assert _published(_push(kit, producer, *[b"x"] * (limit - 1))) == []
    published = _published(_push(kit, producer, b"x"))
    assert published == [(newer, n) for n in range(3, 3 + limit)]


@pytest.mark.parametrize("version", ["1", "2"])
def test_an_older_version_join_is_served_one_by_one(version: str) -> None:
    """An older client asks ``Fanout: 1`` (two frames a publish, no tickets) or
    ``Fanout: 2`` (one delivery a publish, session 8): its join is answered without a
    grant and it gets every message over its own socket."""
    kit = _kit()
    producer, old = kit.connect(), kit.connect()
    kit.queue(producer, CHANNEL, 1, status=QueueStatus.BROADCAST)
    reply = kit.op(old, Operation.JOIN, CHANNEL, headers=((FANOUT, version),), response=True)
    assert reply.content_type == 0 and header(reply, FANOUT_TOKEN) is None
    assert _published(_push(kit, producer, b"a")) == []
    assert kit.payloads(old) == [b"a"]


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
    reply = kit.op(member, Operation.JOIN, CHANNEL, headers=((FANOUT, VERSION),))
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
