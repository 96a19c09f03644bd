"""Runs of plain pushes into a broadcast queue with a fan-out stream
(``broker.engine.queue.broadcast_run``): the outcome must be exactly that of the same
frames handled one by one (``Engine.receive``: ``Queue.accept`` then ``Broadcast.admit``).

Two engines get the same random session: batches of pushes into the broadcast queue
mixing what must leave the run (headers, a receipt, acknowledged pushes, no id, a
duplicate id, too big, another queue or channel), option updates (ids, duplicate window,
size and message limits, acknowledge requests), a consumer reading one by one joining
and leaving, fan-out members leaving and joining again (token changes: the stream holds
until the others claimed), ticks.  Each step must give the same publishes (token by order
of appearance, number, delivery), the same frames to the same clients, the same
refusals, and the queues the same counters.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from broker import tmqp
from broker.engine.fanout import Publish
from broker.engine.options import BrokerConfig
from broker.fanout import FANOUT, FANOUT_TICKET, FANOUT_TOKEN, ROTATED, VERSION, read_head
from broker.protocol import MessageType, Operation, QueueStatus, header

from .engine_kit import Frame, Kit
from .test_engine_batch_path import _counters, count_runs, one_by_one

CHANNEL = "news"
MEMBERS = ("m1", "m2")
UPDATES = [
    {"UseMessageId": False},
    {"UseMessageId": True},
    {"DuplicateWindow": 3},
    {"DuplicateWindow": 10_000},
    {"MessageSizeLimit": 20},
    {"MessageSizeLimit": 0},
    {"MessageLimit": 4},
    {"MessageLimit": 0},
    {"RequestAcknowledge": True},
    {"RequestAcknowledge": False},
]


class Side:
    """One engine of the pair, its members' tickets and its tokens by first sight."""

    def __init__(self) -> None:
        config = BrokerConfig(wall_clock=lambda: 1_700_000_000.0)
        self.kit = Kit(config=config)
        self.kit.engine.enable_fanout("tcp://127.0.0.1:5999")
        self.tokens: dict[bytes, int] = {}
        self.kit.connect("p")
        self.kit.queue("p", CHANNEL, 1, status=QueueStatus.BROADCAST)
        self.kit.queue("p", CHANNEL, 2, status=QueueStatus.BROADCAST)
        for member in MEMBERS:
            self.kit.connect(member)
            self.fan_join(member)
        self.kit.connect("d")

    def fan_join(self, member: str) -> list[Any]:
        reply = self.kit.op(member, Operation.JOIN, CHANNEL, headers=((FANOUT, VERSION),),
                            response=True)  # fmt: skip
        ticket = header(reply, FANOUT_TICKET)
        assert ticket is not None
        return self.claim(bytes.fromhex(ticket))

    def claim(self, ticket: bytes) -> list[Any]:
        claim = self.kit.engine.fanout_claim(ticket)
        assert claim is not None
        return self.seen(claim[1])

    def claim_rotations(self) -> list[Any]:
        """Each member told of a token change claims its new ticket."""
        got: list[Any] = []
        for member in MEMBERS:
            for frame in self.kit.take(member):
                if frame.message_type == MessageType.DIRECT and frame.content_type == ROTATED:
                    ticket = header(frame, FANOUT_TICKET)
                    assert ticket is not None
                    got += self.claim(bytes.fromhex(ticket))
        return got

    def seen(self, outs: list[Any]) -> list[Any]:
        """``outs`` comparable across engines: publishes with their token's rank, frames
        without the random token and ticket values."""
        got: list[Any] = []
        for o in outs:
            if isinstance(o, Publish):
                token, seq = read_head(o.client_id)
                rank = self.tokens.setdefault(token, len(self.tokens))
                frame = o.frame
                got.append(("publish", rank, seq, frame))
            else:
                frame = o.frame
                if isinstance(frame, tmqp.Frame) and frame.headers:
                    kept = tuple(
                        h for h in frame.headers if h[0] not in (FANOUT_TOKEN, FANOUT_TICKET)
                    )
                    frame = frame.replace(headers=kept)
                got.append((o.client_id, frame))
        return got


def _pushes(rnd: random.Random, n: int) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    for _ in range(n):
        odd = rnd.random() < 0.15  # mostly plain pushes: the runs are long
        entries.append({
            "queue": rnd.choice((1, 1, 1, 2)) if odd else 1,
            "channel": rnd.choice((CHANNEL, CHANNEL, "other")) if odd else CHANNEL,
            "mid": rnd.choice(("", "m1", f"u{rnd.randrange(10**9)}")) if odd
            else f"u{rnd.randrange(10**9)}",
            "source": rnd.choice(("p", "someone", "")),
            "ack": odd and rnd.random() < 0.3,
            "high": rnd.random() < 0.1,
            "headers": rnd.choice(((), (("Receipt", "ALL"),), (("x", "y"),))) if odd else (),
            "size": rnd.choice((1, 10, 30)),
        })  # fmt: skip
    return entries


def _items(entries: list[dict[str, Any]]) -> list[tuple[int, tmqp.Frame, bytes]]:
    items = []
    for index, e in enumerate(entries):
        frame = Frame(high_priority=e["high"], message_type=MessageType.QUEUE,
                      pending_ack=e["ack"], content_type=e["queue"], message_id=e["mid"],
                      source=e["source"], target=e["channel"], headers=e["headers"],
                      payload=bytes([index % 256]) * e["size"])  # fmt: skip
        items.append((index, frame, tmqp.encode(frame)[0]))
    return items


def _session(rnd: random.Random, length: int) -> list[tuple[str, Any]]:
    steps: list[tuple[str, Any]] = []
    for _ in range(length):
        r = rnd.random()
        if r < 0.6:
            steps.append(("batch", _pushes(rnd, rnd.randint(1, 40))))
        elif r < 0.72:
            steps.append(("update", rnd.choice(UPDATES)))
        elif r < 0.8:
            steps.append(("direct", rnd.random() < 0.5))
        elif r < 0.9:
            steps.append(("rejoin", rnd.choice(MEMBERS)))
        else:
            steps.append(("tick", rnd.choice((0.5, 1.1, 6.0))))
    return steps


def _step(side: Side, batched: bool, step: tuple[str, Any]) -> Any:
    kit = side.kit
    what, arg = step
    if what == "batch":
        items = _items(arg)
        if batched:
            outs, refused, later = kit.engine.receive_batch("p", items, kit.now)
        else:
            outs, refused, later = one_by_one(kit.engine, "p", items, kit.now)
        return side.seen(kit.route(outs)), refused, later
    if what == "update":
        kit.update("p", CHANNEL, 1, **arg)
        return None
    if what == "direct":  # a consumer reading one by one joins or leaves
        op = Operation.JOIN if arg else Operation.LEAVE
        frame = Frame(message_type=MessageType.SERVER, content_type=op, target=CHANNEL,
                      message_id=kit.mid(), pending_ack=True)  # fmt: skip
        return side.seen(kit.send("d", frame))
    if what == "rejoin":  # a member leaves (the token changes, the stream holds), and back
        frame = Frame(message_type=MessageType.SERVER, content_type=Operation.LEAVE,
                      target=CHANNEL, message_id=kit.mid(), pending_ack=True)  # fmt: skip
        got = side.seen(kit.send(arg, frame))
        got += side.claim_rotations()
        return got + side.fan_join(arg)
    return side.seen(kit.advance(arg))


def _clients(kit: Kit) -> dict[str, list[Any]]:
    """What the clients received (the inbox less the publishes, keyed by their heads)."""
    return {k: v for k, v in kit.inbox.items() if isinstance(k, str)}


def _lockstep(steps: list[tuple[str, Any]], seed: int) -> int:
    batched, single = Side(), Side()
    published = 0
    for n, step in enumerate(steps):
        batched.kit.now = single.kit.now = batched.kit.now + 0.001
        got = _step(batched, True, step)
        assert got == _step(single, False, step), (seed, n, step[0])
        assert _counters(batched.kit) == _counters(single.kit), (seed, n, step[0])
        assert _clients(batched.kit) == _clients(single.kit), (seed, n, step[0])
        if step[0] == "batch":
            published += sum(1 for o in got[0] if o[0] == "publish")
    return published


def test_a_run_into_a_fanout_stream_gives_what_its_pushes_give_one_by_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs = count_runs(monkeypatch, fanout=True)
    published = 0
    for seed in range(16):
        rnd = random.Random(seed)
        published += _lockstep(_session(rnd, rnd.randint(10, 40)), seed)
    assert runs[0] >= 50  # the batches took the run path, not only one by one
    assert published >= 2000  # publishes were compared, not two empty outputs


def test_a_duplicate_mid_run_is_answered_and_the_run_goes_on_after_it() -> None:
    """The adversary: a producer retrying a push (same id) inside one batch.  The run
    stops at the duplicate (the general path answers it: nothing published twice), the
    pushes after it are published, numbered on without a hole."""
    side = Side()
    kit = side.kit
    kit.update("p", CHANNEL, 1, UseMessageId=True, DuplicateWindow=100)
    entries = [
        {"queue": 1, "channel": CHANNEL, "mid": mid, "source": "p", "ack": False,
         "high": False, "headers": (), "size": 3}
        for mid in ("a", "b", "a", "c", "d")
    ]  # fmt: skip
    outs, refused, _later = kit.engine.receive_batch("p", _items(entries), kit.now)
    published = [o for o in side.seen(outs) if o[0] == "publish"]
    assert [(p[2], p[3].message_id) for p in published] == [(1, "a"), (2, "b"), (3, "c"), (4, "d")]
    assert refused == []
    assert kit.info("p", CHANNEL, 1)["DuplicateMessages"] == 1
