"""STOMP door per-frame paths in one process, no sockets: CPU time per SEND parsed and
per MESSAGE encoded, for this checkout and (``--baseline CHECKOUT``) another one.

* parse: a stomp.py-like run of SEND frames (destination, content-length, receipt,
  100-byte body) fed to ``FrameParser`` in 64 KiB reads as the session reads them (since
  session 21 ``feed_streaks_until_error``: SENDs of one repeated head as one streak; a
  checkout without it: ``feed``); every head alike (as stomp.py's auto-ack SENDs), and
  (``a receipt each``) a receipt per SEND, ``receipt:N``;
* send spec: ``parse_send_control`` of each parsed SEND (what the session did per SEND
  of a run before session 20);
* run of SENDs: what the session does per SEND of a run of what that parse gave
  (``read_send_run`` of the whole run; a checkout without it: ``parse_send_control`` of
  each, the specs and receipts listed, the bodies counted, as its session did);
* session + door, SENDs: a connected 1.2 ``Session`` on the engine's backend and door
  (``EngineBackend``, ``EngineDoor``; the two threads' turns on one) fed those 1000
  SENDs in 64 KiB reads, each read's operations and answers run after it (its RECEIPTs
  written): parse, run, hand-over, the door's messages, ``publish_many`` into a queue
  nobody consumes (the deliveries are not in it), per SEND; heads alike, and a receipt
  each;
* encode: ``Session._encode`` of an auto-ack MESSAGE (100-byte body, no user headers);
* write plain MESSAGEs: ``Session.deliver_plain`` of runs of 100 (and of 1) such
  MESSAGEs, the output taken and through the plain wire every 100 (the listener's
  write path without the socket);
* receipts: the RECEIPTs of a run of 1000 SENDs as the session writes them
  (``serialize_receipts``; a checkout without it: ``serialize_receipt`` of each);
* engine, auto ack: a run of 1000 SENDs (with the user and time headers the door
  stamps on each) through the engine to an ``ack:auto`` consumer of a STOMP queue
  (``publish_many``, with ``unique_ids`` as the door calls it, ``transmitted``) and
  its settling: the engine acknowledging what was taken (``Engine.acknowledge_taken``)
  or, in a checkout without it, one ``acknowledge_many`` entry per delivery, as the
  door sends them;
* engine, client ack: the same with ``ack:client`` (one ``acknowledge_many`` entry per
  delivery);
* engine, backlog drained: the consumer's window (1000) full and 4000 more waiting in
  the queue, taken 100 at a time (each ``transmitted`` drains the next 100 from the
  queue: ``Dispatcher.drain``), per message, with its Python calls; the consumer
  acknowledges by taking and (since session 21's drain21) takes runs
  (``acknowledge_taken(..., runs=True)``; a checkout without the keyword: without);
* engine, Python calls: the same path's Python calls per message (cProfile's count of
  one pass: deterministic, unlike the CPU figures on a loaded machine);
* door, client-individual ACKs: 1000 deliveries of a ``/queue/`` subscription with
  ``ack:client-individual`` acknowledged by 1000 ACKs of one read, as the listener hands
  them to the engine thread (``EngineBackend.ack``, its batch, ``EngineDoor.run_ops``):
  CPU and Python calls per ACK, both threads' work, run here on one thread;
* door, SENDs: the 1000 SENDs of that setup (``EngineBackend.publish_async``, the engine
  thread's ``run_ops``, the deliveries to the consumer): CPU and Python calls per SEND
  (each timing followed by the untimed ACKs of its messages), on the
  virtual host ``default`` and on another one, ``shop`` (its destinations named in its
  namespace since session 17; a checkout without virtual host namespaces maps both
  alike).

Each checkout runs in its own subprocess (``PYTHONPATH``), the two taking turns
``--turns`` times (baseline first in odd turns); the figure is the best of ``--repeat``
timings of ``process_time`` (CPU, not wall: it moves far less on a loaded machine).

Usage: ``python bench/bench_stomp_paths.py [--baseline CHECKOUT] [--turns 2]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from call_count import python_calls
from checkout_child import child_result

#: Frames per timed pass, and passes per timing.
FRAMES = 1000
PASSES = 5
#: MESSAGEs of a plain run and of a flush (``deliver_plain``; 10k stomp.py runs: 40-150).
RUN = 100


def _best(fn: object, repeat: int) -> float:
    """Best CPU seconds of ``repeat`` calls of ``fn``."""
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        fn()  # type: ignore[operator]
        best = min(best, time.process_time() - start)
    return best


def measure(repeat: int) -> dict[str, float]:
    """µs per operation of each path, for the ``broker`` package importable here."""
    from broker.stomp.backend import Delivery
    from broker.stomp.frames import FrameParser, Version
    from broker.stomp.subscription import parse_send_control

    frame = (
        b"SEND\ncontent-length:100\ndestination:/queue/bench\nreceipt:12345\n\n"
        + b"x" * 100
        + b"\0"
    )
    data = frame * FRAMES
    chunks = [data[i : i + 65536] for i in range(0, len(data), 65536)]
    parser = FrameParser(version=Version.V1_2)
    frames = [f for chunk in chunks for f in parser.feed(chunk)]
    assert len(frames) == FRAMES
    read = _session_reading(parser)
    parsed = [f for chunk in chunks for f in read(chunk)]

    def parse() -> None:
        for _ in range(PASSES):
            for chunk in chunks:
                read(chunk)

    def spec() -> None:
        for _ in range(PASSES):
            for f in frames:
                parse_send_control(f, broker_id="default", connection_id=1, now_ms=0)

    each = b"".join(
        b"SEND\ncontent-length:100\ndestination:/queue/bench\nreceipt:%d\n\n" % i
        + b"x" * 100
        + b"\0"
        for i in range(FRAMES)
    )
    each_chunks = [each[i : i + 65536] for i in range(0, len(each), 65536)]
    each_parser = FrameParser(version=Version.V1_2)
    read_each = _session_reading(each_parser)
    each_parsed = [f for chunk in each_chunks for f in read_each(chunk)]
    assert len(each_parsed) == FRAMES

    def parse_each() -> None:
        for _ in range(PASSES):
            for chunk in each_chunks:
                read_each(chunk)

    read_run = _run_reader()

    def run_alike() -> None:
        for _ in range(PASSES):
            read_run(parsed)

    def run_each() -> None:
        for _ in range(PASSES):
            read_run(each_parsed)

    session, sub = _session()
    body = b"x" * 100
    deliveries = [
        Delivery("1", i, f"stomp-1-{i}", "/queue/bench", (), body) for i in range(FRAMES)
    ]
    encode = session._encode

    def encode_all() -> None:
        for _ in range(PASSES):
            for d in deliveries:
                encode(sub, d)

    write_plain = _plain_writer(session, body)

    def plain_runs() -> None:
        for _ in range(PASSES):
            write_plain(RUN)

    def plain_singles() -> None:
        for _ in range(PASSES):
            write_plain(1)

    receipt_ids: list[str | None] = [str(12345 + i) for i in range(FRAMES)]
    write_receipts = _receipt_writer()

    def receipts() -> None:
        for _ in range(PASSES):
            out = bytearray()
            write_receipts(out, receipt_ids)

    sends_alike = session_sends(send_chunks(False))
    sends_each = session_sends(send_chunks(True))
    door_refill, door_acks = _door_acks()
    shop_refill, shop_acks = _door_acks("shop")
    engine_auto_ack = _engine_auto_ack()
    engine_client_ack = _engine_auto_ack(client_ack=True)
    backlog_fill, backlog_drain = _engine_backlog()
    per = 1e6 / (FRAMES * PASSES)
    return {
        "parse SEND": _best(parse, repeat) * per,
        "SEND spec (parse_send_control)": _best(spec, repeat) * per,
        "parse SEND, a receipt each": _best(parse_each, repeat) * per,
        "run of SENDs, heads alike (session)": _best(run_alike, repeat) * per,
        "run of SENDs, a receipt each (session)": _best(run_each, repeat) * per,
        "session + door: SENDs, heads alike": _best(sends_alike, repeat) * per,
        "session + door: SENDs, a receipt each": _best(sends_each, repeat) * per,
        "encode MESSAGE (auto ack)": _best(encode_all, repeat) * per,
        f"write plain MESSAGEs, runs of {RUN} (deliver_plain, to the wire)": _best(
            plain_runs, repeat
        )
        * per,
        "write plain MESSAGEs, runs of 1 (deliver_plain, to the wire)": _best(
            plain_singles, repeat
        )
        * per,
        "RECEIPT of a run": _best(receipts, repeat) * per,
        "engine: SEND to an auto-ack consumer, settled": _best(engine_auto_ack, repeat) * per,
        "engine: auto-ack, Python calls per message": _calls(engine_auto_ack) / (FRAMES * PASSES),
        "engine: backlog drained to an auto-ack consumer": _best_after(
            backlog_fill, backlog_drain, repeat
        )
        * 1e6
        / BACKLOG,
        "engine: backlog drained, Python calls per message": _door_calls(
            backlog_fill, backlog_drain
        )
        / BACKLOG,
        "engine: SEND to a client-ack consumer, ACKed": _best(engine_client_ack, repeat) * per,
        "engine: client-ack, Python calls per message": _calls(engine_client_ack)
        / (FRAMES * PASSES),
        "door: client-individual ACKs of a read": _best_after(door_refill, door_acks, repeat)
        * 1e6
        / FRAMES,
        "door: the same, Python calls per ACK": _door_calls(door_refill, door_acks) / FRAMES,
        "door: SENDs delivered (vhost default)": _best_before(door_refill, door_acks, repeat)
        * 1e6
        / FRAMES,
        "door: SENDs delivered (vhost shop)": _best_before(shop_refill, shop_acks, repeat)
        * 1e6
        / FRAMES,
        "door: SENDs delivered, Python calls per SEND (vhost default)": _calls(door_refill)
        / FRAMES,
        "door: SENDs delivered, Python calls per SEND (vhost shop)": _calls(shop_refill) / FRAMES,
    }


def _door_calls(setup: Callable[[], None], fn: Callable[[], None]) -> float:
    setup()
    return _calls(fn)


def _calls(fn: Callable[[], None]) -> float:
    """Function calls (Python and built-in) cProfile counts in one call of ``fn``."""
    import cProfile

    profile = cProfile.Profile()
    profile.runcall(fn)
    return float(python_calls(profile))


def _engine_auto_ack(client_ack: bool = False) -> Callable[[], None]:
    """One consumer of a STOMP queue (``RequestAcknowledge``, the per-message handler)
    with ``ack:auto`` (``client_ack``: ``ack:client``, an ACK entry per delivery as
    the door sends them): runs of 1000 messages published, taken, settled."""
    import inspect
    import itertools

    from broker.engine.engine import Engine
    from broker.engine.options import ChannelOptions
    from broker.message import Message
    from broker.protocol import ConnectionInfo
    from broker.stomp.engine_door import EngineDoor
    from broker.stomp.engine_mapping import QUEUE_ID, QUEUE_OPTIONS, channel_rest

    engine = Engine()
    EngineDoor(engine)  # registers the per-message handler the STOMP queues name
    producer, _ = engine.connect(ConnectionInfo(name="p", type="stomp"), 0.0)
    consumer, _ = engine.connect(ConnectionInfo(name="c", type="stomp"), 0.0)
    rest = channel_rest(engine.config.channel_defaults)
    engine.create_channel("bench", ChannelOptions(queue=QUEUE_OPTIONS, **rest), [])
    engine.subscribe(consumer, "bench", 0.0, prefetch=FRAMES)
    by_taking = None if client_ack else getattr(engine, "acknowledge_taken", None)
    if by_taking is not None:  # (the door's consumers take a run of AUTO deliveries as
        # one: since session 22 their property, session 21 asked per publish_many)
        runs = "runs" in inspect.signature(by_taking).parameters
        by_taking(consumer, "bench", **({"runs": True} if runs else {}))
    ids = itertools.count()
    body = b"x" * 100
    # the door's runs say their ids are its own (a checkout without the keyword: none)
    parameters = inspect.signature(engine.publish_many).parameters
    unique = {k: True for k in ("unique_ids", "runs") if k in parameters}
    # what the door stamps on every SEND of a run (engine_mapping: its user, its time)
    stamp = (("Stomp-User", "p"), ("Stomp-Timestamp", "1700000000000"))

    def run() -> None:
        for _ in range(PASSES):
            messages = [
                Message(f"m{next(ids)}", producer, "bench", QUEUE_ID, headers=stamp, payload=body)
                for _ in range(FRAMES)
            ]
            engine.publish_many(producer, messages, 0.0, **unique)
            engine.transmitted({consumer: FRAMES}, 0.0)
            if by_taking is None:
                acks = [("bench", QUEUE_ID, m.message_id, None) for m in messages]
                engine.acknowledge_many(consumer, acks, 0.0)

    run()
    queue = engine.channels["bench"].queues[QUEUE_ID]
    assert queue.acks == FRAMES * PASSES and not queue.pending  # every one settled
    return run


#: Messages a backlog run drains (behind a full window of FRAMES), and per report taken.
BACKLOG = 4000
BACKLOG_STEP = 100


def _engine_backlog() -> tuple[Callable[[], None], Callable[[], None]]:
    """An ``ack:auto`` consumer of a STOMP queue whose window (FRAMES) is full and
    BACKLOG messages waiting behind it (``fill``, untimed); ``drain``: the transport
    reports BACKLOG_STEP taken at a time until all are (each report drains that many
    from the queue), and the last window is taken (untimed work is only ``fill``)."""
    import inspect
    import itertools

    from broker.engine.engine import Engine
    from broker.engine.options import ChannelOptions
    from broker.message import Message
    from broker.protocol import ConnectionInfo
    from broker.stomp.engine_door import EngineDoor
    from broker.stomp.engine_mapping import QUEUE_ID, QUEUE_OPTIONS, channel_rest

    engine = Engine()
    EngineDoor(engine)
    producer, _ = engine.connect(ConnectionInfo(name="p", type="stomp"), 0.0)
    consumer, _ = engine.connect(ConnectionInfo(name="c", type="stomp"), 0.0)
    rest = channel_rest(engine.config.channel_defaults)
    engine.create_channel("backlog", ChannelOptions(queue=QUEUE_OPTIONS, **rest), [])
    engine.subscribe(consumer, "backlog", 0.0, prefetch=FRAMES)
    runs = "runs" in inspect.signature(engine.acknowledge_taken).parameters
    engine.acknowledge_taken(consumer, "backlog", **({"runs": True} if runs else {}))
    parameters = inspect.signature(engine.publish_many).parameters
    unique = {k: True for k in ("unique_ids", "runs") if k in parameters}
    ids = itertools.count()
    body = b"x" * 100
    stamp = (("Stomp-User", "p"), ("Stomp-Timestamp", "1700000000000"))

    def fill() -> None:
        messages = [
            Message(f"b{next(ids)}", producer, "backlog", QUEUE_ID, headers=stamp, payload=body)
            for _ in range(FRAMES + BACKLOG)
        ]
        engine.publish_many(producer, messages, 0.0, **unique)
        assert engine.channels["backlog"].queues[QUEUE_ID].message_count == BACKLOG

    def drain() -> None:
        for _ in range(BACKLOG // BACKLOG_STEP):
            engine.transmitted({consumer: BACKLOG_STEP}, 0.0)
        engine.transmitted({consumer: FRAMES}, 0.0)
        queue = engine.channels["backlog"].queues[QUEUE_ID]
        assert queue.message_count == 0 and not queue.pending

    return fill, drain


def _door_acks(virtual_host: str = "default") -> tuple[Callable[[], None], Callable[[], None]]:
    """The door with a client-individual consumer of ``/queue/bench``: ``(refill,
    acks)``; ``refill`` publishes and delivers FRAMES messages (untimed), ``acks`` ACKs
    them all in one listener batch and runs it on the engine (as the two threads would,
    here on one); both connections on ``virtual_host``."""
    import select
    import threading

    from broker.engine.engine import Engine
    from broker.stomp.backend import ConnectionInfo, Delivery
    from broker.stomp.destinations import parse_destinations
    from broker.stomp.engine_backend import EngineBackend, EngineDoor
    from broker.stomp.subscription import AckMode, PublishSpec, SubscriptionSpec

    door = EngineDoor(Engine())
    backend = EngineBackend(door)
    soon: list[Callable[[], None]] = []
    posted: list[Callable[[], None]] = []
    backend.bind(posted.append, lambda: None, soon.append)
    got: list[Delivery] = []

    def pump() -> None:  # the two threads' turns, on this one
        while soon or posted or door.pending_ops:
            while soon:
                soon.pop(0)()
            door.run_ops(0.0)
            while posted:
                posted.pop(0)()

    for conn in (1, 2):
        backend.attach(
            ConnectionInfo(conn, "u", virtual_host, "1.2"), lambda d: got.append(d) or True
        )
    pump()
    dest = parse_destinations(
        "/queue/bench", broker_id="default", connection_id=1, allow_wildcards=False
    )
    done = threading.Event()

    def engine_thread() -> None:  # answers the SUBSCRIBE, which waits for the engine
        while not done.is_set():
            select.select([door.fileno()], [], [], 0.05)
            door.run_ops(0.0)

    helper = threading.Thread(target=engine_thread)
    helper.start()
    backend.subscribe(2, SubscriptionSpec("s", dest, ack=AckMode.CLIENT_INDIVIDUAL))
    done.set()
    helper.join()
    tags: list[int] = []

    def refill() -> None:
        got.clear()
        for _ in range(FRAMES):
            backend.publish_async(1, PublishSpec(dest, (), b"x" * 100), lambda error: None)
        pump()
        assert len(got) == FRAMES, len(got)
        tags[:] = [d.tag for d in got]

    def acks() -> None:
        for tag in tags:
            backend.ack(2, [tag])
        while soon:
            soon.pop(0)()
        door.run_ops(0.0)
        channels = door.engine.channels  # (a checkout without namespaces: "bench")
        channel = channels.get(f"{virtual_host}/bench") or channels["bench"]
        assert not channel.queues[0].pending  # every one settled

    return refill, acks


def _best_before(fn: Callable[[], None], after: Callable[[], None], repeat: int) -> float:
    """Best CPU seconds of ``repeat`` calls of ``fn``, each followed by an untimed
    ``after``."""
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
        after()
    return best


def _best_after(setup: Callable[[], None], fn: Callable[[], None], repeat: int) -> float:
    """Best CPU seconds of ``repeat`` calls of ``fn``, each after an untimed ``setup``."""
    best = float("inf")
    for _ in range(repeat):
        setup()
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def _session_reading(parser: Any) -> Callable[[bytes], list[Any]]:
    """How the checkout's session feeds its parser (SendStreaks, where it has them)."""
    streaks = getattr(parser, "feed_streaks_until_error", None)
    if streaks is None:
        return parser.feed  # type: ignore[no-any-return]

    def read(chunk: bytes) -> list[Any]:
        items, error = streaks(chunk)
        assert error is None
        return items  # type: ignore[no-any-return]

    return read


def send_chunks(receipt_each: bool) -> list[bytes]:
    """FRAMES stomp.py-like SENDs (100-byte bodies) in 64 KiB reads: every head alike
    (``receipt:12345`` on each), or ``receipt_each``: ``receipt:N``."""
    data = b"".join(
        b"SEND\ncontent-length:100\ndestination:/queue/bench\nreceipt:%d\n\n"
        % (i if receipt_each else 12345)
        + b"x" * 100
        + b"\0"
        for i in range(FRAMES)
    )
    return [data[i : i + 65536] for i in range(0, len(data), 65536)]


def session_sends(chunks: list[bytes], passes: int = PASSES) -> Callable[[], None]:
    """A connected 1.2 session on the engine's backend and door, one thread taking both
    threads' turns; the call feeds it ``chunks`` (SEND frames, 64 KiB reads) ``passes``
    times, running each read's engine operations and answers after it, and takes its
    output (the RECEIPTs).  Nobody consumes the queue.  (Also run under callgrind:
    ``callgrind_send_run.py``.)"""
    from broker.engine.engine import Engine
    from broker.stomp.engine_backend import EngineBackend, EngineDoor
    from broker.stomp.session import Session

    door = EngineDoor(Engine())
    backend = EngineBackend(door)
    soon: list[Callable[[], None]] = []
    posted: list[Callable[[], None]] = []
    backend.bind(posted.append, lambda: None, soon.append)

    def pump() -> None:  # the two threads' turns, on this one
        while soon or posted or door.pending_ops:
            while soon:
                soon.pop(0)()
            door.run_ops(0.0)
            while posted:
                posted.pop(0)()

    session = Session(backend, 1, 0.0)
    session.receive(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\0", 0.0)
    pump()
    session.take_output(0.0)

    def run() -> None:
        for _ in range(passes):
            for chunk in chunks:
                session.receive(chunk, 0.0)
                pump()
            session.take_output(0.0)
        assert not session.closed and not session.reading_paused

    return run


def _run_reader() -> Callable[[list[Any]], object]:
    """How the checkout's session reads a run of parsed SENDs (``Session._publish_run``)."""
    from broker.stomp import subscription
    from broker.stomp.errors import StompError
    from broker.stomp.frames import Command

    read_send_run = getattr(subscription, "read_send_run", None)
    if read_send_run is not None:

        def at_once(frames: list[Any]) -> object:
            return read_send_run(
                frames, 1 << 30, 1 << 40, broker_id="default", connection_id=1, now_ms=0
            )

        return at_once
    parse_send_control = subscription.parse_send_control

    def each(frames: list[Any]) -> object:  # (Session._publish_run before session 20)
        specs: list[Any] = []
        receipts: list[str | None] = []
        size = 0
        send = Command.SEND
        for frame in frames:
            if frame.command is not send or len(specs) >= 1 << 30 or size >= 1 << 40:
                break
            try:
                spec, receipt, transaction = parse_send_control(
                    frame, broker_id="default", connection_id=1, now_ms=0
                )
            except StompError:
                break
            if transaction is not None:
                break
            specs.append(spec)
            receipts.append(receipt)
            size += len(spec.body)
        return specs, receipts, size

    return each


def _receipt_writer() -> Callable[[bytearray, list[str | None]], None]:
    """How the checkout's session writes a run's RECEIPTs into its output buffer."""
    from broker.stomp import frames
    from broker.stomp.frames import Version

    batch = getattr(frames, "serialize_receipts", None)
    if batch is not None:

        def at_once(out: bytearray, ids: list[str | None]) -> None:
            out += batch(ids, Version.V1_2)

        return at_once

    def each(out: bytearray, ids: list[str | None]) -> None:
        for r in ids:
            if r is not None:
                out += frames.serialize_receipt(r, Version.V1_2)

    return each


def _plain_writer(session: Any, body: bytes) -> Callable[[int], None]:
    """``FRAMES`` MESSAGEs of subscription ``1`` written in runs of ``run`` as the
    listener writes them: ``deliver_plain`` of each run (room to spare), then the
    session's output taken and passed through the plain wire to bytes for the transport
    (the listener's ``flush``, less the socket)."""
    from broker.stomp.wire import PlainWire

    session.room = lambda: 1 << 30
    wire = PlainWire()
    ids = [f"stomp-1-{100000 + i}" for i in range(FRAMES)]
    bodies = [body] * FRAMES

    def write(run: int) -> None:
        for start in range(0, FRAMES, run):
            end = start + run
            session.deliver_plain("1", "/queue/bench", ids[start:end], bodies[start:end])
            if end % RUN == 0 or end >= FRAMES:  # (a flush per RUN MESSAGEs)
                wire.send(session.take_output(0.0))
                wire.take()

    return write


def _session() -> tuple[object, object]:
    """A connected 1.2 session with subscription ``1`` (auto ack) on /queue/bench."""
    from broker.stomp.frames import Version
    from broker.stomp.memory import MemoryBackend
    from broker.stomp.session import Session

    session = Session(MemoryBackend(), 1, 0.0)
    session.receive(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\0", 0.0)
    session.receive(b"SUBSCRIBE\nid:1\ndestination:/queue/bench\n\n\0", 0.0)
    session.take_output(0.0)
    assert session.version is Version.V1_2
    return session, session._subscriptions["1"]


def _run(checkout: str, repeat: int) -> dict[str, float]:
    return child_result(__file__, checkout, str(repeat))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", metavar="CHECKOUT", help="another checkout (e.g. main)")
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(measure(args.child)))
        return 0
    if args.turns < 1 or args.repeat < 1:
        parser.error("--turns and --repeat must be at least 1")
    here = str(Path(__file__).resolve().parent.parent)
    print(
        f"{'path (CPU us per frame, best of ' + str(args.repeat) + ')':44} {'turn':>4} "
        f"{'this':>8} {'baseline':>9} {'ratio':>6}"
    )
    for turn in range(1, args.turns + 1):
        base: dict[str, float] = {}
        if args.baseline and turn % 2:
            base = _run(args.baseline, args.repeat)
        mine = _run(here, args.repeat)
        if args.baseline and not turn % 2:
            base = _run(args.baseline, args.repeat)
        for name, us in mine.items():
            other = base.get(name)
            shown = f"{other:9.2f} {us / other:6.2f}" if other else f"{'':9} {'':6}"
            print(f"{name:44} {turn:>4} {us:8.2f} {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
