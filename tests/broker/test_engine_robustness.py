"""Random frames and clock moves never raise out of the engine nor break its counters."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker import tmqp
from broker.engine.message import QUEUED
from broker.protocol import (
    EVENT_NAMES,
    ConnectionInfo,
    Header,
    MessageType,
    Operation,
    RouterOperation,
)
from tests.broker.engine_kit import Kit

CLIENTS = ("a", "b", "c")
NAMES = ("ch", "other", "", "a", "b", "@type:t", "@name:n", "bad name", "r", *EVENT_NAMES)
HEADER_NAMES = (
    Header.QUEUE_ID,
    Header.COUNT,
    Header.CLEAR,
    Header.ORDER,
    Header.INFO,
    Header.CC,
    Header.NACK_REASON,
    Header.CHANNEL_NAME,
    "X",
)
CONTENT = (0, 1, 2, *map(int, Operation), *map(int, RouterOperation), 65535)
BODIES = (
    b"",
    b"{}",
    b"[]",
    b"{bad",
    json.dumps({"Status": 3}).encode(),
    json.dumps({"Status": 0, "RequestAcknowledge": True, "AcknowledgeTimeout": 5}).encode(),
    json.dumps({"Name": "b", "Target": "ch", "Queue": 1}).encode(),
    json.dumps({"Method": "RoundRobin"}).encode(),
    b"\xff\xfe",
)

frames = st.builds(
    tmqp.Frame,
    first_acquirer=st.booleans(),
    high_priority=st.booleans(),
    message_type=st.sampled_from([int(t) for t in MessageType]) | st.integers(0, 63),
    pending_response=st.booleans(),
    pending_ack=st.booleans(),
    content_type=st.sampled_from(CONTENT) | st.integers(0, 65535),
    message_id=st.sampled_from(("", "m1", "m2", "m3")),
    source=st.sampled_from(("", "a", "zz")),
    target=st.sampled_from(NAMES),
    headers=st.lists(
        st.tuples(
            st.sampled_from(HEADER_NAMES),
            st.sampled_from(("1", "2", "0", "-1", "x", "LIFO", "All", "yes", "ch;1", "")),
        ),
        max_size=3,
    ).map(tuple),
    payload=st.sampled_from(BODIES),
)

steps = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.sampled_from(CLIENTS), frames),
        st.tuples(st.just("tick"), st.floats(0, 0.02)),
        st.tuples(st.just("bounce"), st.sampled_from(CLIENTS)),
    ),
    max_size=40,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_random_traffic_is_handled(script: list[tuple[Any, ...]]) -> None:
    kit = Kit()
    engine = kit.engine
    for name in CLIENTS:
        kit.connect(name, name="n", type="t")
    for step in script:
        if step[0] == "send":
            outs = kit.send(step[1], step[2])
        elif step[0] == "tick":
            outs = kit.advance(step[1])
        else:
            outs = kit.disconnect(step[1])
            outs += kit.route(engine.connect(_info(step[1]), kit.now)[1])
        for out in outs:
            assert out.client_id in engine.clients
    for channel in engine.channels.values():
        for queue in channel.queues.values():
            live_high = sum(
                1
                for m in [*queue.messages.priority, *queue.messages.front]
                if m.state == QUEUED and m.high_priority
            )
            live_low = sum(
                1
                for m in [*queue.messages.regular, *queue.messages.front]
                if m.state == QUEUED and not m.high_priority
            )
            assert (queue.n_priority, queue.n_regular) == (live_high, live_low)
    stats = engine.stats()
    json.dumps(stats)
    assert stats["errors"] == 0  # bad input is answered, never an internal failure


def _info(name: str) -> ConnectionInfo:
    return ConnectionInfo(client_id=name, name="n", type="t")
