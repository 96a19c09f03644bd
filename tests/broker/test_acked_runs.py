"""Acknowledged pushes read one by one and handed to the engine as a run
(``Engine.receive_pushes``, the server's drain: :func:`as_drain`) give exactly what each
frame handled alone gives: the same output (each push its own acknowledge, in the same
place), counters, inboxes, and the same records in a real log, before and after a
restart -- on queues whose handler saves every push (``persistent``) and on memory queues
whose handler confirms each on receipt (``saved_run`` without saves).  And a disk that
fills in the middle of a run acknowledges only what it stored.

The random sessions are ``test_engine_batch_path``'s, most pushes waiting for an
acknowledge; "one by one" is each frame through ``Engine.receive``, its output untouched.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from broker import tmqp
from broker.engine import engine as engine_module
from broker.engine.options import BrokerConfig
from broker.engine.tmqp_door import WIRE
from broker.message import Message
from broker.protocol import Header, MessageType, NackReason, Outgoing

from .engine_kit import Kit
from .full_disk import FullDisk
from .test_engine_batch_durable import _kit, _records, _reopened
from .test_engine_batch_path import _counters, _items, _session, _step, laid_out
from .test_saved_run import _acked, _memory_kit, _mostly_acknowledged, _stored, third_derive_raises

Item = tuple[int, tmqp.Frame, bytes]


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bool, bool]]:
    """(pushes taken, saves, answer) of each acknowledged run the engine took."""
    taken: list[tuple[int, bool, bool]] = []
    real = engine_module.push_saved_run

    def counted(*args: Any, **kw: Any) -> int:
        n = real(*args, **kw)
        taken.append((n, kw["saves"], kw["answer"]))
        return n

    monkeypatch.setattr(engine_module, "push_saved_run", counted)
    return taken


def each_alone(kit: Kit, client_id: str, items: list[Item]) -> list[Outgoing]:
    """The reference: every frame through ``Engine.receive``, outputs in order."""
    out: list[Outgoing] = []
    for _index, frame, data in items:
        out += kit.engine.receive(client_id, frame, kit.now, data)
    return out


def as_drain(kit: Kit, client_id: str, items: list[Item]) -> list[Outgoing]:
    """What the server's drain gives ``items`` read one by one: each stretch of pushes
    without headers that wait for no response (plain or acknowledged) decoded in one
    call (``tmqp.decode_message_records``) and served by ``Engine.receive_pushes``;
    every other frame alone through ``Engine.receive``, after the stretch before it."""
    out: list[Outgoing] = []
    stretch: list[bytes] = []
    for _index, frame, data in items:
        if frame.message_type == MessageType.QUEUE and not (
            frame.headers or frame.pending_response
        ):
            stretch.append(data)
            continue
        out += _served(kit, client_id, stretch)
        stretch = []
        out += kit.engine.receive(client_id, frame, kit.now, data)
    return out + _served(kit, client_id, stretch)


def _served(kit: Kit, client_id: str, datas: list[bytes]) -> list[Outgoing]:
    messages, bad = tmqp.decode_message_records(datas, Message, WIRE)
    assert not bad
    return kit.engine.receive_pushes(client_id, messages, kit.now) if messages else []


def _run_step(kit: Kit, as_run: bool, step: tuple[str, str, Any]) -> Any:
    """A session's step; its batches of frames handed over as one drain's run."""
    what, _, arg = step
    if what != "batch":
        return _step(kit, as_run, step)
    items = _items(kit, arg)
    outs = as_drain(kit, "p", items) if as_run else each_alone(kit, "p", items)
    return [(o.client_id, o.frame) for o in kit.route(outs)]


def _lockstep(run: Kit, alone: Kit, steps: list[tuple[str, str, Any]], seed: int) -> int:
    """``steps`` on both kits, output and counters compared after each; the acknowledges
    compared (positive and negative)."""
    answers = 0
    for n, step in enumerate(steps):
        run.now = alone.now = run.now + 0.001
        got = _run_step(run, True, step)
        assert got == _run_step(alone, False, step), (seed, n, step[0])
        assert _counters(run) == _counters(alone), (seed, n, step[0])
        if step[0] == "batch":
            answers += sum(1 for _, f in got if getattr(f, "message_type", 0) == MessageType.ACK)
    assert run.inbox == alone.inbox, seed
    return answers


def test_memory_queue_runs_give_what_each_push_alone_gives(
    runs: list[tuple[int, bool, bool]],
) -> None:
    answers = 0
    for seed in range(12):
        rnd = random.Random(seed)
        steps = _session(rnd, rnd.randint(10, 40))
        _mostly_acknowledged(rnd, steps)
        run, alone = (laid_out(Kit(config=BrokerConfig(wall_clock=lambda: 1.7e9)))
                      for _ in range(2))  # fmt: skip
        answers += _lockstep(run, alone, steps, seed)
    taken = [n for n, saves, answer in runs if answer and not saves]
    assert sum(n > 1 for n in taken) >= 100 and sum(taken) >= 1000  # the run path compared
    assert answers >= 1000  # acknowledges compared, not two empty outputs


def test_persistent_runs_give_what_each_push_alone_gives_before_and_after_restart(
    tmp_path: Path, runs: list[tuple[int, bool, bool]], request: pytest.FixtureRequest
) -> None:
    kept = answers = 0
    for seed in range(8):
        rnd = random.Random(seed)
        steps = _session(rnd, rnd.randint(10, 40))
        _mostly_acknowledged(rnd, steps)
        run, r_store = _kit(tmp_path / f"r{seed}", True)
        alone, a_store = _kit(tmp_path / f"a{seed}", True)
        request.addfinalizer(r_store.close)
        request.addfinalizer(a_store.close)
        answers += _lockstep(run, alone, steps, seed)
        records = _records(r_store)
        assert records == _records(a_store), seed
        kept += sum(len(v) for v in records.values())
        r_store.close()
        a_store.close()
        assert _reopened(tmp_path / f"r{seed}") == _reopened(tmp_path / f"a{seed}"), seed
    taken = [n for n, saves, answer in runs if answer and saves]
    assert sum(n > 1 for n in taken) >= 60 and sum(taken) >= 400  # the run path compared
    assert kept >= 40 and answers >= 400  # stores holding messages, acknowledges compared


def _answers(outs: list[Outgoing]) -> list[tuple[str, str | None]]:
    """(message id, nack reason or None) of each acknowledge, in output order."""
    got = []
    for o in outs:
        f = o.frame
        if isinstance(f, tmqp.Frame) and f.message_type == MessageType.ACK:
            nack = dict((k.lower(), v) for k, v in f.headers).get(Header.NACK_REASON.lower())
            got.append((f.message_id, nack))
    return got


def test_a_disk_that_fills_mid_run_acknowledges_only_what_it_stored(
    runs: list[tuple[int, bool, bool]],
) -> None:
    """Room for 5 of 12: pushes 0-4 are acknowledged and stored, 5-11 each get a
    negative acknowledge ("failed") in its place -- as each alone gets it -- and none of
    them is stored: no acknowledge says yes for a message the store does not hold."""
    results = []
    for as_run in (True, False):
        store = FullDisk(5)
        kit = _memory_kit(store)
        items = _acked(12)
        outs = as_drain(kit, "p", items) if as_run else each_alone(kit, "p", items)
        stored = _stored(store)
        results.append((outs, stored, _counters(kit)))
    assert results[0] == results[1]
    outs, stored, _ = results[0]
    assert runs == [(12, True, True)]  # (the run went through the run path, whole)
    assert _answers(outs) == [(f"m{k}", None) for k in range(5)] + [
        (f"m{k}", NackReason.FAILED) for k in range(5, 12)
    ]
    assert stored == [b"%04d" % k for k in range(5)]


def test_a_collaborator_raising_mid_run_answers_that_push_no_and_goes_on(
    runs: list[tuple[int, bool, bool]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The message model raises on the third push of a run: that push is answered
    "failed" (never a false yes), counted as an error, the others acknowledged and
    stored in order."""
    third_derive_raises(monkeypatch)
    store = FullDisk(100)
    kit = _memory_kit(store)
    errors = kit.engine.errors
    outs = as_drain(kit, "p", _acked(8))
    answers = _answers(outs)
    assert sorted(answers) == sorted(
        [(f"m{k}", None) for k in range(8) if k != 2] + [("m2", NackReason.FAILED)]
    )
    assert kit.engine.errors == errors + 1
    assert _stored(store) == [b"%04d" % k for k in range(8) if k != 2]
    assert [n for n, *_ in runs] == [3, 5]  # the run ended at the failure, the rest came back


def _pushes(ids: list[str], acked: bool) -> list[Item]:
    frames = [
        tmqp.Frame(message_type=MessageType.QUEUE, pending_ack=acked, content_type=1,
                   message_id=mid, source="p", target="ch", payload=b"x")
        for mid in ids
    ]  # fmt: skip
    return [(k, f, tmqp.encode(f)[0]) for k, f in enumerate(frames)]


@pytest.mark.parametrize("acked", [True, False], ids=["acknowledged", "plain"])
def test_a_smaller_duplicate_window_remembers_only_its_newest_ids_on_the_run_path(
    acked: bool,
) -> None:
    """``DuplicateWindow`` made smaller (8 -> 3): the queue remembers its 3 newest ids
    from then on, whichever path took the pushes.  The run paths stored ids with one
    eviction per id, so after the change a run still held 8 ids and a resend of an id
    past the 3 newest (m4) was dropped as a duplicate (each push alone: queued)."""
    kit = Kit(config=BrokerConfig(wall_clock=lambda: 1.7e9))
    kit.engine.create_channel("ch")
    kit.connect("p")
    kit.queue("p", "ch", 1, status=1, use_message_id=True, duplicate_window=8)
    as_drain(kit, "p", _pushes([f"m{k}" for k in range(8)], acked))
    kit.update("p", "ch", 1, DuplicateWindow=3)
    as_drain(kit, "p", _pushes(["n0", "n1"], acked))
    queue = kit.engine.channels["ch"].queues[1]
    assert (queue.received, queue.duplicates) == (10, 0)
    outs = as_drain(kit, "p", _pushes(["m4", "n1"], acked))
    assert (queue.received, queue.duplicates) == (11, 1)  # m4 queued again, n1 a duplicate
    if acked:  # each answered as taken (a duplicate too: done before)
        assert _answers(outs) == [("m4", None), ("n1", None)]
