"""Engine + store cost of a persistent push, in one process (no sockets): what the
persistent path adds to the broker's CPU per message.

    python bench/bench_persistent.py [--messages N] [--rounds R] [--size OCTETS]

Rows (each in its own process, taking turns ``--rounds`` times; the CPU column is the
process's CPU time, the store's writer thread included):

* ``memory``: the engine with the persistent handler but no store (the baseline);
* ``persistent``: the same with a ``DurableStore`` over a ``LogStore`` in fsync mode;
* ``..., consumed``: the same two with a consumer that takes and acknowledges every
  message (persistent: the store's delivery-count update and remove);
* ``..., batched``: the same two, the pushes handed over ``BATCH`` at a time as the
  server hands a TMQP batch (``Engine.receive_batch``: the store writes a batch's saves
  as one group, one ticket);
* ``..., runs``: the same two, single pushes (each answered with its own acknowledge)
  handed over ``BATCH`` at a time as the server hands a drain's run of one producer's
  pushes, their decoding included (``tmqp.decode_message_records`` and
  ``Engine.receive_pushes``; an engine before session 12: a frame decoded per push and
  ``Engine.receive_run``, what its server did);
* ``store only``: ``DurableStore.append`` of the same messages (no engine).

``--calls`` prints Python function calls per message instead (cProfile's count:
deterministic, the same on a loaded machine).

Pushes are decoded TMQP frames (with their octets, as the server hands them over),
100-octet payloads (``--size``: another payload size), the producer waiting for acks;
the loop waits for the store's completion every ``WINDOW`` pushes, as the server's gate
would release its acks.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import tempfile
import time
from typing import Any

from call_count import python_calls  # (a test imports it from here too)

SIZE = 100
WINDOW = 256
#: pushes per ``Engine.receive_batch`` call in the batched rows (bench_broker's PERSIST_BATCH)
BATCH = 32
KINDS = (
    "memory",
    "persistent",
    "memory, batched",
    "persistent, batched",
    "memory, runs",
    "persistent, runs",
    "memory, consumed",
    "persistent, consumed",
    "store only",
)


def _case(kind: str, n: int, out: Any, size: int = SIZE) -> None:
    from broker import tmqp
    from broker.engine.delivery import PersistentDeliveryHandler
    from broker.engine.engine import Engine
    from broker.engine.tmqp_door import WIRE
    from broker.message import Message
    from broker.protocol import ConnectionInfo, Header, MessageType, Operation, Tracked
    from broker.store.base import StoredMessage
    from broker.store.durable import DurableStore
    from broker.store.log import LogStore

    with tempfile.TemporaryDirectory(prefix="bench-persistent-") as data:
        store = None if kind.startswith("memory") else DurableStore(LogStore(data))
        if kind == "store only":
            assert store is not None
            msg = Message(message_id="m-0000001", source="", target="ch", content_type=1,
                          payload=b"x" * size)  # fmt: skip
            stored = [StoredMessage(i, msg, "prod") for i in range(1, n + 1)]
            start, cpu = time.perf_counter(), time.process_time()
            for i, s in enumerate(stored):
                store.append(("ch", 1), s)
                if not i % WINDOW:
                    store.log.wait(store.appended, 30)
            store.flush()
            out.put((time.perf_counter() - start, time.process_time() - cpu))
            store.close()
            return
        engine = Engine(store=store, handlers={"persistent": PersistentDeliveryHandler()})
        producer, _ = engine.connect(ConnectionInfo(client_id="prod"), 0.0)
        consumer, _ = engine.connect(ConnectionInfo(client_id="cons"), 0.0)
        options = {"MessageDeliveryHandler": "persistent"}
        consumed = kind.endswith("consumed")
        if consumed:
            options["RequestAcknowledge"] = True  # type: ignore[assignment]
            join = tmqp.Frame(message_type=MessageType.SERVER, content_type=Operation.JOIN,
                              target="ch", message_id="j")  # fmt: skip
            engine.receive(consumer, join, 0.0)
        create = tmqp.Frame(message_type=MessageType.SERVER, content_type=Operation.QUEUE_CREATE,
                            target="ch", message_id="q", headers=((Header.QUEUE_ID, "1"),),
                            payload=json.dumps(options).encode())  # fmt: skip
        engine.receive(producer, create, 0.0)
        payload = b"x" * size
        pushes = []
        for i in range(n):
            frame = tmqp.Frame(
                message_type=MessageType.QUEUE,
                content_type=1,
                target="ch",
                message_id=f"m{i:07d}",
                payload=payload,
                pending_ack=True,
            )
            (raw,) = tmqp.encode(frame)
            pushes.append((tmqp.decode([raw]), raw))
        acks = [
            tmqp.Frame(
                message_type=MessageType.ACK, content_type=1, target="ch", message_id=f"m{i:07d}"
            )
            for i in range(n)
        ]
        receive, transmitted = engine.receive, engine.transmitted
        count = sent = 0
        start, cpu = time.perf_counter(), time.process_time()
        if kind.endswith("batched"):
            for first in range(0, n, BATCH):
                items = [
                    (j, push, raw) for j, (push, raw) in enumerate(pushes[first : first + BATCH])
                ]
                outs, refused, later = engine.receive_batch(producer, items, 1.0)
                assert not refused and not later, (refused, later)
                count += len(items)
                if store is not None and not (first // BATCH) % (WINDOW // BATCH):
                    store.log.wait(store.appended, 30)
            pushes = []
        if kind.endswith("runs"):
            # the server's work for a drain's run: its octets decoded, one engine call
            receive_run = getattr(engine, "receive_run", None)  # (an engine before 12)
            datas = [raw for _push, raw in pushes]
            for first in range(0, n, BATCH):
                chunk = datas[first : first + BATCH]
                if receive_run is None:
                    messages, _bad = tmqp.decode_message_records(chunk, Message, WIRE)
                    outs = engine.receive_pushes(producer, messages, 1.0)
                else:  # (its server decoded each acknowledged push as a frame)
                    items = [(j, tmqp.decode([raw]), raw) for j, raw in enumerate(chunk)]
                    outs = receive_run(producer, items, 1.0)
                count += len(outs)
                if store is not None and not (first // BATCH) % (WINDOW // BATCH):
                    store.log.wait(store.appended, 30)
            pushes = []
        for i, (push, raw) in enumerate(pushes):
            outs = receive(producer, push, 1.0, raw)
            count += len(outs)
            if consumed:
                sent += sum(1 for o in outs if type(o) is Tracked)
                count += len(receive(consumer, acks[i], 1.0))
                if sent >= WINDOW:
                    outs = transmitted({consumer: sent}, 1.0)
                    sent = sum(1 for o in outs if type(o) is Tracked)
            if store is not None and not i % WINDOW:
                store.log.wait(store.appended, 30)
        if store is not None:
            store.flush()
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        assert count >= n, (kind, count)
        out.put((elapsed, cpu))
        if store is not None:
            store.close()


def calls(n: int, size: int = SIZE) -> None:
    """Python function calls per message of each row (cProfile, in this process)."""
    import cProfile
    import queue

    print(f"{'row':<22} {'Python calls/msg':>17}")
    for kind in KINDS:
        prof = cProfile.Profile()
        prof.enable()
        _case(kind, n, queue.Queue(), size)
        prof.disable()
        print(f"{kind:<22} {python_calls(prof) / n:>17.1f}")


def profile(kind: str, n: int, size: int = SIZE) -> None:
    """cProfile of one row in this process (``--profile KIND``)."""
    import cProfile
    import pstats
    import queue

    prof = cProfile.Profile()
    prof.enable()
    _case(kind, n, queue.Queue(), size)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(40)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=SIZE, help="payload octets")
    parser.add_argument("--profile", metavar="KIND", help="cProfile one row instead")
    parser.add_argument("--calls", action="store_true", help="Python calls per message instead")
    args = parser.parse_args()
    if args.calls:
        calls(args.messages, args.size)
        return
    if args.profile:
        profile(args.profile, args.messages, args.size)
        return
    ctx = mp.get_context("spawn")
    kinds = KINDS
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    for _ in range(args.rounds):
        for kind in kinds:
            q: Any = ctx.Queue()
            p = ctx.Process(target=_case, args=(kind, args.messages, q, args.size))
            p.start()
            results[kind].append(q.get(timeout=600))
            p.join(60)
    print(f"{'row':<20} {'CPU us/msg (best, median)':>28} {'wall us/msg (best)':>20}")
    bases = {
        "persistent": "memory",
        "persistent, batched": "memory, batched",
        "persistent, runs": "memory, runs",
        "persistent, consumed": "memory, consumed",
    }
    for kind in kinds:
        cpus = sorted(c for _, c in results[kind])
        walls = sorted(w for w, _ in results[kind])
        per = 1e6 / args.messages
        extra = ""
        if kind in bases:
            base = min(c for _, c in results[bases[kind]])
            extra = f"  (+{(cpus[0] - base) * per:.1f} over {bases[kind]})"
        print(f"{kind:<20} {cpus[0] * per:>12.1f} {cpus[len(cpus) // 2] * per:>14.1f} "
              f"{walls[0] * per:>20.1f}{extra}")  # fmt: skip


if __name__ == "__main__":
    main()
