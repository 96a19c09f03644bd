"""Channel-name patterns (``broker.engine.patterns``) and TMQP pattern joins on the
sans-IO engine: match vectors worked out by hand, hostile patterns refused, joins of
existing and new channels, authorization, limits, leave and the push refusal."""

from __future__ import annotations

import dataclasses
import random
import re

import pytest

from broker.engine.auth import Action, Authorizer
from broker.engine.channels import Client
from broker.engine.errors import PatternError
from broker.engine.limits import Limits
from broker.engine.options import BrokerConfig
from broker.engine.patterns import ChannelPattern, PatternJoin, PatternJoins, parse
from broker.protocol import Header, MessageType, Operation, QueueStatus, ResultCode, header
from tests.broker.engine_kit import Frame, Kit, acks, queue_messages

PATTERN = ((Header.PATTERN, "yes"),)


class NoSecrets(Authorizer):
    """Everything but joining a channel whose name starts with ``secret``."""

    def allows(
        self,
        client: Client,
        action: Action,
        channel: str | None = None,
        queue: int | None = None,
        target: str | None = None,
    ) -> bool:
        return not (action is Action.JOIN and (channel or "").startswith("secret"))


@pytest.mark.parametrize(
    ("pattern", "name", "expected"),
    [
        ("orders.*", "orders.eu", True),
        ("orders.*", "orders", False),
        ("orders.*", "orders.eu.paris", False),
        ("orders.**", "orders", True),  # '**' is zero segments too
        ("orders.**", "orders.eu.paris", True),
        ("orders.**", "ordersx.eu", False),
        ("**", "anything.at.all", True),
        ("**.paris", "orders.eu.paris", True),
        ("**.paris", "paris", True),
        ("**.paris", "orders.paris.eu", False),
        ("a.**.b.**.c", "a.x.b.y.z.c", True),
        ("a.**.b.**.c", "a.b.c", True),
        ("a.**.b.**.c", "a.c.b", False),
        ("ord*.eu", "orders.eu", True),  # '*' inside a segment: any characters of it
        ("ord*.eu", "ord.eu", True),
        ("ord*.eu", "xorders.eu", False),
        ("item{[0-9]+}", "item42", True),
        ("item{[0-9]+}", "item4x", False),  # a regex matches the whole rest of the segment
        ("{[0-9]{2}}.x", "12.x", True),  # nested braces: one regex
        ("{[0-9]{2}}.x", "123.x", False),
        ("{a.b}", "a.b", False),  # a regex never spans a '.': one segment
        ("{a.b}", "axb", True),
        ("{eu|us}.*", "us.1", True),
        ("{(?:eu|us)-[0-9]+x?}", "eu-12x", True),  # '(?:' holds no repetition operator
        ("{(?:eu|us)-[0-9]+x?}", "us-", False),
        ("orders.eu", "orders.eu", True),  # no syntax: the name itself
        ("orders.eu", "orders.us", False),
        ("a+b.c", "a+b.c", True),  # other characters stand for themselves
        ("a+b.c", "aab.c", False),
    ],
)
def test_pattern_matches(pattern: str, name: str, expected: bool) -> None:
    assert parse(pattern).matches(name) is expected


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("", "empty pattern"),
        ("a..b", "empty segment"),
        (".a", "empty segment"),
        ("a.{x", "unbalanced"),
        ("a.x}", "unbalanced"),
        ("a.{}", "empty"),
        ("a.{[0-9}", "unbalanced '['"),
        ("a.{(}", "bad regex"),
        ("a." + "x" * 300, "longer than 255"),
        ("{" + "a" * 65 + "}", "longer than 64"),
        ("{(a+)+b}", "repeated group"),  # the catastrophic form
        ("{(a|aa)*}", "repeated group"),
        ("{(?:a*)*}", "repeated group"),
        ("{a*a*a*b}", "more than 2 repetition"),
        ("{a{1,9}b{1,9}c{1,9}}", "more than 2 repetition"),
        ("{a|b|c|d|e|f}", "more than 4"),
        ("{(a)\\1}", "back-references"),
        ("{(?P<x>a)(?P=x)}", "only (?: groups"),
        ("{(?=a)a}", "only (?: groups"),
        ("{[a-z}", "unbalanced '['"),
    ],
)
def test_bad_patterns_are_refused_with_a_reason(pattern: str, why: str) -> None:
    with pytest.raises(PatternError, match=re.escape(why)) as refused:
        parse(pattern)
    assert refused.value.code == ResultCode.BAD_REQUEST


def test_a_class_may_hold_what_would_be_syntax_outside_it() -> None:
    pattern = parse("{[]*+?|(){}]+}")
    assert pattern.matches("*+?|(){}]") and not pattern.matches("a")


def test_many_double_stars_against_a_long_name_stay_polynomial() -> None:
    """The table match tries each (segment, name segment) pair once: 40 ``**`` against
    120 segments that nearly match answer (a backtracking matcher would explore
    C(160, 40) splits).  The answers are worked out by hand: the last segment decides."""
    pattern = parse(".".join(["**", "a"] * 40) + ".b")
    assert pattern.matches(".".join(["a"] * 120) + ".b")
    assert not pattern.matches(".".join(["a"] * 120) + ".c")


def test_a_door_may_narrow_the_literal_characters() -> None:
    letters = re.compile(r"[a-z]")
    assert isinstance(parse("ab.*", letters), ChannelPattern)
    with pytest.raises(PatternError, match="character '\\+'"):
        parse("a+b.*", letters)


# -- pattern joins on the engine ------------------------------------------------------------


def _join(kit: Kit, client: str, pattern: str) -> Frame:
    return kit.op(client, Operation.JOIN, pattern, headers=PATTERN)


def _leave(kit: Kit, client: str, pattern: str) -> Frame:
    return kit.op(client, Operation.LEAVE, pattern, headers=PATTERN)


def _members(kit: Kit, channel: str) -> set[str]:
    return set(kit.engine.channels[channel].consumers)


def test_a_pattern_joins_existing_and_new_channels_it_matches() -> None:
    kit = Kit()
    c = kit.connect("c")
    p = kit.connect("p")
    for name in ("orders.eu", "orders.us", "orders.eu.paris", "stock.eu"):
        kit.queue(p, name, 1, status=QueueStatus.PUSH)
    assert _join(kit, c, "orders.*").content_type == 0
    assert _members(kit, "orders.eu") == {c} and _members(kit, "orders.us") == {c}
    assert _members(kit, "orders.eu.paris") == set() and _members(kit, "stock.eu") == set()
    kit.push(p, "orders.asia", 1, b"new channel, created by this push")
    assert _members(kit, "orders.asia") == {c}
    assert kit.payloads(c) == [b"new channel, created by this push"]
    kit.push(p, "stock.asia", 1, b"not matched")
    assert kit.payloads(c) == []


def test_leaving_a_pattern_leaves_what_it_joined_and_keeps_named_joins() -> None:
    kit = Kit()
    c = kit.connect("c")
    p = kit.connect("p")
    kit.queue(p, "a.1", 1, status=QueueStatus.PUSH)
    kit.queue(p, "a.2", 1, status=QueueStatus.PUSH)
    kit.join(c, "a.1")  # by name first: the pattern does not hold it
    _join(kit, c, "a.*")
    kit.queue(p, "a.3", 1, status=QueueStatus.PUSH)
    kit.join(c, "a.3")  # by name after: held by name from now on
    kit.queue(p, "a.4", 1, status=QueueStatus.PUSH)
    assert _leave(kit, c, "a.*").content_type == 0
    assert [n for n in ("a.1", "a.2", "a.3", "a.4") if c in _members(kit, n)] == ["a.1", "a.3"]
    kit.queue(p, "a.5", 1, status=QueueStatus.PUSH)
    assert _members(kit, "a.5") == set()  # the pattern is gone: new channels not joined
    again = _leave(kit, c, "a.*")
    assert again.content_type == ResultCode.NOT_FOUND


def test_a_channel_two_patterns_match_stays_joined_until_both_are_left() -> None:
    kit = Kit()
    c = kit.connect("c")
    p = kit.connect("p")
    _join(kit, c, "x.*")
    _join(kit, c, "*.y")
    kit.queue(p, "x.y", 1, status=QueueStatus.PUSH)
    _leave(kit, c, "x.*")
    assert _members(kit, "x.y") == {c}
    _leave(kit, c, "*.y")
    assert _members(kit, "x.y") == set()


def test_a_pattern_joins_only_channels_the_client_may_join() -> None:
    kit = Kit(authorizer=NoSecrets())
    c = kit.connect("c")
    p = kit.connect("p")
    kit.queue(p, "secret.a", 1, status=QueueStatus.PUSH)
    kit.queue(p, "public.a", 1, status=QueueStatus.PUSH)
    _join(kit, c, "*.a")
    kit.queue(p, "secret.b", 1, status=QueueStatus.PUSH)
    _join(kit, c, "*.b")
    kit.push(p, "secret.a", 1, b"hidden")
    kit.push(p, "secret.b", 1, b"hidden too")
    kit.push(p, "public.a", 1, b"seen")
    assert kit.payloads(c) == [b"seen"]
    assert _members(kit, "secret.a") == set() and _members(kit, "secret.b") == set()


def test_more_pattern_joins_than_the_limit_are_refused_and_the_same_one_is_no_more() -> None:
    config = BrokerConfig(limits=Limits(max_pattern_joins=2))
    kit = Kit(config=config)
    c = kit.connect("c")
    assert _join(kit, c, "a.*").content_type == 0
    assert _join(kit, c, "b.*").content_type == 0
    assert _join(kit, c, "a.*").content_type == 0  # the same again: still two
    third = _join(kit, c, "c.*")
    assert third.content_type == ResultCode.LIMIT_EXCEEDED
    assert "too many pattern joins" in (header(third, Header.REASON) or "")
    _leave(kit, c, "b.*")
    assert _join(kit, c, "c.*").content_type == 0


def test_distinct_patterns_past_the_broker_limit_are_refused_and_shared_ones_are_free() -> None:
    config = BrokerConfig(limits=Limits(max_patterns=2))
    kit = Kit(config=config)
    a, b, c = kit.connect("a"), kit.connect("b"), kit.connect("c")
    assert _join(kit, a, "x.*").content_type == 0
    assert _join(kit, b, "y.**").content_type == 0
    third = _join(kit, c, "z.*")
    assert third.content_type == ResultCode.LIMIT_EXCEEDED
    assert "too many distinct patterns" in (header(third, Header.REASON) or "")
    assert _join(kit, c, "x.*").content_type == 0  # one another client holds: free
    _leave(kit, a, "x.*")
    assert _join(kit, c, "z.*").content_type == 482  # c still holds x.*: two distinct
    _leave(kit, c, "x.*")
    assert _join(kit, c, "z.*").content_type == 0


def test_the_pattern_index_finds_what_trying_every_join_finds_in_the_same_order() -> None:
    """Differential: ``PatternJoins.matching`` (the index: distinct texts tried once,
    by literal first segment) against trying every client's every join in join order,
    through adds, removes and forgotten clients."""
    rng = random.Random(18)
    words = ["a", "b", "c", "ab"]
    texts = [
        "a.*", "a.**", "*.b", "**", "**.c", "a.b", "b.*.c", "{a|b}.*", "a*.**", "*",
        "ab.{[a-c]}", "c.**.a", "a.b.c",
    ]  # fmt: skip
    joins = PatternJoins()
    order: dict[str, dict[str, PatternJoin]] = {}  # the brute force's own copy
    clients = [f"c{i}" for i in range(12)]
    for step in range(600):
        client = rng.choice(clients)
        roll = rng.random()
        if roll < 0.55:
            text = rng.choice(texts)
            join = PatternJoin(parse(text), None)
            joins.add(client, join)
            mine = order.setdefault(client, {})
            mine[text] = join
        elif roll < 0.85:
            text = rng.choice(texts)
            mine = order.get(client, {})
            assert (joins.remove(client, text) is not None) == (text in mine)
            mine.pop(text, None)
            if not mine:
                order.pop(client, None)
        else:
            joins.forget_client(client)
            order.pop(client, None)
        name = ".".join(rng.choice(words) for _ in range(rng.randint(1, 4)))
        want = []
        for cid, mine in order.items():
            first = next((j for j in mine.values() if j.pattern.matches(name)), None)
            if first is not None:
                want.append((cid, first))
        assert list(joins.matching(name)) == want, (step, name)
        assert len(joins) == len({t for mine in order.values() for t in mine})


def test_a_pattern_joins_up_to_the_client_channel_limit() -> None:
    config = BrokerConfig(limits=dataclasses.replace(Limits(), max_joined_channels=3))
    kit = Kit(config=config)
    c = kit.connect("c")
    p = kit.connect("p")
    for i in range(5):
        kit.queue(p, f"n.{i}", 1, status=QueueStatus.PUSH)
    assert _join(kit, c, "n.*").content_type == 0
    assert len(kit.engine.clients[c].channels) == 3
    kit.queue(p, "n.9", 1, status=QueueStatus.PUSH)  # and no error for the producer
    assert len(kit.engine.clients[c].channels) == 3


def test_bad_patterns_and_a_bad_pattern_header_are_400() -> None:
    kit = Kit()
    c = kit.connect("c")
    for bad in ("a..b", "{(a+)+}", "a.{"):
        reply = _join(kit, c, bad)
        assert reply.content_type == ResultCode.BAD_REQUEST, bad
    odd = kit.op(c, Operation.JOIN, "a.*", headers=((Header.PATTERN, "maybe"),))
    assert odd.content_type == ResultCode.BAD_REQUEST
    assert "a.*" not in kit.engine.channels  # nothing created by a refused join


def test_a_push_naming_a_pattern_is_refused_and_creates_nothing() -> None:
    kit = Kit()
    p = kit.connect("p")
    frame = Frame(
        message_type=MessageType.QUEUE,
        content_type=1,
        message_id=kit.mid(),
        target="orders.*",
        headers=PATTERN,
        payload=b"x",
        pending_ack=True,
    )
    kit.send(p, frame)
    [ack] = acks(kit.take(p))
    assert ack.content_type != 0
    assert "cannot name a pattern" in (header(ack, Header.REASON) or "")
    assert "orders.*" not in kit.engine.channels


def test_a_disconnected_clients_patterns_are_forgotten() -> None:
    kit = Kit()
    c = kit.connect("c")
    p = kit.connect("p")
    _join(kit, c, "z.*")
    kit.disconnect(c)
    kit.queue(p, "z.1", 1, status=QueueStatus.PUSH)
    assert _members(kit, "z.1") == set()
    c2 = kit.connect("c")  # the same id again: a new session, no pattern of the old one
    kit.queue(p, "z.2", 1, status=QueueStatus.PUSH)
    assert c2 not in _members(kit, "z.2")


def test_a_pattern_matching_a_thousand_channels_joins_them_all() -> None:
    kit = Kit()
    c = kit.connect("c")
    p = kit.connect("p")
    for i in range(1000):
        kit.queue(p, f"many.{i}", 1, status=QueueStatus.PUSH)
    assert _join(kit, c, "many.*").content_type == 0
    assert len(kit.engine.clients[c].channels) == 1000
    for i in (0, 499, 999):
        kit.push(p, f"many.{i}", 1, f"m{i}".encode())
    assert sorted(kit.payloads(c)) == [b"m0", b"m499", b"m999"]
    assert _leave(kit, c, "many.*").content_type == 0
    assert kit.engine.clients[c].channels == {}
    assert queue_messages(kit.take(c)) == []


def test_prefetch_applies_to_each_channel_a_pattern_joins() -> None:
    kit = Kit()
    c = kit.connect("c")
    p = kit.connect("p")
    kit.queue(p, "w.old", 1, status=QueueStatus.PUSH)
    kit.ok(c, Operation.JOIN, "w.*", headers=(*PATTERN, (Header.PREFETCH, "5")))
    kit.queue(p, "w.new", 1, status=QueueStatus.PUSH)
    prefetch = kit.engine.clients[c].prefetch
    assert (prefetch["w.old"], prefetch["w.new"]) == (5, 5)


def test_a_plain_join_of_a_name_with_pattern_characters_is_a_plain_join() -> None:
    kit = Kit()
    c = kit.connect("c")
    p = kit.connect("p")
    kit.queue(p, "w.x", 1, status=QueueStatus.PUSH)
    kit.join(c, "w.*")  # no Pattern header: the channel literally named "w.*"
    assert set(kit.engine.clients[c].channels) == {"w.*"}
    kit.queue(p, "w.y", 1, status=QueueStatus.PUSH)
    assert set(kit.engine.clients[c].channels) == {"w.*"}


def test_a_pattern_join_asking_for_a_selector_or_credit_is_400_and_joins_nothing() -> None:
    """Selectors and credit windows are per channel join (``broker.engine.join_rules``);
    a pattern join asking for them is refused whole, nothing joined or remembered."""
    kit = Kit()
    c = kit.connect("c")
    p = kit.connect("p")
    kit.queue(p, "orders.eu", 1, status=QueueStatus.PUSH)
    for extra in ((Header.SELECTOR, "priority > 5"), (Header.CREDIT, "3,1000")):
        reply = kit.op(c, Operation.JOIN, "orders.*", headers=(*PATTERN, extra))
        assert reply.content_type == ResultCode.BAD_REQUEST, extra
        assert "not patterns" in str(header(reply, Header.REASON) or reply.payload), extra
        assert _members(kit, "orders.eu") == set()
    kit.push(p, "orders.us", 1, b"a new channel: no pattern was kept")
    assert _members(kit, "orders.us") == set()
