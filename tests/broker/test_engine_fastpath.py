"""Queue.push_plain (the engine's fast push) behaves exactly like the general path.

Two engines get the same random session: one with the default delivery handler (pushes
may take the fast path) and one whose handler overrides ``received_from_producer`` with
the same behaviour, which keeps every push on the general path.  Every step must give
the same frames to the same clients, and the queues the same counters.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from broker import tmqp
from broker.engine.channel import Client
from broker.engine.delivery import Decision, DefaultDeliveryHandler
from broker.engine.message import QueueMessage
from broker.engine.queue.queue import Queue
from broker.protocol import EventName, MessageType, Operation

from .engine_kit import Frame, Kit


class GeneralPathHandler(DefaultDeliveryHandler):
    """The default behaviour, but not recognisably so: no push takes the fast path."""

    def received_from_producer(
        self, queue: Queue, message: QueueMessage, sender: Client | None
    ) -> Decision:
        return super().received_from_producer(queue, message, sender)


CLIENTS = ("p", "c1", "c2")
UPDATES = [
    {"Status": 1},
    {"Status": 2},
    {"Status": 0},
    {"Status": 3},
    {"RequestAcknowledge": True},
    {"RequestAcknowledge": False},
    {"MessageSizeLimit": 20},
    {"MessageSizeLimit": 0},
    {"UseMessageId": False},
    {"UseMessageId": True},
    {"WaitForAcknowledge": True},
    {"WaitForAcknowledge": False},
    {"HideClientNames": True},
    {"HideClientNames": False},
    {"SendOnlyFirstAcquirer": True},
    {"SendOnlyFirstAcquirer": False},
    {"MessageLimit": 2},
    {"MessageLimit": 0},
    {"MessageTimeout": 1000},
    {"MessageTimeout": 0},
    {"Prefetch": 1},
    {"Prefetch": 3},
    {"Prefetch": 0},
]


def _session(rnd: random.Random, length: int, transmit: int = 0) -> list[tuple[str, str, Any]]:
    """A random session; mostly plain pushes, now and then anything that changes the path
    (and with ``transmit`` weight, reports of sent deliveries for a held-back transport)."""
    steps: list[tuple[str, str, Any]] = []
    for _ in range(length):
        what = rnd.choices(
            ["push", "update", "join", "leave", "ack", "tick", "subscribe", "transmit"],
            weights=[12, 3, 1, 1, 2, 1, 1, transmit],
        )[0]
        client = rnd.choice(CLIENTS)
        arg: Any = None
        if what == "push":
            arg = {
                "ack": rnd.random() < 0.15,
                "response": rnd.random() < 0.1,
                "high": rnd.random() < 0.3,
                "first": rnd.random() < 0.2,
                "mid": rnd.random() < 0.85,
                "source": rnd.choice(["own", "own", "", "someone"]),
                "headers": (("K", "v"),) if rnd.random() < 0.15 else (),
                "size": rnd.choice([1, 40]),
                "queue": 1 if rnd.random() < 0.9 else 2,
            }
        elif what == "update":
            client, arg = "p", rnd.choice(UPDATES)
        elif what in ("join", "leave", "ack"):
            client = rnd.choice(CLIENTS[1:])
            arg = rnd.random() < 0.8
        elif what == "transmit":
            client = rnd.choice(CLIENTS[1:])
            arg = rnd.choice([1, 2, None])
        elif what == "tick":
            arg = rnd.choice([0.5, 20.0])
        else:
            arg = rnd.random() < 0.5
        steps.append((what, client, arg))
    return steps


def _frame(kit: Kit, client: str, n: int, spec: dict[str, Any]) -> Frame:
    source = {"own": client, "": "", "someone": "someone"}[spec["source"]]
    return Frame(
        first_acquirer=spec["first"],
        high_priority=spec["high"],
        message_type=MessageType.QUEUE,
        pending_ack=spec["ack"],
        pending_response=spec["response"],
        content_type=spec["queue"],
        message_id=f"push{n}" if spec["mid"] else "",
        source=source,
        target="ch",
        headers=spec["headers"],
        payload=b"x" * spec["size"],
    )


def _step(kit: Kit, n: int, step: tuple[str, str, Any]) -> list[tuple[str, tmqp.Frame]]:
    what, client, arg = step
    if what == "push":
        outs = kit.send(client, _frame(kit, client, n, arg))
    elif what in ("join", "leave"):
        op = Operation.JOIN if what == "join" else Operation.LEAVE
        outs = kit.send(
            client, Frame(message_type=MessageType.SERVER, content_type=op, target="ch",
                          message_id=f"o{n}", pending_ack=True)
        )  # fmt: skip
    elif what == "update":
        kit.update(client, "ch", 1, **arg)
        return []
    elif what == "ack":
        delivered = [f for f in kit.inbox[client] if f.message_type == MessageType.QUEUE]
        if not delivered:
            return []
        kit.ack(client, delivered[-1], None if arg else "none")
        outs = []
    elif what == "transmit":
        held = kit.unsent[client]
        outs = kit.transmit(client, held if arg is None else min(arg, held))
    elif what == "subscribe":
        outs = kit.send(
            client, Frame(message_type=MessageType.EVENT, content_type=int(arg),
                          target=EventName.MESSAGE_PRODUCED, message_id=f"e{n}",
                          pending_ack=True)
        )  # fmt: skip
    else:
        outs = kit.advance(arg)
    return [(o.client_id, o.frame) for o in outs]


def _counters(kit: Kit) -> list[tuple[Any, ...]]:
    channel = kit.engine.channels.get("ch")
    if channel is None:
        return []
    return [
        (q.id, q.sequence, q.received, q.sent, q.deliveries, q.n_priority, q.n_regular,
         q.last_received, q.last_sent, q.acks, q.nacks, q.rr, len(q.pending),
         dict(q.used), q.dropped)
        for q in channel.queues.values()
    ]  # fmt: skip


def _kits(auto_transmit: bool = True) -> tuple[Kit, Kit]:
    fast = Kit(auto_transmit=auto_transmit)
    general = Kit(handler=GeneralPathHandler(), auto_transmit=auto_transmit)
    for kit in (fast, general):
        for client in CLIENTS:
            kit.connect(client)
        kit.join("c1", "ch")
        kit.join("c2", "ch")
        kit.queue("p", "ch", 1, status=1)
    assert fast.engine.channels["ch"].queues[1].plain
    assert not general.engine.channels["ch"].queues[1].plain
    return fast, general


def _compare(fast: Kit, general: Kit, steps: list[tuple[str, str, Any]], seed: int = 0) -> None:
    for n, step in enumerate(steps):
        fast.now = general.now = fast.now + 0.001
        assert _step(fast, n, step) == _step(general, n, step), (seed, n, step)
        assert _counters(fast) == _counters(general), (seed, n, step)
    assert fast.inbox == general.inbox, seed


@pytest.mark.parametrize("block", range(4))
def test_fast_push_matches_the_general_path(block: int) -> None:
    # plain seeded sessions: more varied than what hypothesis draws through st.randoms()
    delivered = 0
    for seed in range(block * 100, block * 100 + 100):
        rnd = random.Random(seed)
        fast, general = _kits()
        _compare(fast, general, _session(rnd, rnd.randint(5, 60)), seed)
        delivered += bool(fast.inbox)
    assert delivered >= 50  # the sessions compare deliveries, not two empty inboxes


@pytest.mark.parametrize("block", range(2))
def test_fast_push_matches_the_general_path_with_full_windows(block: int) -> None:
    # the transport is held back: windows fill, pushes queue, reports release them
    delivered = 0
    for seed in range(block * 100, block * 100 + 100):
        rnd = random.Random(seed)
        fast, general = _kits(auto_transmit=False)
        _compare(fast, general, _session(rnd, rnd.randint(5, 60), transmit=3), seed)
        delivered += bool(fast.inbox)
    assert delivered >= 50  # the sessions compare deliveries, not two empty inboxes


def test_pushes_wait_behind_unacknowledged_deliveries_like_the_general_path() -> None:
    plain = {"ack": False, "response": False, "high": False, "first": False, "mid": True,
             "source": "own", "headers": (), "size": 1, "queue": 1}  # fmt: skip
    fast, general = _kits()
    steps: list[tuple[str, str, Any]] = [
        ("leave", "c2", None),
        ("update", "p", {"RequestAcknowledge": True}),
        ("push", "p", plain),  # delivered, waits for c1's acknowledge
        ("update", "p", {"RequestAcknowledge": False}),
        ("update", "p", {"WaitForAcknowledge": True}),
        ("push", "p", plain),  # queued behind the unacknowledged one
        ("push", "p", plain),
        ("ack", "c1", True),
        ("push", "p", plain),
    ]
    _compare(fast, general, steps)
    assert fast.engine.channels["ch"].queues[1].plain
    assert [f.message_id for f in fast.take("c1")] == ["push2", "push5", "push6", "push8"]


def test_plain_pushes_skip_the_general_path(monkeypatch: pytest.MonkeyPatch) -> None:
    fast, _ = _kits()
    fast.ok("c2", Operation.LEAVE, "ch")

    def refuse(*args: Any, **kw: Any) -> Any:
        raise AssertionError("Queue.accept called")

    monkeypatch.setattr(Queue, "accept", refuse)
    for i in range(3):  # push status, one consumer
        fast.push("p", "ch", 1, b"m%d" % i)
    assert fast.payloads("c1") == [b"m0", b"m1", b"m2"]
    fast.join("c2", "ch")
    fast.update("p", "ch", 1, Status=2)  # round robin alternates
    for i in range(4):
        fast.push("p", "ch", 1, b"r%d" % i)
    assert fast.payloads("c1") == [b"r0", b"r2"]
    assert fast.payloads("c2") == [b"r1", b"r3"]
    info = fast.info("p", "ch", 1)
    assert (info["ReceivedMessages"], info["SentMessages"], info["Deliveries"]) == (7, 7, 7)
    assert info["Sequence"] == 7 and info["LastMessageSent"] > 0


def test_a_push_to_several_consumers_takes_the_general_path() -> None:
    """Its copies settle together (sent once any got out), which needs a QueueMessage."""
    fast, general = _kits()
    plain = {"ack": False, "response": False, "high": False, "first": False, "mid": True,
             "source": "own", "headers": (), "size": 1, "queue": 1}  # fmt: skip
    _compare(fast, general, [("push", "p", plain), ("push", "p", plain)])
    assert fast.payloads("c1") == fast.payloads("c2") == [b"x", b"x"]
    info = fast.info("p", "ch", 1)
    assert (info["ReceivedMessages"], info["SentMessages"], info["Deliveries"]) == (2, 2, 4)


def test_a_push_without_the_producers_id_is_stamped_with_it() -> None:
    fast, _ = _kits()
    fast.send("p", Frame(message_type=MessageType.QUEUE, content_type=1, target="ch",
                         message_id="m", source="", payload=b"x"))  # fmt: skip
    (delivered,) = fast.take("c1")
    assert delivered.source == "p"
