"""The bridge core, sans-IO: expected actions worked out by hand, time passed in."""

from __future__ import annotations

import pytest

from broker.bridge.config import Direction, Route, Settings
from broker.bridge.core import (
    AckLocal,
    AckRemote,
    Backoff,
    BridgeCore,
    Connect,
    DeadLetter,
    Publish,
    PushLocal,
)

OUT = Route(Direction.OUT, "orders", 1, "zh/orders")
IN = Route(Direction.IN, "sensors", 2, "zh/sensors/#")


def connected_core(**kw: object) -> BridgeCore:
    core = BridgeCore(Settings(routes=(OUT, IN), **kw))  # type: ignore[arg-type]
    assert core.poll(0.0) == [Connect()]
    assert core.poll(0.0) == []  # one attempt at a time
    assert core.connected(0.0) == []
    return core


def test_backoff_doubles_up_to_the_cap_and_resets() -> None:
    backoff = Backoff(0.1, 0.5)
    assert [round(backoff.failed(10.0) - 10.0, 3) for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    assert not backoff.due(10.4) and backoff.due(10.5)
    backoff.reset()
    assert backoff.due(0.0) and backoff.failed(0.0) == pytest.approx(0.1)


def test_local_message_is_acked_only_when_the_remote_accepted_it() -> None:
    core = connected_core()
    [publish] = core.local_message(OUT, b"m1", "ref-1")
    assert publish == Publish(publish.token, OUT, b"m1")
    assert core.out_in_flight == 1
    assert core.remote_accepted(publish.token + 99, 1) == []  # unknown token: nothing
    assert core.remote_accepted(publish.token, 1) == [AckLocal("ref-1")]
    assert core.out_in_flight == 0
    assert core.remote_accepted(publish.token, 1) == []  # a second answer acks nothing


def test_unaccepted_publishes_go_again_after_a_reconnect_with_backoff() -> None:
    core = connected_core(backoff=(1.0, 4.0))
    first = core.local_message(OUT, b"a", "ra")[0]
    assert isinstance(first, Publish)
    assert core.lost(10.0) == []
    held = core.local_message(OUT, b"b", "rb")
    assert held == []  # remote down: kept, not published
    assert core.poll(10.5) == []  # backoff 1 s not over
    assert core.poll(11.0) == [Connect()]
    assert core.connect_failed(11.0) == []
    assert core.poll(12.9) == []  # the delay doubled: 2 s
    assert core.poll(13.0) == [Connect()]
    resent = core.connected(13.0)
    assert [(type(a), a.payload) for a in resent] == [(Publish, b"a"), (Publish, b"b")]  # type: ignore[union-attr]
    # the answer of the first connection's copy is not the one we wait for
    assert core.remote_accepted(first.token, 1) == []
    assert core.remote_accepted(first.token, 2) == [AckLocal("ra")]
    assert core.counters.out_resent == 1 and core.counters.disconnects == 1


def test_refused_publish_is_published_again() -> None:
    core = connected_core()
    [publish] = core.local_message(OUT, b"x", "rx")
    assert isinstance(publish, Publish)
    assert core.remote_refused(publish.token, 1) == [Publish(publish.token, OUT, b"x", True)]
    assert core.counters.out_refused == 1
    assert core.remote_accepted(publish.token, 1) == [AckLocal("rx")]


def test_remote_message_is_acked_remotely_only_after_the_local_push_was_accepted() -> None:
    core = connected_core(backoff=(0.5, 8.0))
    [push] = core.remote_message(IN, b"r1", "mid-1", (("K", "V"),))
    assert push == PushLocal(push.token, IN, b"r1", (("K", "V"),))
    assert core.local_refused(push.token, 5.0) == []  # refused: retry later, no ack
    assert core.poll(5.4) == []
    assert core.poll(5.5) == [PushLocal(push.token, IN, b"r1", (("K", "V"),))]
    assert core.in_in_flight == 1
    assert core.local_accepted(push.token) == [AckRemote("mid-1")]
    assert core.in_in_flight == 0 and core.counters.in_refused == 1


def test_an_ack_is_never_sent_on_a_later_connection() -> None:
    core = connected_core()
    [push] = core.remote_message(IN, b"r", "mid-7")
    assert isinstance(push, PushLocal)
    core.lost(1.0)
    core.poll(5.0)
    core.connected(5.0)  # generation 2: mid-7 belonged to generation 1
    assert core.local_accepted(push.token) == []
    assert core.counters.in_stale == 1
    # a message stamped with an old generation is not acked either
    [late] = core.remote_message(IN, b"late", "mid-8", generation=1)
    assert isinstance(late, PushLocal)
    assert core.local_accepted(late.token) == []


def test_oversized_or_unrouted_remote_messages_are_dead_lettered_and_acked() -> None:
    core = connected_core(max_message_size=4)
    assert core.remote_message(IN, b"12345", "big") == [
        DeadLetter(IN, "payload of 5 octets is over the limit of 4", 5),
        AckRemote("big"),
    ]
    assert core.remote_message(None, b"x", "stray") == [
        DeadLetter(None, "it matches no route", 1),
        AckRemote("stray"),
    ]
    assert core.counters.dead_lettered == 2 and core.in_in_flight == 0
    assert isinstance(core.remote_message(IN, b"1234", "ok")[0], PushLocal)


def test_copies_that_may_be_duplicates_are_flagged_resent() -> None:
    """A publish sent again after a reconnect, and a local redelivery, are flagged (the
    connector marks them ``zerohub-resent``); a first publish is not."""
    core = connected_core()
    [first] = core.local_message(OUT, b"a", "ra")
    assert isinstance(first, Publish) and not first.resent
    [again] = core.local_message(OUT, b"b", "rb", redelivered=True)
    assert isinstance(again, Publish) and again.resent
    core.lost(1.0)
    core.poll(5.0)
    resent = core.connected(5.0)
    assert {p.payload: p.resent for p in resent if isinstance(p, Publish)} == {
        b"a": True,
        b"b": True,
    }


def test_stomp_redelivered_message_is_flagged_locally() -> None:
    """RabbitMQ's ``redelivered:true`` on a MESSAGE becomes ``Bridge-Redelivered``."""
    pytest.importorskip("stomp")
    from broker.bridge.config import parse_url
    from broker.bridge.connectors.stomp import StompConnector
    from broker.bridge.events import RemoteMessage

    route = Route(Direction.IN, "sensors", 2, "/queue/in")
    connector = StompConnector(parse_url("stomp://127.0.0.1:1", "stomp"), (route,), window=1)
    seen: list[object] = []
    connector._sink = seen.append
    for flag in ("true", "false"):
        headers = {"destination": "/queue/in", "ack": f"a-{flag}", "redelivered": flag}
        connector._message(headers, b"p", 1)
    first, second = seen
    assert isinstance(first, RemoteMessage) and isinstance(second, RemoteMessage)
    assert ("Bridge-Redelivered", "true") in first.headers
    assert ("Bridge-Redelivered", "true") not in second.headers
