"""Plain pushes read in one server drain are served as one run per producer
(``Server._serve_runs``, ``ServerOptions.push_runs``).

Against a live Server + Engine over inproc (a peer's send lands in the ROUTER's pipe at
once): the test holds the server's loop (a reader whose handler waits, ``Hold``) while the
peers send, so that everything they sent is read in one drain, deterministically.  The
differential test plays one script against a server with runs and one without and checks
both against the outcome worked out from the script by hand.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import zmq

from broker import tmqp
from broker.client.blocking import Client
from broker.client.frames import join_frame
from broker.protocol import Header, MessageType, ResultCode, header
from tests.broker.held_server import Broker, MakeBroker, held_brokers
from tests.broker.test_batch import Raw
from tests.broker.test_batch import push_frame as push
from tests.polling import wait_until

Ctx = zmq.Context[zmq.Socket[bytes]]
PING = tmqp.encode(tmqp.Ping())[0]
#: Deadline (s) of the waits on the broker's counters: each check is a request to it, and a
#: machine at load 50 must still make it (no window in these tests is a fixed time).
LOADED = 60.0
_names = itertools.count(1)


@pytest.fixture
def start(zctx: Ctx) -> Iterator[MakeBroker]:
    with held_brokers(zctx, "runs") as make:
        yield make


def frames_until(peer: Raw, last: str) -> list[tmqp.Message]:
    """What ``peer`` receives up to and including the frame with message id ``last``."""
    got: list[tmqp.Message] = []
    while True:
        msg = tmqp.decode((peer.sock.recv(),))
        got.append(msg)
        if isinstance(msg, tmqp.Frame) and msg.message_id == last:
            return got


# -- the script -----------------------------------------------------------------------------

#: queue 1: push; 2: push, at most 50 octets; 3: stopped; 4: round robin, duplicates dropped
QUEUES = {
    1: {"Status": 1},
    2: {"Status": 1, "MessageSizeLimit": 50},
    3: {"Status": 6},
    4: {"Status": 2, "UseMessageId": True, "DuplicateWindow": 100},
}
KINDS = ("plain", "plain", "plain", "plain", "acked", "header", "too big", "stopped", "rr",
         "rr again", "garbage", "ping")  # fmt: skip


@dataclass
class Script:
    """One producer's frames and what must come of them, worked out by hand."""

    frames: list[bytes]
    delivered: list[str]  # message ids the consumer gets, in order
    answers: list[tuple[str, str]]  # (what, message id) the producer gets, in order


def script(name: str, count: int, seed: int) -> Script:
    rng = random.Random(seed)
    out = Script([], [], [])
    rr: list[str] = []
    for i in range(count):
        kind = rng.choice(KINDS)
        mid = f"{name}-{i}"
        if kind == "plain":
            out.frames.append(push(mid, 1, b"p" * 20))
            out.delivered.append(mid)
        elif kind == "acked":
            out.frames.append(push(mid, 1, b"a" * 20, ack=True))
            out.delivered.append(mid)
            out.answers.append(("ack", mid))
        elif kind == "header":
            out.frames.append(push(mid, 1, b"h", headers=(("X-Note", "n"),)))
            out.delivered.append(mid)
        elif kind == "too big":
            out.frames.append(push(mid, 2, b"b" * 60, ack=rng.random() < 0.5))
            if out.frames[-1][1] & 64:
                out.answers.append(("nack", mid))
        elif kind == "stopped":
            out.frames.append(push(mid, 3, b"s"))
        elif kind == "rr":
            out.frames.append(push(mid, 4, b"r"))
            out.delivered.append(mid)
            rr.append(mid)
        elif kind == "rr again" and rr:
            out.frames.append(push(rng.choice(rr), 4, b"r"))  # a duplicate: dropped
        elif kind == "garbage":
            out.frames.append(b"\x11\x00\xff\xff\xff")  # lengths running past the end
            out.answers.append(("bad request", ""))
        elif kind == "ping":
            out.frames.append(PING)
            out.answers.append(("pong", ""))
    end = f"{name}-end"
    out.frames.append(push(end, 1, b"end", ack=True))
    out.delivered.append(end)
    out.answers.append(("ack", end))
    return out


def answer(msg: tmqp.Message) -> tuple[str, str]:
    if isinstance(msg, tmqp.Pong):
        return ("pong", "")
    assert isinstance(msg, tmqp.Frame)
    if msg.message_type == MessageType.ACK:
        return ("nack" if header(msg, Header.NACK_REASON) else "ack", msg.message_id)
    assert msg.message_type == MessageType.RESPONSE, msg
    assert msg.content_type == ResultCode.BAD_REQUEST, msg
    return ("bad request", msg.message_id)


def play(broker: Broker, ctx: Ctx, scripts: dict[str, Script]) -> dict[str, object]:
    """Every producer's script sent while the loop is held (one drain reads it all):
    per producer, the ids the consumer got (in order) and the answers it got."""
    admin = Client(broker.endpoint, context=ctx, timeout=10).connect()
    consumer = Raw(ctx, broker.endpoint)
    producers = {name: Raw(ctx, broker.endpoint) for name in scripts}
    try:
        for qid, options in QUEUES.items():
            admin.create_queue("d", qid, options)
        consumer.send(tmqp.encode(join_frame("j", "d"))[0])
        assert consumer.frame().message_id == "j"
        broker.hold.hold()
        for name, s in scripts.items():
            for data in s.frames:
                producers[name].send(data)
        broker.hold.release()
        answers = {
            name: [answer(m) for m in frames_until(producers[name], f"{name}-end")]
            for name in scripts
        }
        source = {p.client_id: name for name, p in producers.items()}
        delivered: dict[str, list[str]] = {name: [] for name in scripts}
        ends = {f"{name}-end" for name in scripts}
        while ends:
            frame = consumer.frame()
            delivered[source[frame.source]].append(frame.message_id)
            ends.discard(frame.message_id)
        runs = admin.stats()["server"]["run_pushes"]
        return {"answers": answers, "delivered": delivered, "runs": runs}
    finally:
        admin.close()
        consumer.close()
        for p in producers.values():
            p.close()


def test_runs_and_one_by_one_give_what_the_script_says(start: MakeBroker, zctx: Ctx) -> None:
    scripts = {name: script(name, 400, seed) for name, seed in (("p1", 1), ("p2", 2))}
    with_runs = play(start(), zctx, scripts)
    one_by_one = play(start(push_runs=False), zctx, scripts)
    for name, s in scripts.items():
        assert with_runs["delivered"][name] == s.delivered  # type: ignore[index]
        assert with_runs["answers"][name] == s.answers  # type: ignore[index]
        assert one_by_one["delivered"][name] == s.delivered  # type: ignore[index]
        assert one_by_one["answers"][name] == s.answers  # type: ignore[index]
    assert one_by_one["runs"] == 0
    # the plain pushes into queue 1 came in runs (of one producer, between other frames)
    assert with_runs["runs"] > 0


def test_garbage_in_the_middle_of_a_drain_leaves_the_other_pushes_served(
    start: MakeBroker, zctx: Ctx
) -> None:
    broker = start()
    admin = Client(broker.endpoint, context=zctx, timeout=10).connect()
    consumer = Raw(zctx, broker.endpoint)
    producer = Raw(zctx, broker.endpoint)
    try:
        admin.create_queue("d", 1, QUEUES[1])
        consumer.send(tmqp.encode(join_frame("j", "d"))[0])
        assert consumer.frame().message_id == "j"
        broker.hold.hold()
        ids = [f"m{i}" for i in range(300)]
        for mid in ids[:100]:
            producer.send(push(mid, 1, b"x"))
        producer.send(b"\x11\x00\xff\xff\xff")  # a QUEUE frame whose lengths run past its end
        for mid in ids[100:200]:
            producer.send(push(mid, 1, b"x"))
        producer.sock.send_multipart([b"two", b"parts"])  # not one frame per message
        for mid in ids[200:]:
            producer.send(push(mid, 1, b"x"))
        producer.send(PING)
        broker.hold.release()
        got = [consumer.frame().message_id for _ in ids]
        assert got == ids
        replies = [tmqp.decode((producer.sock.recv(),)) for _ in range(3)]
        assert [type(r) for r in replies] == [tmqp.Frame, tmqp.Frame, tmqp.Pong]
        assert [r.content_type for r in replies[:2]] == [ResultCode.BAD_REQUEST] * 2  # type: ignore[union-attr]
        assert admin.stats()["server"]["run_pushes"] >= 297  # three runs, none of one
    finally:
        admin.close()
        consumer.close()
        producer.close()


def _answer(frame: tmqp.Message) -> tuple[str, object]:
    """An acknowledge as (message id, its Nack-Reason or None); another frame as its
    kind and code."""
    if type(frame) is tmqp.Frame and frame.message_type == MessageType.ACK:
        return frame.message_id, header(frame, Header.NACK_REASON)
    if type(frame) is tmqp.Frame:
        return "frame", frame.content_type
    return type(frame).__name__, None


def test_acknowledged_pushes_around_garbage_are_each_answered_once_in_order(
    start: MakeBroker, zctx: Ctx
) -> None:
    """Acknowledged single pushes read in one drain, with garbage and a two-part message
    between them and every 37th too large for the queue: the server serves them as runs
    of their producer (``Engine.receive_pushes``), and the producer gets exactly one answer
    per push in the order it sent them (a negative one for each too large), the two
    refusals where the garbage was; the consumer gets every push taken, in order."""
    broker = start()
    admin = Client(broker.endpoint, context=zctx, timeout=10).connect()
    consumer = Raw(zctx, broker.endpoint)
    producer = Raw(zctx, broker.endpoint)
    try:
        admin.create_queue("d", 2, QUEUES[2])
        consumer.send(tmqp.encode(join_frame("j", "d"))[0])
        assert consumer.frame().message_id == "j"
        broker.hold.hold()
        ids = [f"m{i}" for i in range(300)]
        big = {i for i in range(0, 300, 37)}
        for i, mid in enumerate(ids):
            if i == 100:
                producer.send(b"\x11\x00\xff\xff\xff")  # lengths that run past its end
            if i == 200:
                producer.sock.send_multipart([b"two", b"parts"])  # not one frame per message
            producer.send(push(mid, 2, b"x" * (60 if i in big else 1), ack=True))
        producer.send(PING)
        broker.hold.release()
        answers = [_answer(tmqp.decode((producer.sock.recv(),))) for _ in range(len(ids) + 3)]
        bad = ("frame", ResultCode.BAD_REQUEST)
        said = [(mid, "no" if nack else "yes") for mid, nack in answers if mid.startswith("m")]
        assert said == [(mid, "no" if i in big else "yes") for i, mid in enumerate(ids)]
        assert [a for a in answers if not a[0].startswith("m")] == [bad, bad, ("Pong", None)]
        assert answers.index(bad) == 100 and answers.index(bad, 101) == 201
        taken = [mid for i, mid in enumerate(ids) if i not in big]
        assert [consumer.frame().message_id for _ in taken] == taken
        assert admin.stats()["server"]["run_pushes"] >= 297  # three runs, none of one
    finally:
        admin.close()
        consumer.close()
        producer.close()


def test_a_consumer_that_stops_reading_holds_at_most_its_window_beyond_the_pipe(
    start: MakeBroker, zctx: Ctx
) -> None:
    hwm, window, total = 100, 50, 3000
    broker = start(hwm=hwm)
    admin = Client(broker.endpoint, context=zctx, timeout=10).connect()
    consumer = Raw(zctx, broker.endpoint)
    producer = Raw(zctx, broker.endpoint)
    # over inproc a pipe holds the sender's high-water mark plus the receiver's
    pipe = hwm + consumer.sock.rcvhwm

    def info() -> dict[str, int]:
        return admin.queue_info("d", 1)  # type: ignore[no-any-return]

    try:
        admin.create_queue("d", 1, QUEUES[1])
        consumer.send(tmqp.encode(join_frame("j", "d", window))[0])
        assert consumer.frame().message_id == "j"
        # (held, the pipe into the server takes at least its hwm without blocking)
        for first in range(0, total, hwm):
            broker.hold.hold()
            for i in range(first, first + hwm):
                producer.send(push(f"m{i}", 1, b"x" * 20))
            broker.hold.release()
        assert wait_until(lambda: info()["ReceivedMessages"] == total, LOADED)
        # the consumer reads nothing: its pipe fills (libzmq took those: delivered), its
        # window waits in its backlog (in flight), the rest in the queue: nothing lost,
        # nothing beyond the bounds

        def held() -> bool:
            i = info()
            return i["InFlight"] == window and i["Messages"] + i["Deliveries"] + window == total

        assert wait_until(held, LOADED), str(info())
        sent = info()["Deliveries"]
        assert sent <= pipe, (sent, pipe)
        got = [consumer.frame().message_id for _ in range(total)]
        assert got == [f"m{i}" for i in range(total)]
        assert wait_until(lambda: (info()["Messages"], info()["Deliveries"]) == (0, total), LOADED)
        assert admin.stats()["server"]["run_pushes"] > 0
    finally:
        admin.close()
        consumer.close()
        producer.close()


def test_damaged_frames_in_a_run_are_answered_in_order_and_the_others_served(
    start: MakeBroker, zctx: Ctx
) -> None:
    """Frames whose first two octets say "plain push" (gathered undecoded) but that do not
    decode: cut short, trailing octets, an id that is not UTF-8, lengths past the end,
    the bare two octets.  Each is answered 400 with the id salvaged from it, in the order
    sent; every push around them is delivered, in order."""
    broker = start()
    admin = Client(broker.endpoint, context=zctx, timeout=10).connect()
    consumer = Raw(zctx, broker.endpoint)
    producer = Raw(zctx, broker.endpoint)
    damaged = [
        (push("cut-1", 1, b"y" * 30)[:-7], "cut-1"),
        (push("long-2", 1, b"y") + b"!!", "long-2"),
        (bytes([0x11, 0x10, 2, 0, 1, 1, 0, 1]) + b"\xff\xfe" + b"d" + b"y", ""),
        (b"\x11\x00\xff\xff\xff", ""),
        (b"\x11\x00", ""),
    ]
    try:
        admin.create_queue("d", 1, QUEUES[1])
        consumer.send(tmqp.encode(join_frame("j", "d"))[0])
        assert consumer.frame().message_id == "j"
        broker.hold.hold()
        ids = []
        for n, (data, _mid) in enumerate(damaged):
            for i in range(20):
                ids.append(f"m{n}-{i}")
                producer.send(push(ids[-1], 1, b"x"))
            producer.send(data)
        ids.append("last")
        producer.send(push("last", 1, b"x"))
        producer.send(PING)
        broker.hold.release()
        assert [consumer.frame().message_id for _ in ids] == ids
        replies = [tmqp.decode((producer.sock.recv(),)) for _ in range(len(damaged) + 1)]
        assert isinstance(replies[-1], tmqp.Pong)
        errors = replies[:-1]
        assert all(isinstance(r, tmqp.Frame) for r in errors), errors
        assert [r.content_type for r in errors] == [ResultCode.BAD_REQUEST] * len(damaged)  # type: ignore[union-attr]
        assert [r.message_id for r in errors] == [mid for _, mid in damaged]  # type: ignore[union-attr]
        assert all("malformed frame" in (header(r, Header.REASON) or "") for r in errors)  # type: ignore[arg-type]
        stats = admin.stats()["server"]
        assert stats["bad_frames"] == len(damaged)
        # served in runs: all but the drain's first (straight through) and "last" (a run
        # of one after the last damaged frame, not counted)
        assert stats["run_pushes"] == len(ids) - 2
    finally:
        admin.close()
        consumer.close()
        producer.close()


def _batch_of(mid: str, entries: list[bytes], ack: bool) -> bytes:
    payload = b"".join(len(e).to_bytes(4, "little") + e for e in entries)
    return tmqp.encode_frame(message_type=MessageType.SERVER, pending_ack=ack,
                             content_type=260, message_id=mid, payload=payload)[0]  # fmt: skip


def _batches() -> list[tuple[str, bool, list[bytes]]]:
    """Batches of plain pushes (the server's record path) and others (its frame path)."""
    plain = [push(f"a{i}", 1, b"p" * 20) for i in range(30)]
    return [
        ("plain, acknowledged", True, plain),
        ("plain, not acknowledged", False, [push(f"n{i}", 1, b"n") for i in range(10)]),
        ("plain into a stopped and a size-limited queue", True,
         [push("s1", 3, b"s"), push("big", 2, b"b" * 60), push("ok", 1, b"k")]),
        ("plain into a queue made on the way", True, [push("q9", 9, b"x"), push("q1", 1, b"y")]),
        ("plain with duplicates into the round robin queue", True,
         [push("r1", 4, b"r"), push("r1", 4, b"r"), push("r2", 4, b"r")]),
        ("one not decoding", True, [push("g0", 1, b"g"), push("g1", 1, b"g")[:-3],
                                    push("g2", 1, b"g")]),
        ("one acknowledged push among them", True, [push("k0", 1, b"k"),
                                                    push("k1", 1, b"k", ack=True)]),
        ("one with a header", True, [push("h0", 1, b"h"), push("h1", 1, b"h",
                                                              headers=(("X", "y"),))]),
        # (the first entry alone tells these are not all plain: never split for the check)
        ("acknowledged first", True, [push("f0", 1, b"f" * 4096, ack=True), push("f1", 1, b"f")]),
        ("a header first", True, [push("x0", 1, b"x", headers=(("X", "y"),)),
                                  push("x1", 1, b"x")]),
        ("a one-octet entry first", True, [b"\x02", push("o1", 1, b"o")]),
    ]  # fmt: skip


Played = tuple[list[tuple[str, int, bytes]], list[str], dict[int, int], int]


def _play_batches(broker: Broker, ctx: Ctx) -> Played:
    """Each batch, then an acknowledged push (its acknowledge: the batch was served): the
    producer's answers, the ids the consumer got, what each queue received, batched_in."""
    admin = Client(broker.endpoint, context=ctx, timeout=10).connect()
    consumer = Raw(ctx, broker.endpoint)
    producer = Raw(ctx, broker.endpoint)
    try:
        for qid, options in QUEUES.items():
            admin.create_queue("d", qid, options)
        consumer.send(tmqp.encode(join_frame("j", "d"))[0])
        assert consumer.frame().message_id == "j"
        answers: list[tuple[str, int, bytes]] = []
        for n, (_name, ack, entries) in enumerate(_batches()):
            producer.send(_batch_of(f"B{n}", entries, ack))
            producer.send(push(f"end{n}", 1, b"e", ack=True))
            while True:
                frame = producer.frame()
                if frame.message_id == f"end{n}":
                    break
                answers.append((frame.message_id, frame.message_type, frame.payload))
        delivered: list[str] = []
        while not delivered or delivered[-1] != f"end{len(_batches()) - 1}":
            delivered.append(consumer.frame().message_id)
        info = {qid: admin.queue_info("d", qid)["ReceivedMessages"] for qid in QUEUES}
        return answers, delivered, info, admin.stats()["server"]["batched_in"]
    finally:
        admin.close()
        consumer.close()
        producer.close()


def test_batches_of_plain_pushes_give_what_the_frame_path_gives(
    start: MakeBroker, zctx: Ctx
) -> None:
    """A batch whose entries are all plain pushes goes to the engine as one run of records
    (``Server._plain_batch``); any other batch as frames (``Engine.receive_batch``, the
    path a server with ``push_runs`` off takes for every batch): the same answers, the
    same deliveries, the same queues."""
    records = _play_batches(start(), zctx)
    frames = _play_batches(start(push_runs=False), zctx)
    assert records == frames
    # (worked out by hand: the refusals and what the consumer got)
    answers, delivered, _received, batched_in = records
    assert batched_in == sum(len(entries) for _n, _a, entries in _batches())
    acks = {mid: payload for mid, _mt, payload in answers}
    assert acks["B0"] == acks["B3"] == acks["B4"] == b""  # all taken (r1 again: taken before)
    # an acknowledged batch names its plain pushes not taken (before: b"", "all taken")
    assert json.loads(acks["B2"])["Refused"] == [
        [0, "unacceptable", "push refused by the queue"],  # s1: queue 3 is stopped
        [1, "limit-exceeded", "push refused by the queue"],  # big: 60 octets over 50
    ]
    assert "B1" not in acks  # not acknowledged
    assert [r[0] for r in json.loads(acks["B5"])["Refused"]] == [1]
    assert delivered[:30] == [f"a{i}" for i in range(30)]
    assert [r[0] for r in json.loads(acks["B10"])["Refused"]] == [0]
    for mid in ("ok", "q9", "q1", "r1", "r2", "g0", "g2", "k0", "k1", "h0", "h1", "f0", "f1",
                "x0", "x1", "o1"):  # fmt: skip
        assert mid in delivered
    for mid in ("s1", "big", "g1"):
        assert mid not in delivered
    assert delivered.count("r1") == 1
