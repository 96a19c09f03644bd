"""A producer's run of plain pushes delivered to its queue's one consumer as the octets
they came in (``Engine.receive_push_octets``, ``broker.engine.octets_run``,
``ServerOptions.push_octets``).

Against a live Server + Engine over inproc, the server's loop held while the peers send
(``test_push_runs.Hold``: one drain reads a whole script).  The producer stamps its own
client id as the source, as the client library does (only such a push can leave as it
came).  Every test is the adversary's: a run broken by duplicates, by garbage, by a full
window, by a second consumer joining, by the consumer stopping or leaving while its
deliveries wait unsent; each checks what the consumers and the producer get against the
record path (``push_octets=False``) or against the script worked out by hand.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from broker import batch, tmqp
from broker.client.blocking import Client
from broker.client.frames import join_frame
from broker.protocol import MessageType, ResultCode
from tests.broker.held_server import Broker, MakeBroker, held_brokers
from tests.broker.test_batch import Raw, push_frame
from tests.broker.test_push_runs import LOADED, PING, answer
from tests.polling import wait_until

Ctx = zmq.Context[zmq.Socket[bytes]]
_names = itertools.count(1)

#: queue 1: push; 2: push, ids used, duplicates dropped (a window of 100); 3: push, at most
#: 50 octets
QUEUES = {
    1: {"Status": 1},
    2: {"Status": 1, "UseMessageId": True, "DuplicateWindow": 100},
    3: {"Status": 1, "MessageSizeLimit": 50},
}


@pytest.fixture
def start(zctx: Ctx) -> Iterator[MakeBroker]:
    with held_brokers(zctx, "octets") as make:
        yield make


def push(source: str, mid: str, queue_id: int, body: bytes, **fields: Any) -> bytes:
    """A push into channel ``d`` stamped with ``source`` (``test_batch.push_frame``)."""
    return push_frame(mid, queue_id, body, source=source, **fields)


class Peers:
    """A test's peers of one broker: an admin client, a producer (``src``: its client
    id) and the consumers it adds, all closed together (``with``)."""

    def __init__(self, ctx: Ctx, broker: Broker) -> None:
        self.ctx, self.broker = ctx, broker
        self.consumers: list[Raw] = []
        self.admin = Client(broker.endpoint, context=ctx, timeout=10).connect()
        try:
            self.producer = Raw(ctx, broker.endpoint)
        except BaseException:
            self.admin.close()
            raise
        self.src = self.producer.client_id

    def raw(self) -> Raw:
        """A consumer that has not joined yet."""
        consumer = Raw(self.ctx, self.broker.endpoint)
        self.consumers.append(consumer)
        return consumer

    def joined(self, window: int | None = None, name: str = "j") -> Raw:
        """A consumer joined to channel ``d`` (its JOIN answered)."""
        consumer = self.raw()
        consumer.send(tmqp.encode(join_frame(name, "d", window))[0])
        assert consumer.frame().message_id == name
        return consumer

    def push_drains(self, mids: list[str], queue_id: int, body: bytes, per: int = 100) -> None:
        """The producer's pushes of ``mids``, ``per`` to a drain (the loop held while
        each drain's are sent)."""
        for at in range(0, len(mids), per):
            self.broker.hold.hold()
            for mid in mids[at : at + per]:
                self.producer.send(push(self.src, mid, queue_id, body))
            self.broker.hold.release()

    def __enter__(self) -> Peers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.admin.close()
        for consumer in self.consumers:
            consumer.close()
        self.producer.close()


def next_ids(consumer: Raw, count: int) -> list[str]:
    """The message ids of ``consumer``'s next ``count`` frames."""
    return [consumer.frame().message_id for _ in range(count)]


def counters(admin: Client) -> dict[str, int]:
    return admin.stats()["server"]  # type: ignore[no-any-return]


def queue_info(admin: Client, qid: int = 1) -> dict[str, int]:
    return admin.queue_info("d", qid)  # type: ignore[no-any-return]


# -- the differential script -----------------------------------------------------------

KINDS = ("plain", "plain", "plain", "plain", "plain", "plain", "dedupe", "dedupe", "again",
         "acked", "header", "unstamped", "too big", "fits", "garbage", "not utf-8",
         "long", "cut", "ping")  # fmt: skip


def script(source: str, count: int, seed: int) -> list[bytes]:
    """A producer's frames: mostly runs of plain pushes, broken by every kind of frame
    that must leave the octets path (and some that may stay on it)."""
    rng = random.Random(seed)
    frames: list[bytes] = []
    ids: list[str] = []
    for i in range(count):
        kind = rng.choice(KINDS)
        mid = f"m{i}"
        body = bytes([i % 251]) * rng.randint(0, 40)
        if kind == "plain":
            frames.append(push(source, mid, 1, body))
        elif kind == "dedupe":
            frames.append(push(source, mid, 2, body))
            ids.append(mid)
        elif kind == "again" and ids:
            frames.append(push(source, rng.choice(ids), 2, body))  # a duplicate: dropped
        elif kind == "acked":
            frames.append(push(source, mid, 1, body, ack=True))
        elif kind == "header":
            frames.append(push(source, mid, 1, body, headers=(("X-Note", "n"),)))
        elif kind == "unstamped":
            frames.append(push("", mid, 1, body))  # the server stamps the source
        elif kind == "too big":
            frames.append(push(source, mid, 3, b"b" * 60))
        elif kind == "fits":
            frames.append(push(source, mid, 3, b"b" * 50))
        elif kind == "garbage":
            frames.append(b"\x11\x00\xff\xff\xff")
        elif kind == "not utf-8":
            good = push(source, "\u00e9" + mid, 1, body)  # the id's first octet: 0xc3
            frames.append(good[:8] + b"\xff" + good[9:])
        elif kind == "long":
            frames.append(push(source, mid, 1, body) + b"!")
        elif kind == "cut":
            frames.append(push(source, mid, 1, body + b"xyz")[:-2])
        elif kind == "ping":
            frames.append(PING)
    frames.append(push(source, "end", 1, b"end", ack=True))
    return frames


def play(broker: Broker, ctx: Ctx, count: int, seed: int) -> dict[str, object]:
    """One producer's script sent while the loop is held: the octets the consumer got (in
    order), the answers the producer got, the server's counters."""
    with Peers(ctx, broker) as peers:
        for qid, options in QUEUES.items():
            peers.admin.create_queue("d", qid, options)
        consumer = peers.joined()
        broker.hold.hold()
        for data in script(peers.src, count, seed):
            peers.producer.send(data)
        broker.hold.release()
        answers = []
        while True:
            msg = tmqp.decode((peers.producer.sock.recv(),))
            answers.append(answer(msg))
            if answers[-1] == ("ack", "end"):
                break
        delivered = octets_until_end(consumer)
        return {"answers": answers, "delivered": delivered, "counters": counters(peers.admin)}


def octets_until_end(consumer: Raw) -> list[bytes]:
    """The octets of each frame ``consumer`` gets, up to the message ``end``."""
    delivered = []
    while True:
        data = consumer.sock.recv()
        delivered.append(data)
        if tmqp.decode((data,)).message_id == "end":  # type: ignore[union-attr]
            return delivered


def same_source(delivered: list[bytes]) -> list[tmqp.Message]:
    """The deliveries decoded, the producer's client id (each broker gives its own) as
    one name."""
    return [tmqp.decode((data,)).replace(source="P") for data in delivered]  # type: ignore[union-attr]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_octets_and_records_give_the_same_octets_and_answers(
    start: MakeBroker, zctx: Ctx, seed: int
) -> None:
    """Runs of plain pushes broken by duplicates (inside one run), acknowledged pushes,
    pushes with headers, unstamped ones, ones over the queue's size limit, garbage, ids
    that are not UTF-8, frames too long or cut short and PINGs: the consumer gets the
    same octets in the same order, the producer the same answers, with the octets path
    as without it; and the octets path took pushes."""
    octets = play(start(), zctx, 600, seed)
    records = play(start(push_octets=False), zctx, 600, seed)
    assert same_source(octets["delivered"]) == same_source(records["delivered"])  # type: ignore[arg-type]
    assert octets["answers"] == records["answers"]
    assert octets["counters"]["octets_pushes"] > 0  # type: ignore[index]
    assert records["counters"]["octets_pushes"] == 0  # type: ignore[index]
    bad = [a for a in octets["answers"] if a[0] == "bad request"]  # type: ignore[attr-defined]
    assert bad  # (the script has garbage: each frame answered, the rest served)


def test_duplicate_ids_inside_one_run_are_dropped_as_before(start: MakeBroker, zctx: Ctx) -> None:
    broker = start()
    with Peers(zctx, broker) as peers:
        admin, producer, src = peers.admin, peers.producer, peers.src
        admin.create_queue("d", 2, QUEUES[2])
        consumer = peers.joined()
        sent = ["a", "b", "c", "a", "d", "b", "b", "e", "c", "f"]
        broker.hold.hold()
        for mid in sent:
            producer.send(push(src, mid, 2, mid.encode()))
        producer.send(push(src, "last", 2, b"", ack=True))
        broker.hold.release()
        got = [consumer.frame() for _ in range(7)]
        assert [f.message_id for f in got] == ["a", "b", "c", "d", "e", "f", "last"]
        assert [f.payload for f in got[:6]] == [b"a", b"b", b"c", b"d", b"e", b"f"]
        assert answer(tmqp.decode((producer.sock.recv(),))) == ("ack", "last")
        # and the window remembers them: a later run's duplicate is dropped too
        broker.hold.hold()
        for mid in ("g", "a", "h", "f"):
            producer.send(push(src, mid, 2, b""))
        producer.send(push(src, "end", 2, b"", ack=True))
        broker.hold.release()
        assert next_ids(consumer, 3) == ["g", "h", "end"]
        assert counters(admin)["octets_pushes"] > 0
        assert queue_info(admin, 2)["ReceivedMessages"] == 10


def test_a_malformed_push_inside_a_run_is_refused_and_the_good_ones_delivered(
    start: MakeBroker, zctx: Ctx
) -> None:
    """Frames whose first octets say "plain push" but whose octets do not decode, each
    in the middle of a run of good ones: every good one delivered in order, each bad one
    answered 400 in its place, and the server keeps serving (a PING after them)."""
    broker = start()
    with Peers(zctx, broker) as peers:
        admin, producer, src = peers.admin, peers.producer, peers.src
        good = push(src, "\u00e9t\u00e9", 1, b"y")
        damaged = [
            push(src, "cut", 1, b"y" * 30)[:-7],  # cut short
            push(src, "long", 1, b"y") + b"!!",  # trailing octets
            good[:8] + b"\xff" + good[9:],  # an id that is not UTF-8
            good[:13] + b"\xff" + good[14:],  # a source that is not UTF-8 (the same lengths)
            b"\x11\x00\xff\xff\xff",  # lengths past the end
            b"\x11\x00",  # the bare two octets
        ]
        admin.create_queue("d", 1, QUEUES[1])
        consumer = peers.joined()
        broker.hold.hold()
        ids = []
        for n, data in enumerate(damaged):
            for i in range(20):
                ids.append(f"m{n}-{i}")
                producer.send(push(src, ids[-1], 1, b"x"))
            producer.send(data)
        ids.append("last")
        producer.send(push(src, "last", 1, b"x"))
        producer.send(PING)
        broker.hold.release()
        assert [consumer.frame().message_id for _ in ids] == ids
        replies = [tmqp.decode((producer.sock.recv(),)) for _ in range(len(damaged) + 1)]
        assert [type(r) for r in replies] == [tmqp.Frame] * len(damaged) + [tmqp.Pong]
        codes = [r.content_type for r in replies[:-1]]  # type: ignore[union-attr]
        assert codes == [ResultCode.BAD_REQUEST] * len(damaged)
        assert counters(admin)["octets_pushes"] >= len(ids) - len(damaged) - 1
        # still serving: another run goes through
        after = [f"after-{i}" for i in range(10)]
        peers.push_drains(after, 1, b"z")
        assert next_ids(consumer, len(after)) == after


def test_a_run_that_fills_the_consumers_window_half_way_waits_for_the_rest(
    start: MakeBroker, zctx: Ctx
) -> None:
    """A window of 50 and a run of 400: the pushes beyond the window wait in the queue
    (no message lost, none overtaking), then follow in order as the window frees."""
    window, total = 50, 400
    broker = start()
    with Peers(zctx, broker) as peers:
        admin = peers.admin
        admin.create_queue("d", 1, QUEUES[1])
        consumer = peers.joined(window)
        ids = [f"m{i}" for i in range(total)]
        peers.push_drains(ids, 1, b"x" * 20, per=total)  # (one drain)
        assert next_ids(consumer, total) == ids
        taken = counters(admin)["octets_pushes"]
        assert 0 < taken <= window  # (the window's worth as octets, the rest queued)
        assert wait_until(lambda: queue_info(admin)["Deliveries"] == total, LOADED)
        assert queue_info(admin)["Messages"] == 0


def _read_until(consumers: dict[str, Raw], last: str) -> dict[str, list[str]]:
    """The message ids each consumer gets up to ``last`` (which every one gets)."""
    got: dict[str, list[str]] = {name: [] for name in consumers}
    for name, consumer in consumers.items():
        while not got[name] or got[name][-1] != last:
            got[name].append(consumer.frame().message_id)
    return got


def _join_mid_drain(peers: Peers, queue_id: int) -> tuple[Raw, Raw, list[str]]:
    """A first consumer joined (``j1``), then 300 pushes of the producer into queue
    ``queue_id`` of channel ``d``: 100 in a drain of their own (the first consumer's
    alone: as octets), then a second consumer's JOIN (``j2``) read in the middle of the
    next drain (between two pushes: the ROUTER's fair queueing).  The two consumers and
    the ids pushed, once the JOIN is answered."""
    first = peers.joined(name="j1")
    second = peers.raw()
    src, producer, hold = peers.src, peers.producer, peers.broker.hold
    ids = [f"m{i}" for i in range(300)]
    peers.push_drains(ids[:100], queue_id, b"x")
    hold.hold()
    for mid in ids[100:150]:
        producer.send(push(src, mid, queue_id, b"x"))
    second.send(tmqp.encode(join_frame("j2", "d"))[0])
    for mid in ids[150:]:
        producer.send(push(src, mid, queue_id, b"x"))
    hold.release()
    assert second.frame().message_id == "j2"
    return first, second, ids


@pytest.mark.parametrize("octets", [True, False])
def test_a_second_consumer_joining_mid_drain_of_a_push_queue_gets_copies_from_then_on(
    start: MakeBroker, zctx: Ctx, octets: bool
) -> None:
    """A push queue (a copy to every consumer): a second consumer's JOIN read in the
    middle of a drain of one producer's pushes (the ROUTER's fair queueing puts it
    between two of them).  The first consumer gets every push once, in order; the second
    a tail of them (from where its JOIN was read), in order, none twice."""
    with Peers(zctx, start(push_octets=octets)) as peers:
        peers.admin.create_queue("d", 1, QUEUES[1])
        first, second, ids = _join_mid_drain(peers, 1)
        peers.producer.send(push(peers.src, "end", 1, b"x"))
        got = _read_until({"first": first, "second": second}, "end")
        assert got["first"] == [*ids, "end"]
        tail = got["second"]
        assert tail == [*ids, "end"][len(ids) + 1 - len(tail) :]  # a tail, in order
        assert len(tail) > 1
        if octets:
            assert counters(peers.admin)["octets_pushes"] > 0


def test_a_second_consumer_joining_mid_drain_of_a_round_robin_queue_shares_the_rest(
    start: MakeBroker, zctx: Ctx
) -> None:
    """A round robin queue (each push to one consumer): a second consumer's JOIN read in
    the middle of a drain; every push delivered exactly once to one of them, each
    consumer's in order, both get some (a run of the pushes after it alternates)."""
    with Peers(zctx, start()) as peers:
        admin, producer = peers.admin, peers.producer
        admin.create_queue("d", 4, {"Status": 2})
        first, second, ids = _join_mid_drain(peers, 4)
        producer.send(push(peers.src, "end", 4, b"x", ack=True))
        assert answer(tmqp.decode((producer.sock.recv(),))) == ("ack", "end")
        assert wait_until(lambda: queue_info(admin, 4)["Deliveries"] == len(ids) + 1, LOADED)
        got: dict[str, list[str]] = {"first": [], "second": []}
        for name, consumer in (("first", first), ("second", second)):
            while consumer.sock.poll(0):
                got[name].append(consumer.frame().message_id)
        both = got["first"] + got["second"]
        assert sorted(both) == sorted([*ids, "end"])  # each exactly once
        order = {mid: i for i, mid in enumerate([*ids, "end"])}
        for mids in got.values():
            assert mids == sorted(mids, key=order.__getitem__)  # each in order
            assert mids
        assert counters(admin)["octets_pushes"] > 0


def _unread(peers: Peers, window: int, total: int, name: str) -> tuple[Raw, list[str]]:
    """A consumer joined with ``window`` (as ``name``) that reads nothing yet, then
    ``total`` pushes into queue 1 in drains of 100 (the octets path takes them), all
    received.  The consumer and the ids pushed."""
    admin = peers.admin
    admin.create_queue("d", 1, QUEUES[1])
    consumer = peers.joined(window, name=name)
    ids = [f"m{i}" for i in range(total)]
    peers.push_drains(ids, 1, b"x" * 20)
    assert wait_until(lambda: queue_info(admin)["ReceivedMessages"] == total, LOADED)
    return consumer, ids


def test_a_consumer_that_stops_reading_holds_at_most_its_window_beyond_the_pipe(
    start: MakeBroker, zctx: Ctx
) -> None:
    """As ``test_push_runs``'s, with pushes the octets path takes: the consumer's pipe
    fills, its window waits in its backlog, the rest in the queue; then all in order."""
    hwm, window, total = 100, 50, 3000
    with Peers(zctx, start(hwm=hwm)) as peers:
        admin = peers.admin
        consumer, ids = _unread(peers, window, total, "j")
        pipe = hwm + consumer.sock.rcvhwm  # (over inproc: both high-water marks)

        def held() -> bool:
            i = queue_info(admin)
            return i["InFlight"] == window and i["Messages"] + i["Deliveries"] + window == total

        assert wait_until(held, LOADED), str(queue_info(admin))
        assert queue_info(admin)["Deliveries"] <= pipe
        assert counters(admin)["octets_pushes"] > 0
        assert next_ids(consumer, total) == ids
        assert wait_until(lambda: queue_info(admin)["Deliveries"] == total, LOADED)


def test_deliveries_unsent_when_the_consumer_leaves_go_back_to_the_queue_in_order(
    start: MakeBroker, zctx: Ctx
) -> None:
    """The consumer stops reading, so its window of octets deliveries waits unsent in its
    backlog; it then says goodbye.  Those deliveries go back to the front of the queue
    (nothing lost) and the next consumer gets exactly what the first never got, in order,
    none marked redelivered (the first never had them), each once."""
    hwm, window, total = 50, 400, 3000
    with Peers(zctx, start(hwm=hwm)) as peers:
        admin, producer, src = peers.admin, peers.producer, peers.src
        first, ids = _unread(peers, window, total, "j1")
        assert wait_until(lambda: queue_info(admin)["InFlight"] == window, LOADED)
        taken_first = counters(admin)["octets_pushes"]
        assert taken_first >= window  # (its window was filled by the octets path)
        delivered = queue_info(admin)["Deliveries"]  # what libzmq took for it: a prefix
        first.send(tmqp.encode(tmqp.Frame(message_type=MessageType.TERMINATE))[0])
        assert wait_until(lambda: queue_info(admin)["InFlight"] == 0, LOADED)
        assert queue_info(admin)["Messages"] == total - delivered  # back, nothing lost
        # what the first consumer's pipe got: a prefix, in order
        had = []
        while first.sock.poll(100):
            had.append(first.frame().message_id)
        assert had == ids[: len(had)] and len(had) <= delivered
        second = peers.joined(name="j2")
        rest = [second.frame() for _ in range(total - delivered)]
        assert [f.message_id for f in rest] == ids[delivered:]
        assert all(not f.headers for f in rest)  # no Delivery-Count: never had them
        producer.send(push(src, "end", 1, b"", ack=True))
        assert second.frame().message_id == "end"  # and nothing more before it


def play_batches(broker: Broker, ctx: Ctx, seed: int) -> dict[str, object]:
    """One producer's batches of plain pushes (waiting for no acknowledge; some with
    damaged entries, duplicates, entries for another queue), then an acknowledged push:
    the octets the consumer got, the server's counters."""
    rng = random.Random(seed)
    with Peers(ctx, broker) as peers:
        admin, producer, src = peers.admin, peers.producer, peers.src
        for qid, options in QUEUES.items():
            admin.create_queue("d", qid, options)
        consumer = peers.joined()
        frames = script(src, 1500, seed)[:-1]
        plain = [f for f in frames if len(f) > 1 and f[0] & 63 == 0x11 and not f[1] & 0xE0]
        broker.hold.hold()
        at = 0
        while at < len(plain):
            size = rng.randint(1, 80)
            producer.send(batch.batch_frame(f"b{at}", src, plain[at : at + size], False))
            at += size
        broker.hold.release()
        producer.send(push(src, "end", 1, b"end", ack=True))
        assert answer(tmqp.decode((producer.sock.recv(),))) == ("ack", "end")
        return {"delivered": octets_until_end(consumer), "counters": counters(admin)}


@pytest.mark.parametrize("seed", [4, 5])
def test_batches_of_plain_pushes_give_the_same_deliveries_as_octets_and_as_records(
    start: MakeBroker, zctx: Ctx, seed: int
) -> None:
    """TMQP batches of plain pushes that wait for no acknowledge, some holding damaged
    entries (refused, counted), duplicates, pushes over a size limit or for other
    queues: what the consumer gets with the octets path is what it gets without."""
    octets = play_batches(start(), zctx, seed)
    records = play_batches(start(push_octets=False), zctx, seed)
    assert same_source(octets["delivered"]) == same_source(records["delivered"])  # type: ignore[arg-type]
    assert octets["counters"]["octets_pushes"] > 0  # type: ignore[index]
    assert octets["counters"]["batch_refused"] > 0  # type: ignore[index]
