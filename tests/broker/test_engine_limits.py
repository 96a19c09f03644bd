"""Every table a client can grow has a bound (broker.limits), and long lists come in pages."""

from __future__ import annotations

import json
from typing import Any

import pytest

from broker import tmqp
from broker.engine.errors import ClientRejected
from broker.engine.limits import Limits, LimitsError
from broker.engine.options import BrokerConfig
from broker.protocol import (
    EventName,
    Header,
    MessageType,
    Operation,
    QueueStatus,
    ResultCode,
    RouterOperation,
    header,
)
from tests.broker.engine_kit import Kit, acks

PULL = QueueStatus.PULL


def limited(**limits: Any) -> Kit:
    config = BrokerConfig(wall_clock=lambda: 1_700_000_000.0, limits=Limits(**limits))
    return Kit(config=config)


def stored(kit: Kit, channel: str, queue_id: int) -> int:
    queue = kit.engine.channels[channel].queues[queue_id]
    return queue.message_count


def last_ack(kit: Kit, client: str) -> tmqp.Frame:
    replies = acks(kit.take(client))
    assert replies, "no acknowledge"
    return replies[-1]


# ---------------------------------------------------------------------- CC


def test_a_queue_named_many_times_in_cc_gets_one_copy() -> None:
    # one 64 KiB frame with 8,191 "CC: other" headers used to become 8,192 messages
    kit = Kit()
    p = kit.connect("p")
    kit.queue(p, "main", 1, status=PULL)
    kit.queue(p, "o", 1, status=PULL)
    ccs = (*((Header.CC, "o") for _ in range(8190)), (Header.CC, "main;1"))
    assert len(tmqp.encode(tmqp.Frame(headers=ccs))[0]) <= 64 * 1024
    kit.push(p, "main", 1, b"once", ack=True, headers=ccs)
    assert last_ack(kit, p).headers == ()  # accepted
    assert stored(kit, "main", 1) == 1  # naming the target queue adds nothing
    assert stored(kit, "o", 1) == 1


def test_more_distinct_cc_queues_than_the_limit_refuse_the_push_whole() -> None:
    kit = limited(max_cc=3)
    p = kit.connect("p")
    kit.queue(p, "main", 1, status=PULL)
    for name in ("a", "b", "c", "d"):
        kit.queue(p, name, 1, status=PULL)
    three = tuple((Header.CC, n) for n in ("a", "b", "c", "a", "b"))
    kit.push(p, "main", 1, ack=True, headers=three)
    assert last_ack(kit, p).headers == ()
    four = (*three, (Header.CC, "d"))
    kit.push(p, "main", 1, ack=True, headers=four)
    refusal = last_ack(kit, p)
    assert header(refusal, Header.NACK_REASON) == "limit-exceeded"
    # all or nothing: no copy of the refused push anywhere
    assert [stored(kit, n, 1) for n in ("main", "a", "b", "c", "d")] == [1, 1, 1, 1, 0]


# ---------------------------------------------------------------------- creations


def test_channels_are_bounded_whichever_way_they_are_created() -> None:
    kit = limited(max_channels=3)
    p = kit.connect("p")
    kit.ok(p, Operation.CHANNEL_CREATE, "one")
    kit.join(p, "two")  # created on the fly by a join
    kit.push(p, "three", 1, ack=True)  # ... and by a push
    assert acks(kit.take(p))[-1].headers == ()
    assert kit.op(p, Operation.CHANNEL_CREATE, "four").content_type == ResultCode.LIMIT_EXCEEDED
    assert kit.op(p, Operation.JOIN, "five").content_type == ResultCode.LIMIT_EXCEEDED
    kit.push(p, "six", 1, ack=True)
    assert header(last_ack(kit, p), Header.NACK_REASON) == "limit-exceeded"
    assert sorted(kit.engine.channels) == ["one", "three", "two"]
    kit.ok(p, Operation.CHANNEL_DELETE, "one")  # room again
    kit.ok(p, Operation.CHANNEL_CREATE, "four")


def test_queues_are_bounded_per_channel_and_in_all() -> None:
    kit = limited(max_queues_per_channel=2, max_queues=3)
    p = kit.connect("p")
    kit.queue(p, "a", 1)
    kit.queue(p, "a", 2)
    third = kit.op(p, Operation.QUEUE_CREATE, "a", headers=((Header.QUEUE_ID, "3"),))
    assert third.content_type == ResultCode.LIMIT_EXCEEDED
    kit.queue(p, "b", 1)
    fourth = kit.op(p, Operation.QUEUE_CREATE, "b", headers=((Header.QUEUE_ID, "2"),))
    assert fourth.content_type == ResultCode.LIMIT_EXCEEDED
    # a channel's own QueueLimit may only be lower
    kit.ok(p, Operation.CHANNEL_CREATE, "c", payload={"QueueLimit": 50})
    kit.ok(p, Operation.QUEUE_DELETE, "b", headers=((Header.QUEUE_ID, "1"),))
    kit.queue(p, "c", 1)
    kit.ok(p, Operation.CHANNEL_DELETE, "a")  # its two queues are counted out
    kit.queue(p, "c", 2)
    over = kit.op(p, Operation.QUEUE_CREATE, "c", headers=((Header.QUEUE_ID, "3"),))
    assert over.content_type == ResultCode.LIMIT_EXCEEDED


def test_a_queue_holds_at_most_the_broker_message_limit() -> None:
    kit = limited(max_queue_messages=2)
    p = kit.connect("p")
    kit.queue(p, "q", 1, status=PULL, message_limit=0)  # 0: "no limit of its own"
    for _ in range(3):
        kit.push(p, "q", 1, ack=True)
    replies = acks(kit.take(p))
    assert [header(r, Header.NACK_REASON) for r in replies] == [None, None, "limit-exceeded"]
    assert stored(kit, "q", 1) == 2


def test_clients_are_bounded() -> None:
    kit = limited(max_clients=2)
    kit.connect("a")
    kit.connect("b")
    with pytest.raises(ClientRejected) as info:
        kit.connect("c")
    assert info.value.code == ResultCode.LIMIT_EXCEEDED
    kit.disconnect("a")
    kit.connect("c")


def test_joined_channels_and_event_subscriptions_are_bounded_per_client() -> None:
    kit = limited(max_joined_channels=2, max_event_subscriptions=2)
    p = kit.connect("p")
    kit.join(p, "a")
    kit.join(p, "b")
    kit.join(p, "a")  # joining again is no new membership
    assert kit.op(p, Operation.JOIN, "c").content_type == ResultCode.LIMIT_EXCEEDED
    other = kit.connect("other")
    kit.join(other, "c")  # the bound is per client

    def subscribe(name: str, channel: str = "") -> tmqp.Frame:
        headers = ((Header.CHANNEL_NAME, channel),) if channel else ()
        frame = tmqp.Frame(message_type=MessageType.EVENT, content_type=1, target=name,
                           message_id=kit.mid(), pending_ack=True, headers=headers)  # fmt: skip
        kit.send(p, frame)
        return last_ack(kit, p)

    assert subscribe(EventName.CLIENT_JOINED, "a").content_type == 0
    assert subscribe(EventName.CLIENT_JOINED, "b").content_type == 0
    assert subscribe(EventName.CLIENT_JOINED, "a").content_type == 0  # held already
    assert subscribe(EventName.CLIENT_LEFT).content_type == ResultCode.LIMIT_EXCEEDED


def test_routers_and_bindings_are_bounded() -> None:
    kit = limited(max_routers=1, max_bindings_per_router=1)
    p = kit.connect("p")
    kit.ok(p, RouterOperation.ROUTER_CREATE, "r1", payload={"Method": "Distribute"})
    second = kit.op(p, RouterOperation.ROUTER_CREATE, "r2", payload={"Method": "Distribute"})
    assert second.content_type == ResultCode.LIMIT_EXCEEDED
    binding = {"Name": "b1", "Type": "Queue", "Target": "ch", "Queue": 1}
    kit.ok(p, RouterOperation.BINDING_ADD, "r1", payload=binding)
    more = kit.op(p, RouterOperation.BINDING_ADD, "r1", payload=dict(binding, Name="b2"))
    assert more.content_type == ResultCode.LIMIT_EXCEEDED


@pytest.mark.parametrize(
    "table",
    [{"max_channels": 0}, {"max_cc": -1}, {"max_clients": "many"}, {"max_cc": True},
     {"nonsense": 3}, {"max_reply_size": 100}],
)  # fmt: skip
def test_bad_limits_are_refused(table: dict[str, Any]) -> None:
    with pytest.raises(LimitsError):
        Limits.from_mapping(table)


# ---------------------------------------------------------------------- pages


def gather(kit: Kit, client: str, operation: int, target: str = "") -> tuple[list[Any], int]:
    """Every page of a list; and how many pages it took (each reply checked to fit)."""
    items: list[Any] = []
    after: str | None = None
    pages = 0
    budget = kit.engine.config.limits.max_reply_size
    while True:
        headers = ((Header.PAGE_AFTER, after),) if after is not None else ()
        reply = kit.op(client, operation, target, headers=headers, response=True)
        assert reply.content_type == 0
        assert len(reply.payload) <= budget
        items += json.loads(reply.payload)
        pages += 1
        after = header(reply, Header.PAGE_NEXT)
        if after is None:
            return items, pages


def test_long_lists_come_in_pages_that_fit_the_budget() -> None:
    kit = limited(max_reply_size=4096)
    p = kit.connect("p")
    names = [f"channel-{i:04d}" for i in range(300)]
    for name in names:
        kit.ok(p, Operation.CHANNEL_CREATE, name)
    channels, pages = gather(kit, p, Operation.CHANNEL_LIST)
    assert [c["Name"] for c in channels] == names and pages > 10
    for qid in range(0, 600, 2):
        kit.queue(p, "channel-0000", qid)
    queues, pages = gather(kit, p, Operation.QUEUE_LIST, "channel-0000")
    assert [q["Id"] for q in queues] == list(range(0, 600, 2)) and pages > 1
    for i in range(100):
        kit.connect(f"client-{i:03d}")
    clients, pages = gather(kit, p, Operation.CLIENT_LIST)
    assert len(clients) == 101 and pages > 1


def test_a_page_boundary_survives_changes_between_pages() -> None:
    kit = limited(max_reply_size=4096)
    p = kit.connect("p")
    for i in range(100):
        kit.ok(p, Operation.CHANNEL_CREATE, f"c{i:03d}")
    first = kit.op(p, Operation.CHANNEL_LIST, response=True)
    after = header(first, Header.PAGE_NEXT)
    assert after is not None
    seen = [c["Name"] for c in json.loads(first.payload)]
    kit.ok(p, Operation.CHANNEL_DELETE, seen[0])  # removed before the next page
    kit.ok(p, Operation.CHANNEL_DELETE, after)  # even the page's own last key
    rest = kit.op(p, Operation.CHANNEL_LIST, headers=((Header.PAGE_AFTER, after),),
                  response=True)  # fmt: skip
    nxt = [c["Name"] for c in json.loads(rest.payload)]
    assert nxt[0] == f"c{len(seen):03d}"  # nothing skipped, nothing repeated


def test_a_bad_page_key_is_a_bad_request() -> None:
    kit = Kit()
    p = kit.connect("p")
    kit.queue(p, "ch", 1)
    reply = kit.op(p, Operation.QUEUE_LIST, "ch", headers=((Header.PAGE_AFTER, "x"),),
                   response=True)  # fmt: skip
    assert reply.content_type == ResultCode.BAD_REQUEST


def test_statistics_come_in_pages_too() -> None:
    kit = limited(max_reply_size=4096)
    p = kit.connect("p")
    for i in range(200):
        kit.queue(p, f"s{i:03d}", 1)
    page, more = kit.engine.stats_page(None, 4096)
    assert more is not None and page["channels"] == 200 and page["queues"] == 200
    assert len(json.dumps(page, separators=(",", ":"))) <= 4096
    listed = [c["name"] for c in page["channel_list"]]  # type: ignore[union-attr]
    while more is not None:
        page, more = kit.engine.stats_page(more, 4096)
        assert len(json.dumps(page, separators=(",", ":"))) <= 4096
        listed += [c["name"] for c in page["channel_list"]]  # type: ignore[union-attr]
    assert listed == [f"s{i:03d}" for i in range(200)]


def test_a_broker_cycling_page_cursors_is_refused_not_followed_forever() -> None:
    """A hostile broker answering A, B, A, ... must not keep a client gathering forever."""
    from broker.client.admin import next_page
    from broker.client.errors import ClientError

    request = tmqp.Frame(message_type=MessageType.SERVER, content_type=1, message_id="r0")

    def reply(cursor: str) -> tmqp.Frame:
        return tmqp.Frame(message_type=MessageType.RESPONSE, headers=((Header.PAGE_NEXT, cursor),))

    seen: set[str] = set()
    first = next_page(request, reply("a"), "r1", seen)
    assert first is not None and ("Page-After", "a") in first.headers
    second = next_page(first, reply("b"), "r2", seen)
    assert second is not None and ("Page-After", "b") in second.headers
    with pytest.raises(ClientError, match="again"):
        next_page(second, reply("a"), "r3", seen)  # the old guard only compared with "b"
    end = tmqp.Frame(message_type=MessageType.RESPONSE)
    assert next_page(second, end, "r4", set()) is None
