"""TMQP JOIN's ``Selector`` and ``Credit`` headers and pushes' ``Retain`` header on the
sans-IO engine (``broker.engine.join_rules``, ``broker.engine.retain``): expected values
worked out by hand; the real server and clients: ``test_join_rules_serve.py``."""

from __future__ import annotations

import pytest

from broker.engine.delivery import PerMessageDeliveryHandler
from broker.engine.per_message import PER_MESSAGE
from broker.protocol import Header, MessageType, Operation, QueueStatus, ResultCode, header
from tests.broker.engine_kit import Frame, Kit, queue_messages


def ruled_kit() -> tuple[Kit, str]:
    """A kit whose engine has the per-message handler, and a producer."""
    kit = Kit(handlers={PER_MESSAGE: PerMessageDeliveryHandler(lambda: 1_700_000_000.0)})
    return kit, kit.connect("producer")


def make_queue(kit: Kit, producer: str, status: QueueStatus, *, handler: bool = True) -> None:
    kit.queue(
        producer,
        "ch",
        1,
        status=status,
        request_acknowledge=status is not QueueStatus.BROADCAST,
        message_delivery_handler=PER_MESSAGE if handler else None,
    )


def join(kit: Kit, client: str, *headers: tuple[str, str]) -> Frame:
    return kit.op(client, Operation.JOIN, "ch", headers=tuple(headers))


def payloads(kit: Kit, client: str) -> list[bytes]:
    return [bytes(f.payload) for f in queue_messages(kit.take(client))]


def push(kit: Kit, producer: str, kind: str, priority: int = 0) -> None:
    headers = (("kind", kind), ("priority", str(priority)))
    kit.push(producer, "ch", 1, f"{kind}{priority}".encode(), headers=headers)


# -- selectors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "rest_gets"),
    [
        (QueueStatus.ROUND_ROBIN, [b"us9", b"eu1"]),  # one consumer each: the others
        (QueueStatus.PUSH, [b"eu9", b"us9", b"eu1", b"eu7"]),  # a copy each: all
    ],
)
def test_a_selector_joined_with_offers_only_what_it_selects(
    status: QueueStatus, rest_gets: list[bytes]
) -> None:
    kit, producer = ruled_kit()
    make_queue(kit, producer, status)
    eu, rest = kit.connect("eu"), kit.connect("rest")
    assert join(kit, eu, (Header.SELECTOR, "kind = 'eu' AND priority > 5")).content_type == 0
    kit.join(rest, "ch")
    for kind, priority in (("eu", 9), ("us", 9), ("eu", 1), ("eu", 7)):
        push(kit, producer, kind, priority)
    assert payloads(kit, eu) == [b"eu9", b"eu7"]
    assert payloads(kit, rest) == rest_gets


def test_on_a_broadcast_queue_a_selector_filters_that_clients_copies() -> None:
    kit, producer = ruled_kit()
    make_queue(kit, producer, QueueStatus.BROADCAST)
    picky, everyone = kit.connect("picky"), kit.connect("everyone")
    assert join(kit, picky, (Header.SELECTOR, "kind IN ('a', 'c')")).content_type == 0
    kit.join(everyone, "ch")
    for kind in "abc":
        push(kit, producer, kind)
    assert payloads(kit, picky) == [b"a0", b"c0"]
    assert payloads(kit, everyone) == [b"a0", b"b0", b"c0"]


@pytest.mark.parametrize(
    ("selector", "reason"),
    [
        ("kind = = 'a'", "unexpected"),
        ("(" * 65 + "a = 1" + ")" * 65, "nested deeper than 64"),
        ("a = '" + "x" * 100 * 1024 + "'", "longer than 4096"),
        ("'unterminated", "unexpected"),
    ],
)
def test_a_bad_selector_refuses_the_join_with_the_parsers_reason(
    selector: str, reason: str
) -> None:
    kit, producer = ruled_kit()
    make_queue(kit, producer, QueueStatus.ROUND_ROBIN)
    client = kit.connect("client")
    reply = join(kit, client, (Header.SELECTOR, selector))
    assert reply.content_type == ResultCode.BAD_REQUEST
    assert reason in (header(reply, Header.NACK_REASON) or "") + (header(reply, "Reason") or "")
    assert client not in kit.engine.channels["ch"].consumers  # nothing joined
    push(kit, producer, "a")
    assert payloads(kit, client) == []
    assert join(kit, client).content_type == 0  # the engine goes on serving it
    assert payloads(kit, client) == [b"a0"]


def test_a_selector_on_a_queue_without_the_per_message_handler_is_refused() -> None:
    kit, producer = ruled_kit()
    make_queue(kit, producer, QueueStatus.ROUND_ROBIN, handler=False)
    client = kit.connect("client")
    reply = join(kit, client, (Header.SELECTOR, "kind = 'a'"))
    assert reply.content_type == ResultCode.UNACCEPTABLE
    assert client not in kit.engine.channels["ch"].consumers


def test_without_the_per_message_handler_registered_rules_are_refused() -> None:
    kit = Kit()
    producer = kit.connect("producer")
    kit.queue(producer, "ch", 1, status=QueueStatus.ROUND_ROBIN)
    reply = join(kit, kit.connect("c"), (Header.CREDIT, "1,0"))
    assert reply.content_type == ResultCode.UNACCEPTABLE


def test_leaving_ends_the_selector_and_a_plain_join_of_a_member_removes_it() -> None:
    kit, producer = ruled_kit()
    make_queue(kit, producer, QueueStatus.ROUND_ROBIN)
    client = kit.connect("client")
    join(kit, client, (Header.SELECTOR, "kind = 'a'"))
    push(kit, producer, "b")
    assert payloads(kit, client) == []
    kit.ok(client, Operation.LEAVE, "ch")
    kit.join(client, "ch")  # no selector now: the waiting "b" comes
    assert payloads(kit, client) == [b"b0"]
    join(kit, client, (Header.SELECTOR, "kind = 'a'"))  # a member: selector set again
    push(kit, producer, "b")
    assert payloads(kit, client) == []
    assert join(kit, client).content_type == 0  # a member's plain JOIN: removed
    assert payloads(kit, client) == [b"b0"]


# -- credit ---------------------------------------------------------------------------------


def test_credit_counts_unacknowledged_deliveries_and_acks_give_it_back() -> None:
    kit, producer = ruled_kit()
    make_queue(kit, producer, QueueStatus.ROUND_ROBIN)
    slow, other = kit.connect("slow"), kit.connect("other")
    assert join(kit, slow, (Header.CREDIT, "2,0")).content_type == 0
    for i in range(2):
        push(kit, producer, "m", i)
    held = queue_messages(kit.take(slow))
    assert [bytes(f.payload) for f in held] == [b"m0", b"m1"]
    kit.join(other, "ch")
    for i in range(2, 6):
        push(kit, producer, "m", i)
    assert payloads(kit, slow) == []  # out of credit: the other one is served
    assert payloads(kit, other) == [b"m2", b"m3", b"m4", b"m5"]
    kit.ok(other, Operation.LEAVE, "ch")
    push(kit, producer, "m", 6)
    assert payloads(kit, slow) == []
    kit.ack(slow, held[0])  # one back: one more
    assert payloads(kit, slow) == [b"m6"]


def test_the_size_window_alone_opens_while_above_zero() -> None:
    kit, producer = ruled_kit()
    make_queue(kit, producer, QueueStatus.ROUND_ROBIN)
    client = kit.connect("client")
    assert join(kit, client, (Header.CREDIT, "0,5")).content_type == 0
    for i in range(3):
        kit.push(producer, "ch", 1, b"abc%d" % i)  # 4 octets each
    # 5 > 0: the first goes (1 left), 1 > 0: the second (-3 left), then closed
    assert payloads(kit, client) == [b"abc0", b"abc1"]


@pytest.mark.parametrize(
    "credit",
    ["0,0", "-1,5", "5", "a,b", "1,2,3", "", "99999999999999999999,1", "9223372036854775808,0"],
)
def test_nonsense_credit_is_refused_and_nothing_joined(credit: str) -> None:
    kit, producer = ruled_kit()
    make_queue(kit, producer, QueueStatus.ROUND_ROBIN)
    client = kit.connect("client")
    reply = join(kit, client, (Header.CREDIT, credit))
    assert reply.content_type == ResultCode.BAD_REQUEST
    assert client not in kit.engine.channels["ch"].consumers


def test_huge_credit_is_bounded_by_the_brokers_max_prefetch() -> None:
    kit, producer = ruled_kit()
    make_queue(kit, producer, QueueStatus.ROUND_ROBIN)
    client = kit.connect("client")
    most = 9223372036854775807
    assert join(kit, client, (Header.CREDIT, f"{most},{most}")).content_type == 0
    config = kit.engine.config
    assert kit.engine.clients[client].prefetch["ch"] == config.max_prefetch


# -- retained messages ------------------------------------------------------------------------


def retain(kit: Kit, producer: str, payload: bytes, wish: str) -> None:
    kit.push(producer, "ch", 1, payload, headers=((Header.RETAIN, wish),))


def refused(kit: Kit, producer: str, wish: str) -> str | None:
    """Push with ``Retain: wish`` waiting for its acknowledge: the nack's reason token."""
    kit.push(producer, "ch", 1, b"x", ack=True, headers=((Header.RETAIN, wish),))
    (answer,) = [f for f in kit.take(producer) if f.message_type == MessageType.ACK]
    return header(answer, Header.NACK_REASON)


def test_a_retained_message_replaced_many_times_reaches_a_later_joiner_first_once() -> None:
    kit, producer = ruled_kit()
    kit.queue(producer, "ch", 1, status=QueueStatus.BROADCAST)
    for i in range(1000):
        retain(kit, producer, b"v%d" % i, "set")
    assert len(kit.engine.channel_registry.retained) == 1
    late = kit.connect("late")
    kit.join(late, "ch")
    (got,) = queue_messages(kit.take(late))
    assert bytes(got.payload) == b"v999" and not got.pending_ack
    assert header(got, Header.RETAIN) == "set"
    kit.push(producer, "ch", 1, b"live")
    assert payloads(kit, late) == [b"live"]
    kit.join(late, "ch")  # a member joining again: not sent again
    assert payloads(kit, late) == []
    retain(kit, producer, b"", "remove")
    later = kit.connect("later")
    kit.join(later, "ch")
    assert payloads(kit, later) == []


def test_a_retained_message_a_joiners_selector_refuses_is_not_sent_it() -> None:
    kit, producer = ruled_kit()
    make_queue(kit, producer, QueueStatus.BROADCAST)
    kit.push(producer, "ch", 1, b"b", headers=((Header.RETAIN, "set"), ("kind", "b")))
    picky, plain = kit.connect("picky"), kit.connect("plain")
    join(kit, picky, (Header.SELECTOR, "kind = 'a'"))
    kit.join(plain, "ch")
    assert payloads(kit, picky) == []
    assert payloads(kit, plain) == [b"b"]


@pytest.mark.parametrize("status", [QueueStatus.ROUND_ROBIN, QueueStatus.PUSH, QueueStatus.PULL])
def test_retain_on_a_queue_that_is_not_broadcast_is_refused(status: QueueStatus) -> None:
    kit, producer = ruled_kit()
    kit.queue(producer, "ch", 1, status=status)
    assert refused(kit, producer, "set") == "unacceptable"
    assert len(kit.engine.channel_registry.retained) == 0
    assert kit.info(producer, "ch", 1)["Messages"] == 0  # refused: not queued either


def test_a_bad_retain_value_is_refused() -> None:
    kit, producer = ruled_kit()
    kit.queue(producer, "ch", 1, status=QueueStatus.BROADCAST)
    assert refused(kit, producer, "keep") == "bad-request"
    assert len(kit.engine.channel_registry.retained) == 0


def test_a_removed_channel_takes_its_retained_message_with_it() -> None:
    kit, producer = ruled_kit()
    kit.queue(producer, "ch", 1, status=QueueStatus.BROADCAST)
    retain(kit, producer, b"x", "set")
    kit.ok(producer, Operation.CHANNEL_DELETE, "ch")
    assert len(kit.engine.channel_registry.retained) == 0


def test_a_retained_message_keeps_its_producer_hidden_where_the_queue_hides_names() -> None:
    kit, producer = ruled_kit()
    kit.queue(producer, "ch", 1, status=QueueStatus.BROADCAST, hide_client_names=True)
    retain(kit, producer, b"x", "set")
    late = kit.connect("late")
    kit.join(late, "ch")
    (got,) = queue_messages(kit.take(late))
    assert bytes(got.payload) == b"x" and got.source == ""
