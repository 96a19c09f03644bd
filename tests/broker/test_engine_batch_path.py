"""Engine.receive_batch takes runs of pushes into one queue in one call
(``Engine._run_queue``, ``Queue.push_plain_run``): the outcome must be exactly that of
the frames handled one by one through :meth:`Engine.receive` (session 7's
``receive_batch``, kept here as the reference).

Two engines get the same random session of batches mixing queues, channels, an
unknown queue and channel, refused entries (too big, duplicates, acknowledged and
unacknowledged pushes, headers) and consumer acknowledges, between option updates,
joins and leaves, disconnects, held-back transports (windows that fill mid-batch) and
ticks.  Every step must give the same output to the same clients in the same order, the
same refusals and the queues the same counters.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from broker import tmqp
from broker.engine.engine import Engine, Outgoing
from broker.engine.options import BrokerConfig
from broker.engine.queue.dedupe import RecentIds
from broker.engine.queue.queue import Queue
from broker.protocol import Header, MessageType, Operation

from .engine_kit import Frame, Kit

CONSUMERS = ("c1", "c2")
#: (channel, queue id) a pushed entry goes to: two queues of one channel, another
#: channel, a queue nobody created and a channel nobody created
TARGETS = [("ch", 1), ("ch", 1), ("ch", 1), ("ch", 2), ("ot", 1), ("ch", 9), ("nochan", 1)]
UPDATES = [
    {"Status": 1},
    {"Status": 2},
    {"Status": 0},
    {"MessageSizeLimit": 20},
    {"MessageSizeLimit": 0},
    {"UseMessageId": False},
    {"UseMessageId": True},
    {"DuplicateWindow": 3},
    {"DuplicateWindow": 10_000},
    {"MessageLimit": 4},
    {"MessageLimit": 0},
    {"Prefetch": 1},
    {"Prefetch": 3},
    {"Prefetch": 0},
    {"RequestAcknowledge": True},
    {"RequestAcknowledge": False},
]

Item = tuple[int, tmqp.Frame, bytes]
Result = tuple[list[Outgoing], list[tuple[int, str, str]], list[int]]


def one_by_one(engine: Engine, client_id: str, items: list[Item], now: float) -> Result:
    """The reference: each frame through ``Engine.receive``, the acknowledges of the
    pushes taken out of the output (session 7's ``receive_batch``); a plain push as a
    batch of one (no run: ``receive`` of it alone, its refusal named)."""
    out: list[Outgoing] = []
    refused: list[tuple[int, str, str]] = []
    later: list[int] = []
    for index, frame, data in items:
        if frame.message_type == MessageType.QUEUE and not frame.pending_ack:
            outs, alone, _ = engine.receive_batch(client_id, [(index, frame, data)], now)
            refused += alone
            out += outs
            continue
        outs = engine.receive(client_id, frame, now, data)
        if frame.message_type == MessageType.QUEUE and frame.pending_ack:
            for i, o in enumerate(outs):
                f = o.frame
                if (
                    o.client_id == client_id
                    and isinstance(f, tmqp.Frame)
                    and f.message_type == MessageType.ACK
                    and f.message_id == frame.message_id
                ):
                    del outs[i]
                    fields = {k.lower(): v for k, v in f.headers}
                    nack = fields.get(Header.NACK_REASON.lower())
                    if nack is not None:
                        refused.append((index, nack, fields.get(Header.REASON.lower(), "")))
                    break
            else:
                later.append(index)
        out += outs
    return out, refused, later


def _batch(rnd: random.Random, n: int, length: int) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    for k in range(length):
        if rnd.random() < 0.08:
            entries.append(
                {"kind": "ack", "client": rnd.choice(CONSUMERS), "nack": rnd.random() < 0.3}
            )
            continue
        channel, queue_id = rnd.choice(TARGETS)
        roll = rnd.random()
        mid = f"b{n}-{k}" if roll < 0.85 else ("" if roll < 0.9 else f"b{rnd.randrange(n + 1)}-0")
        entries.append(
            {
                "kind": "push",
                "channel": channel,
                "queue": queue_id,
                "mid": mid,
                "ack": rnd.random() < 0.25,
                "high": rnd.random() < 0.2,
                "headers": (("K", "v"),) if rnd.random() < 0.05 else (),
                "size": rnd.choice([1, 1, 1, 40]),
                "source": rnd.choice(["p", "p", "p", "", "someone"]),
            }
        )
    return entries


def _session(rnd: random.Random, length: int) -> list[tuple[str, str, Any]]:
    steps: list[tuple[str, str, Any]] = []
    for n in range(length):
        what = rnd.choices(
            ["batch", "update", "join", "leave", "transmit", "tick", "reconnect"],
            weights=[10, 2, 1, 1, 4, 1, 1],
        )[0]
        client = rnd.choice(CONSUMERS)
        arg: Any = None
        if what == "batch":
            client, arg = "p", _batch(rnd, n, rnd.choice([2, 3, 8, 30, 80]))
        elif what == "update":
            client, arg = rnd.choice(["ch", "ot"]), rnd.choice(UPDATES)
        elif what == "transmit":
            arg = rnd.choice([1, 5, None])
        elif what == "tick":
            arg = rnd.choice([0.5, 20.0])
        steps.append((what, client, arg))
    return steps


def _items(kit: Kit, entries: list[dict[str, Any]]) -> list[Item]:
    items: list[Item] = []
    for index, e in enumerate(entries):
        if e["kind"] == "ack":
            delivered = [f for f in kit.inbox[e["client"]] if f.message_type == MessageType.QUEUE]
            if not delivered:
                continue
            d = delivered[-1]
            headers = ((Header.NACK_REASON, "none"),) if e["nack"] else ()
            frame = Frame(message_type=MessageType.ACK, content_type=d.content_type,
                          target=d.target, message_id=d.message_id, headers=headers)  # fmt: skip
        else:
            frame = Frame(
                high_priority=e["high"],
                message_type=MessageType.QUEUE,
                pending_ack=e["ack"],
                content_type=e["queue"],
                message_id=e["mid"],
                source=e["source"],
                target=e["channel"],
                headers=e["headers"],
                payload=b"x" * e["size"],
            )
        items.append((index, frame, tmqp.encode(frame)[0]))
    return items


def _step(kit: Kit, batched: bool, step: tuple[str, str, Any]) -> Any:
    what, client, arg = step
    if what == "batch":
        items = _items(kit, arg)
        if batched:
            outs, refused, later = kit.engine.receive_batch("p", items, kit.now)
        else:
            outs, refused, later = one_by_one(kit.engine, "p", items, kit.now)
        routed = kit.route(outs)
        return [(o.client_id, o.frame) for o in routed], refused, later
    if what == "update":
        for queue_id in (1, 2) if client == "ch" else (1,):
            kit.update("p", client, queue_id, **arg)
        return None
    if what == "join":
        outs = kit.send(client, Frame(message_type=MessageType.SERVER, content_type=Operation.JOIN,
                                      target=rnd_channel(client), message_id="j",
                                      pending_ack=True))  # fmt: skip
    elif what == "leave":
        outs = kit.send(client, Frame(message_type=MessageType.SERVER,
                                      content_type=Operation.LEAVE, target=rnd_channel(client),
                                      message_id="l", pending_ack=True))  # fmt: skip
    elif what == "transmit":
        held = kit.unsent[client]
        outs = kit.transmit(client, held if arg is None else min(arg, held))
    elif what == "reconnect":  # what it was handed and never got returns to the queues
        outs = kit.disconnect(client)
        kit.connect(client)
        kit.join(client, "ch")
    else:
        outs = kit.advance(arg)
    return [(o.client_id, o.frame) for o in outs]


def rnd_channel(client: str) -> str:
    return "ch" if client == "c1" else "ot"


def _counters(kit: Kit) -> list[tuple[Any, ...]]:
    return [
        (name, q.id, q.sequence, q.received, q.sent, q.deliveries, q.n_priority, q.n_regular,
         q.last_received, q.last_sent, q.acks, q.nacks, q.rr, len(q.pending), dict(q.used),
         q.dropped, q.duplicates, q.stalled, list(q.recent.ids), q.recent.oldest,
         q.recent.newest)
        for name, channel in sorted(kit.engine.channels.items())
        for q in channel.queues.values()
    ]  # fmt: skip


def _kits(auto_transmit: bool, auto_create: bool = True) -> tuple[Kit, Kit]:
    def config() -> BrokerConfig:
        return BrokerConfig(
            wall_clock=lambda: 1_700_000_000.0,
            auto_create_channel=auto_create,
            auto_create_queue=auto_create,
        )

    return (
        laid_out(Kit(auto_transmit=auto_transmit, config=config())),
        laid_out(Kit(auto_transmit=auto_transmit, config=config())),
    )


def laid_out(kit: Kit, **queue: Any) -> Kit:
    """``kit`` with the sessions' layout: channels ``ch`` and ``ot``, producer ``p``, the
    ``CONSUMERS`` joined to ``ch`` (``c2`` to ``ot`` too), queues ch/1 (status 1), ch/2
    (status 2) and ot/1 (status 1), each with the ``queue`` options beside its status."""
    kit.engine.create_channel("ch")
    kit.engine.create_channel("ot")
    kit.connect("p")
    for client in CONSUMERS:
        kit.connect(client)
        kit.join(client, "ch")
    kit.join("c2", "ot")
    kit.queue("p", "ch", 1, status=1, **queue)
    kit.queue("p", "ch", 2, status=2, **queue)
    kit.queue("p", "ot", 1, status=1, **queue)
    return kit


def _compare(
    steps: list[tuple[str, str, Any]], auto_transmit: bool, auto_create: bool, seed: int
) -> tuple[int, int]:
    batched, single = _kits(auto_transmit, auto_create)
    taken, refused = lockstep(batched, single, steps, seed)
    assert batched.inbox == single.inbox, seed
    return taken, refused


def lockstep(
    batched: Kit, single: Kit, steps: list[tuple[str, str, Any]], seed: int
) -> tuple[int, int]:
    """Run ``steps`` on both kits (``batched`` takes each batch whole, ``single`` frame by
    frame), checking after each that output and counters agree; the batches' pushes
    (taken, refused)."""
    taken = refused = 0
    for n, step in enumerate(steps):
        batched.now = single.now = batched.now + 0.001
        got = _step(batched, True, step)
        assert got == _step(single, False, step), (seed, n, step[0])
        assert _counters(batched) == _counters(single), (seed, n, step[0])
        if step[0] == "batch":
            taken += len(got[0])
            refused += len(got[1])
    return taken, refused


def count_runs(monkeypatch: pytest.MonkeyPatch, fanout: bool = False) -> list[int]:
    """``Queue.push_plain_run`` counting the calls that took more than one push (into a
    queue with a fan-out stream only, with ``fanout``): ``[count]``, kept up to date."""
    runs = [0]
    real = Queue.push_plain_run

    def counted(self: Queue, *args: Any) -> int:
        taken = real(self, *args)
        if taken > 1 and (not fanout or self.channel.fanout is not None):
            runs[0] += 1
        return taken

    monkeypatch.setattr(Queue, "push_plain_run", counted)
    return runs


@pytest.mark.parametrize(
    ("auto_transmit", "auto_create"),
    [(True, True), (False, True), (True, False)],
    ids=["sent-at-once", "held-back", "no-auto-create"],
)
def test_a_batch_gives_what_its_frames_give_one_by_one(
    auto_transmit: bool, auto_create: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = count_runs(monkeypatch)
    delivered = refused = 0
    for seed in range(20):
        rnd = random.Random(seed)
        steps = _session(rnd, rnd.randint(5, 40))
        got, no = _compare(steps, auto_transmit, auto_create, seed)
        delivered += got
        refused += no
    assert refused >= (5 if auto_create else 200)  # refusals by index were compared too
    assert runs[0] >= 80  # the batches went through the run path, not only one by one
    assert delivered >= 3000  # the sessions compare deliveries, not two empty outputs


def _pushes(kit: Kit, channel: str, queue_id: int, start: int, count: int) -> list[Item]:
    frames = [
        Frame(message_type=MessageType.QUEUE, content_type=queue_id, target=channel,
              message_id=f"m{start + k}", source="p", payload=b"%d" % (start + k))
        for k in range(count)
    ]  # fmt: skip
    return [(k, f, tmqp.encode(f)[0]) for k, f in enumerate(frames)]


def test_a_window_that_fills_mid_batch_loses_and_reorders_nothing() -> None:
    kit = Kit(auto_transmit=False)
    for client in ("p", "c1"):
        kit.connect(client)
    kit.join("c1", "ch")
    kit.queue("p", "ch", 1, status=1, prefetch=3)
    outs, refused, later = kit.engine.receive_batch("p", _pushes(kit, "ch", 1, 0, 10), kit.now)
    assert (refused, later) == ([], [])
    kit.route(outs)
    assert kit.payloads("c1") == [b"0", b"1", b"2"]  # its window; 7 wait
    queue = kit.engine.channels["ch"].queues[1]
    assert (queue.n_regular, queue.sequence, queue.received) == (7, 10, 10)
    outs, _, _ = kit.engine.receive_batch("p", _pushes(kit, "ch", 1, 10, 5), kit.now)
    kit.route(outs)
    assert kit.payloads("c1") == []  # behind the waiting ones
    got: list[bytes] = []
    while kit.unsent["c1"]:
        kit.transmit("c1")
        got += kit.payloads("c1")
    assert got == [b"%d" % k for k in range(3, 15)]
    assert queue.n_regular == 0


def test_deliveries_a_leaving_consumer_never_got_go_to_the_other_in_order() -> None:
    kit = Kit(auto_transmit=False)
    for client in ("p", "c1", "c2"):
        kit.connect(client)
    kit.join("c1", "ch")
    kit.join("c2", "ch")
    kit.queue("p", "ch", 1, status=2, prefetch=4)  # round robin
    outs, _, _ = kit.engine.receive_batch("p", _pushes(kit, "ch", 1, 0, 12), kit.now)
    kit.route(outs)
    assert kit.payloads("c1") == [b"0", b"2", b"4", b"6"]
    assert kit.payloads("c2") == [b"1", b"3", b"5", b"7"]  # 8..11 wait
    kit.transmit("c2", 2)  # c2 got 1 and 3; c1 got nothing before it goes
    kit.disconnect("c1")
    outs, _, _ = kit.engine.receive_batch("p", _pushes(kit, "ch", 1, 12, 3), kit.now)
    kit.route(outs)
    got = kit.payloads("c2")
    while kit.unsent["c2"]:
        kit.transmit("c2")
        got += kit.payloads("c2")
    # c1's four come back to the front (priority of the returned), then the rest in order
    assert sorted(got) == sorted(b"%d" % k for k in (0, 2, 4, 6, *range(8, 15)))
    assert [g for g in got if int(g) >= 8] == [b"%d" % k for k in range(8, 15)]
    queue = kit.engine.channels["ch"].queues[1]
    assert queue.is_empty() and queue.received == 15


def test_ids_stored_without_bookkeeping_leave_the_window_as_add_does() -> None:
    """``RecentIds.add_new`` + ``added_at`` (once per ``now``: the batch run, and
    ``push_plain`` when ``now`` moved) keep the ids and the order bounds ``add`` keeps."""
    rnd = random.Random(7)
    one, other = RecentIds(), RecentIds()
    now = 10.0
    for n in range(3000):
        now += rnd.choice([0.0, 0.0, 0.001, 1.0, -0.5])  # the same, later, or back
        mid = f"i{rnd.randrange(400)}"
        for ids in (one, other):
            ids.forget_expired(now, 2000)
        if mid in one.ids:
            continue  # (both only store ids they have not seen)
        one.add(mid, now, 50)
        other.add_new(mid, now, 50)
        if now != other.newest:
            other.added_at(now)
        assert (list(one.ids.items()), one.oldest, one.newest) == (
            list(other.ids.items()), other.oldest, other.newest), n  # fmt: skip
