"""Temporary destinations per STOMP connection (``Limits.max_temp_destinations``, default
1,000, ``[limits]``): each is a channel kept until its connection ends, so one connection
could otherwise fill the broker's ``max_channels`` with them.  Past the limit the SEND or
SUBSCRIBE that would make one more is an ERROR with its receipt-id and no channel is made;
one already made is used as before; every connection has its own count, and a connection
gone gives its destinations back.  A real STOMP listener on an engine over loopback."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import zmq

from broker.engine.engine import Engine
from broker.engine.limits import Limits
from broker.engine.options import BrokerConfig
from broker.protocol import Outgoing
from tests.broker.test_pattern_doors import Stomp, _receipted, _refused
from tests.polling import wait_until
from tests.stomp.two_doors import Broker

Ctx = zmq.Context[zmq.Socket[bytes]]
LIMIT = 3


@pytest.fixture
def doors(zctx: Ctx) -> Iterator[Broker]:
    limits = dataclasses.replace(Limits(), max_temp_destinations=LIMIT)
    made = Broker(zctx, Engine(config=dataclasses.replace(BrokerConfig(), limits=limits)))
    yield made
    made.stop()


def _temp_channels(doors: Broker) -> int:
    """Temporary channels the engine holds, queues and topics (read on the engine thread)."""
    box: list[int] = []

    def read(now: float) -> list[Outgoing]:
        box.append(sum(1 for name in doors.engine.channels if "temp." in name))
        return []

    doors.door.submit(read)
    assert wait_until(lambda: bool(box))
    return box[0]


def _send(conn: Stomp, destination: str, receipt: str) -> bytes:
    conn.send(f"SEND\ndestination:{destination}\nreceipt:r-{receipt}\n\nx\x00".encode())
    return conn.next_frame()


def test_the_default_is_1000() -> None:
    assert Limits().max_temp_destinations == 1000


def test_past_the_limit_refused_with_the_receipt_and_freed_when_the_connection_goes(
    doors: Broker,
) -> None:
    first, second = Stomp(doors.listener.port), Stomp(doors.listener.port)
    try:
        assert _receipted(first.subscribe("a", "/temp-queue/a"), "a")
        assert _receipted(first.subscribe("b", "/temp-topic/b"), "b")
        assert _receipted(_send(first, "/temp-queue/c", "c"), "c")
        # the ones made are used as before
        got = sorted([_send(first, "/temp-queue/a", "again"), first.next_frame()])
        assert got[0].startswith(b"MESSAGE\n") and _receipted(got[1], "again"), got
        assert _temp_channels(doors) == LIMIT
        # the second has its own count while the first is full
        for name in ("x", "y", "z"):
            assert _receipted(second.subscribe(name, f"/temp-queue/{name}"), name)
        answer = first.subscribe("d", "/temp-queue/d")
        assert _refused(answer, "d"), answer
        assert b"max_temp_destinations=3" in answer
        assert _temp_channels(doors) == 2 * LIMIT  # no channel made for it
        answer = _send(second, "/temp-queue/w", "w")
        assert _refused(answer, "w"), answer
        # both closed: every temporary channel goes
        first.close()
        second.close()
        assert wait_until(lambda: _temp_channels(doors) == 0)
        third = Stomp(doors.listener.port)
        try:
            for name in ("a", "b", "c"):
                assert _receipted(third.subscribe(name, f"/temp-queue/{name}"), name)
        finally:
            third.close()
    finally:
        first.close()
        second.close()
