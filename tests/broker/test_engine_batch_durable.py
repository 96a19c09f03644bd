"""A batch's persistent pushes are saved as groups (``Engine.receive_batch`` holds the
store's appends, ``Store.hold``/``release``; ``DurableStore`` writes each queue's run with
one ``LogStore.append_many``): the outcome must be exactly that of the frames handled one
by one -- the same output, refusals by index, counters -- and the store must end with the
same records, before and after a restart.

Two engines, each over its own durable log in a temp directory, get the same random
sessions as ``test_engine_batch_path`` (acknowledged and unacknowledged pushes, refusals
by size, limit and duplicate id, consumer acknowledges, option changes, held-back
transports, reconnects), on queues whose handler is ``persistent``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker import tmqp
from broker.engine.delivery import PersistentDeliveryHandler
from broker.engine.options import BrokerConfig
from broker.message import Message
from broker.protocol import MessageType, NackReason
from broker.server.gate import OutputGate
from broker.store import StoredMessage
from broker.store.durable import DurableStore
from broker.store.log import LogOptions, LogStore
from broker.store.log.options import Durability

from .engine_kit import Frame, Kit
from .test_engine_batch_path import _session, laid_out, lockstep, one_by_one

PERSISTENT = "persistent"
WAIT = 10.0


def _kit(directory: Path, auto_transmit: bool, **log: Any) -> tuple[Kit, DurableStore]:
    store = DurableStore(LogStore(directory, LogOptions(durability=Durability.OS, **log)))
    kit = Kit(
        auto_transmit=auto_transmit,
        config=BrokerConfig(wall_clock=lambda: 1_700_000_000.0),
        store=store,
        handlers={PERSISTENT: PersistentDeliveryHandler()},
    )
    return laid_out(kit, message_delivery_handler=PERSISTENT), store


def _records(store: DurableStore) -> dict[tuple[str, int], list[StoredMessage]]:
    """Every queue's saved messages as the store gives them back (written first)."""
    store.flush()
    return {key: list(store.iterate(key)) for key in sorted(store.queues())}


def _reopened(directory: Path) -> dict[tuple[str, int], Any]:
    with LogStore(directory) as log:
        store = DurableStore(log)
        return {key: (_records(store)[key], store.last_sequence(key)) for key in store.queues()}


def compare_sessions(
    tmp_path: Path,
    auto_transmit: bool,
    request: pytest.FixtureRequest,
    tweak: Callable[[random.Random, list[tuple[str, str, Any]]], None] | None = None,
) -> tuple[int, int, int, int]:
    """Eight random sessions (``tweak`` may change each one's steps) on two engines over
    real logs, batched and one by one: the same output, counters, records, inboxes, and
    the same after a restart.  Returns (messages saved, records kept at the end, outputs
    and refusals compared, refusals)."""
    saved = kept = compared = refused = 0
    for seed in range(8):
        rnd = random.Random(seed)
        steps = _session(rnd, rnd.randint(10, 40))
        if tweak is not None:
            tweak(rnd, steps)
        batched, b_store = _kit(tmp_path / f"b{seed}", auto_transmit)
        single, s_store = _kit(tmp_path / f"s{seed}", auto_transmit)
        request.addfinalizer(b_store.close)
        request.addfinalizer(s_store.close)
        taken, refusals = lockstep(batched, single, steps, seed)
        compared += taken + refusals
        refused += refusals
        records = _records(b_store)
        assert records == _records(s_store), seed
        kept += sum(len(v) for v in records.values())
        saved += sum(q.saves for c in batched.engine.channels.values() for q in c.queues.values())
        assert batched.inbox == single.inbox, seed
        b_store.close()
        s_store.close()
        assert _reopened(tmp_path / f"b{seed}") == _reopened(tmp_path / f"s{seed}"), seed
    return saved, kept, compared, refused


@pytest.mark.parametrize("auto_transmit", [True, False], ids=["sent-at-once", "held-back"])
def test_saving_a_batch_as_groups_gives_what_one_by_one_gives(
    tmp_path: Path, auto_transmit: bool, request: pytest.FixtureRequest
) -> None:
    saved, kept, compared, _ = compare_sessions(tmp_path, auto_transmit, request)
    assert saved >= 500  # the batches saved messages (compared above)...
    assert kept >= 40  # ...and the stores were compared holding some, not empty
    assert compared >= 1000


def _acked_pushes(
    start: int, count: int, size: int = 10, big: frozenset[int] = frozenset()
) -> list:
    frames = [
        Frame(message_type=MessageType.QUEUE, content_type=1, target="ch", pending_ack=True,
              message_id=f"m{k}", source="p",
              payload=b"%06d" % k + b"x" * ((4000 if k in big else size) - 6))
        for k in range(start, start + count)
    ]  # fmt: skip
    return [(i, f, tmqp.encode(f)[0]) for i, f in enumerate(frames)]


def test_a_batch_into_one_queue_is_one_write_and_one_wait(tmp_path: Path) -> None:
    kit, store = _kit(tmp_path, True)
    try:
        kit.engine.receive_batch("p", _acked_pushes(0, 1), kit.now)  # (the queue's first)
        before = store.appended
        kit.engine.receive_batch("p", _acked_pushes(1, 1), kit.now)
        assert store.appended == before + 1  # a ticket per save...
        _, refused, later = kit.engine.receive_batch("p", _acked_pushes(2, 30), kit.now)
        assert (refused, later) == ([], [])
        assert store.appended == before + 2  # ...and one for a batch's 30: one wait
        assert [s.message.payload[:6] for s in _records(store)[("ch", 1)]] == [
            b"%06d" % k for k in range(32)
        ]
    finally:
        store.close()


def test_records_the_log_refuses_are_refused_by_index_the_rest_saved_in_order(
    tmp_path: Path,
) -> None:
    big = frozenset({3, 4, 17})
    results = []
    for name, batched in (("b", True), ("s", False)):
        kit, store = _kit(tmp_path / name, True, max_record_size=1024)
        try:
            items = _acked_pushes(0, 20, big=big)
            if batched:
                _, refused, later = kit.engine.receive_batch("p", items, kit.now)
            else:
                _, refused, later = one_by_one(kit.engine, "p", items, kit.now)
            kept = [s.message.payload[:6] for s in _records(store)[("ch", 1)]]
            results.append((refused, later, kept))
        finally:
            store.close()
    assert results[0] == results[1]
    refused, later, kept = results[0]
    assert [(i, reason) for i, reason, _ in refused] == [
        (k, NackReason.FAILED) for k in sorted(big)
    ]
    assert later == []
    assert kept == [b"%06d" % k for k in range(20) if k not in big]


def test_a_closed_log_refuses_each_push_of_a_batch(tmp_path: Path) -> None:
    kit, store = _kit(tmp_path, True)
    store.close()
    _, refused, later = kit.engine.receive_batch("p", _acked_pushes(0, 5), kit.now)
    assert [(i, reason) for i, reason, _ in refused] == [(k, NackReason.FAILED) for k in range(5)]
    assert later == []


def test_held_appends_the_log_fails_to_take_hold_every_reply_for_good(tmp_path: Path) -> None:
    """The log checked each held append writable, then closed before the group was written
    (what a writer that failed meanwhile looks like): nothing sent after may leave."""
    log = LogStore(tmp_path, LogOptions(durability=Durability.OS))
    store = DurableStore(log)
    sent: list[Any] = []
    gate = OutputGate(store, sent.extend)
    store.hold()
    for seq in (1, 2, 3):
        store.append(("q", 1), StoredMessage(seq, Message(target="q", payload=b"%d" % seq)))
    log.close()
    store.release()
    assert store.appended > store.completed
    gate.admit(["the acknowledge of the three"])
    assert sent == [] and gate.held == 1
