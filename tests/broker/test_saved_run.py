"""A batch's runs of acknowledged pushes into a queue that saves every push
(``broker.engine.queue.saved_run``) give exactly what the frames handled one by one give:
the same output, refusals by index and counters, the same records in the store, the same
after a restart -- and nothing acknowledged that is not stored.

The random sessions are those of ``test_engine_batch_path`` with most pushes waiting for
an acknowledge (there a quarter do), on queues whose handler is ``persistent``, over real
logs (``test_engine_batch_durable``'s kit)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from broker import tmqp
from broker.engine import engine as engine_module
from broker.engine.delivery import PersistentDeliveryHandler
from broker.engine.options import BrokerConfig
from broker.engine.queue import saved_run
from broker.protocol import MessageType, NackReason
from broker.store.base import Store

from .engine_kit import Frame, Kit
from .full_disk import FullDisk
from .test_engine_batch_durable import PERSISTENT, compare_sessions
from .test_engine_batch_path import _counters, one_by_one

Item = tuple[int, tmqp.Frame, bytes]


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many pushes each saved run took (so a test knows it compared that path)."""
    taken: list[int] = []
    real = engine_module.push_saved_run

    def counted(*args: Any, **kw: Any) -> int:
        n = real(*args, **kw)
        taken.append(n)
        return n

    monkeypatch.setattr(engine_module, "push_saved_run", counted)
    return taken


def _mostly_acknowledged(rnd: random.Random, steps: list[tuple[str, str, Any]]) -> None:
    for what, _, arg in steps:
        if what == "batch":
            for entry in arg:
                if entry["kind"] == "push":
                    entry["ack"] = rnd.random() < 0.9


@pytest.mark.parametrize("auto_transmit", [True, False], ids=["sent-at-once", "held-back"])
def test_acknowledged_runs_give_what_one_by_one_gives_before_and_after_restart(
    tmp_path: Path, auto_transmit: bool, runs: list[int], request: pytest.FixtureRequest
) -> None:
    _, kept, _, refused = compare_sessions(tmp_path, auto_transmit, request,
                                           _mostly_acknowledged)  # fmt: skip
    assert sum(n > 1 for n in runs) >= 100 and sum(runs) >= 400  # the run path compared
    assert refused >= 1  # (refusals in the middle of runs: the tests below)
    assert kept >= 40  # and stores holding messages, not empty


def _acked(count: int, *, big: frozenset[int] = frozenset(), ids: dict[int, str] | None = None,
           ) -> list[Item]:  # fmt: skip
    ids = ids or {}
    frames = [
        Frame(message_type=MessageType.QUEUE, content_type=1, target="ch", pending_ack=True,
              message_id=ids.get(k, f"m{k}"), source="p",
              payload=b"%04d" % k + (b"y" * 60 if k in big else b""))
        for k in range(count)
    ]  # fmt: skip
    return [(i, f, tmqp.encode(f)[0]) for i, f in enumerate(frames)]


def _memory_kit(store: Store, **options: Any) -> Kit:
    kit = Kit(
        config=BrokerConfig(wall_clock=lambda: 1_700_000_000.0),
        store=store,
        handlers={PERSISTENT: PersistentDeliveryHandler()},
    )
    kit.engine.create_channel("ch")
    kit.connect("p")
    kit.queue("p", "ch", 1, status=1, message_delivery_handler=PERSISTENT, **options)
    return kit


def _stored(store: Store) -> list[bytes]:
    return [s.message.payload[:4] for s in store.iterate(("ch", 1))]


def _both(store_room: int, items: list[Item], **options: Any) -> tuple[Any, ...]:
    """The batch through ``receive_batch`` and one by one, each on its own engine over a
    store with room for ``store_room`` messages: (output, refused, later, stored) of the
    first, after checking the second gave the same (and the same counters)."""
    results = []
    for batched in (True, False):
        store = FullDisk(store_room)
        kit = _memory_kit(store, **options)
        if batched:
            out, refused, later = kit.engine.receive_batch("p", items, kit.now)
        else:
            out, refused, later = one_by_one(kit.engine, "p", items, kit.now)
        results.append((out, refused, later, _stored(store), _counters(kit)))
    assert results[0] == results[1]
    return results[0][:4]


def test_a_disk_that_fills_mid_run_acknowledges_only_what_it_stored(runs: list[int]) -> None:
    """Room for 5 of 12: the 7 after are refused by index ("failed"), each as one by one
    refuses it; every push not refused is in the store, in order."""
    _, refused, later, stored = _both(5, _acked(12))
    assert runs == [12]  # (the batch went through the run path, whole)
    assert later == []
    assert refused == [(k, NackReason.FAILED, "") for k in range(5, 12)]
    acknowledged = [k for k in range(12) if k not in {i for i, *_ in refused}]
    assert stored == [b"%04d" % k for k in acknowledged]


def test_refused_entries_in_the_middle_of_a_run_take_the_general_path(
    runs: list[int],
) -> None:
    """A push too large and a duplicate id in the middle of a run: each refused or
    answered as one by one does, the run resumed after it, the rest saved in order."""
    big = frozenset({3, 7})
    ids = {9: "m1"}  # a retry of push 1: a duplicate within the window, answered "done"
    _, refused, later, stored = _both(100, _acked(14, big=big, ids=ids), message_size_limit=40,
                                      use_message_id=True, duplicate_window=100)  # fmt: skip
    assert [(i, why) for i, why, _ in refused] == [(3, NackReason.LIMIT_EXCEEDED),
                                                   (7, NackReason.LIMIT_EXCEEDED)]  # fmt: skip
    assert later == []
    assert stored == [b"%04d" % k for k in range(14) if k not in big and k != 9]
    assert runs[0] == 3 and sum(runs) == 14 - 3  # resumed after each one taken singly


def third_derive_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """The message model raises on its third call in a run (``saved_run.derive``: a bug
    in a collaborator)."""
    real = saved_run.derive
    calls = 0

    def third_raises(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise RuntimeError("a bug")
        return real(*args)

    monkeypatch.setattr(saved_run, "derive", third_raises)


def test_a_collaborator_raising_mid_run_refuses_that_push_and_no_other(
    runs: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The message model raises on the third push of a run (a bug in a collaborator):
    that push is refused ("failed", "internal error") and counted as an error -- never
    a false yes -- the two before it are acknowledged and stored, the rest go on."""
    third_derive_raises(monkeypatch)
    store = FullDisk(100)
    kit = _memory_kit(store)
    errors = kit.engine.errors
    _, refused, later = kit.engine.receive_batch("p", _acked(8), kit.now)
    assert refused == [(2, NackReason.FAILED, saved_run.INTERNAL_ERROR)]
    assert later == []
    assert kit.engine.errors == errors + 1
    assert _stored(store) == [b"%04d" % k for k in range(8) if k != 2]
    assert runs == [3, 5]  # the run ended at the failure; the rest came back as one


def test_a_retry_of_the_pushes_a_full_disk_refused_mid_run_is_refused_again(
    runs: list[int],
) -> None:
    """Room for 5 of 12: the producer retries the 7 refused (same ids).  They are no
    duplicates answered "done" (their saves were refused: their ids are not kept), but
    taken again and refused again by the still full store, in one batch or one by one."""
    for batched in (True, False):
        store = FullDisk(5)
        kit = _memory_kit(store, use_message_id=True, duplicate_window=100)
        _, refused, _ = kit.engine.receive_batch("p", _acked(12), kit.now)
        assert [i for i, *_ in refused] == list(range(5, 12))
        retry = _acked(12)[5:]
        if batched:
            _, again, _ = kit.engine.receive_batch("p", retry, kit.now)
        else:
            _, again, _ = one_by_one(kit.engine, "p", retry, kit.now)
        assert again == [(k, NackReason.FAILED, "") for k in range(5, 12)]
    assert runs[0] == 12
