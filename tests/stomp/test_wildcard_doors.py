"""STOMP wildcard subscriptions on the engine and channels made by any door: a channel a
TMQP push creates is joined as one a STOMP SEND creates, and a wildcard subscriber that
may not join a new channel neither gets it nor spoils the SEND that made it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from broker.client.blocking import Client
from broker.engine.auth import ALL_ACTIONS, TokenAuthorizer
from broker.engine.engine import Engine
from broker.engine.limits import Limits
from broker.engine.options import BrokerConfig
from tests.polling import WAIT, wait_until
from tests.stomp.two_doors import Broker, Connect, stomp_connections

Ctx = zmq.Context[zmq.Socket[bytes]]


@pytest.fixture
def broker(zctx: Ctx) -> Iterator[Broker]:
    """Token ``reader`` may read only channels ``public.*``; ``writer`` everything."""
    auth = TokenAuthorizer(
        {"reader": ALL_ACTIONS, "writer": ALL_ACTIONS}, channels={"reader": ["public.*"]}
    )
    b = Broker(zctx, Engine(authorizer=auth))
    yield b
    b.stop()


@pytest.fixture
def connect(broker: Broker) -> Iterator[Connect]:
    """A connection that logs in with a token (as login and passcode)."""
    with stomp_connections(broker.listener.port) as make:
        yield lambda token: make(token, token)


def test_a_channel_a_tmqp_push_creates_is_joined_by_a_stomp_wildcard(
    broker: Broker, connect: Any
) -> None:
    """Was a defect: only channels a STOMP SEND created were joined (the wildcard
    subscription missed the message, and every later one, of a TMQP-made channel)."""
    conn, rec = connect("writer")
    conn.subscribe("/queue/made.*", id="w", receipt="s")
    assert wait_until(lambda: rec.receipts == ["s"])
    with Client(broker.endpoint, context=broker.zctx, token="writer", timeout=WAIT) as producer:
        producer.push("made.by-tmqp", 0, b"first message of a new channel", ack=True)
    assert wait_until(lambda: rec.bodies() == ["first message of a new channel"])
    assert rec.messages[0].headers["destination"] == "/queue/made.by-tmqp"


def test_a_wildcard_subscriber_that_may_not_join_a_new_channel_is_passed_over(
    broker: Broker, connect: Any
) -> None:
    reader, read = connect("reader")
    reader.subscribe("/queue/*.news", id="w", receipt="s")
    assert wait_until(lambda: read.receipts == ["s"])
    writer, wrote = connect("writer")
    writer.send("/queue/secret.news", "not for the reader", receipt="r1")
    writer.send("/queue/public.news", "for the reader", receipt="r2")
    assert wait_until(lambda: wrote.receipts == ["r1", "r2"])
    assert wrote.errors == []
    assert wait_until(lambda: read.bodies() == ["for the reader"])
    secret = broker.engine.channels["secret.news"]
    assert len(secret.consumers) == 0


def test_distinct_wildcards_past_max_patterns_are_an_error_and_shared_ones_are_free(
    zctx: Ctx,
) -> None:
    """``Limits.max_patterns`` bounds what every channel created is matched against on the
    STOMP door too: a wildcard no subscription holds yet, past it, is an ERROR; one another
    connection holds costs nothing and is taken; the others keep being served."""
    b = Broker(zctx, Engine(config=BrokerConfig(limits=Limits(max_patterns=2))))
    try:
        with stomp_connections(b.listener.port) as connect:
            first, one = connect("u", "p")
            first.subscribe("/queue/a.*", id="1", receipt="r1")
            first.subscribe("/topic/b.**", id="2", receipt="r2")
            assert wait_until(lambda: one.receipts == ["r1", "r2"])
            second, two = connect("u", "p")
            second.subscribe("/queue/a.*", id="1", receipt="shared")  # held by `first`: free
            assert wait_until(lambda: two.receipts == ["shared"])
            third, three = connect("u", "p")
            third.subscribe("/queue/c.*", id="1", receipt="new")
            assert wait_until(lambda: len(three.errors) == 1)
            assert "max_patterns=2" in three.errors[0].headers.get("message", "")
            assert three.receipts == []
            first.send("/queue/a.x", "made after the refusal", receipt="s")
            assert wait_until(lambda: one.receipts[-1:] == ["s"])
            assert wait_until(lambda: one.bodies() + two.bodies() == ["made after the refusal"])
    finally:
        b.stop()
