"""A push raising in the middle of a run of plain pushes (``Queue.push_plain_run``,
``broadcast_run.publish_plain_run``): the outcome is that of the same pushes handled one
by one, where the push that raised fails alone.

* The pushes before it are taken and counted (sequence, received; a broadcast queue's
  sent and deliveries too), the ones after it are taken as well (the engine goes on after
  the failed push: ``RunFailed.done``), the failure is counted once.
* Nothing of the failed push left the broker, so its id is forgotten: a resend of it is
  taken, not answered as a duplicate.

No real condition makes a push of the plain path raise: the path is taken only by queues
without delivery-handler hooks (persistence is one), nothing waits for an acknowledge,
the size and message limits are checked before the run.  So the fault is injected: the
step every push of the run takes first (stamping the producer's id as its source, here
done per push: the pushes come with an empty source) raises for one message id.  The
one-by-one path stamps through the same function, so both sides meet the same fault.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from broker import message as message_module
from broker import tmqp
from broker.engine.engine import Engine
from broker.engine.fanout import Publish
from broker.engine.options import BrokerConfig
from broker.engine.queue import broadcast_run as broadcast_module
from broker.engine.queue import queue as queue_module
from broker.engine.tmqp_door import message_of
from broker.fanout import FANOUT, FANOUT_TICKET, VERSION
from broker.message import Message
from broker.protocol import MessageType, Operation, QueueStatus, header
from broker.server.server import Server, ServerOptions
from tests.broker.test_batch import Raw
from tests.broker.test_push_runs import _batch_of, frames_until, push
from tests.broker.test_run_failed import peers

from .engine_kit import Frame, Kit
from .test_engine_batch_path import _counters, one_by_one

#: The run: six plain pushes; the one with id ``FAILS`` raises when it is stamped.
RUN = 6
FAILS = "m2"
CHANNEL = "ch"


def _items() -> list[tuple[int, Frame, bytes]]:
    frames = [Frame(message_type=MessageType.QUEUE, content_type=1, target=CHANNEL,
                    message_id=f"m{k}", source="", payload=b"%d" % k)
              for k in range(RUN)]  # fmt: skip
    return [(k, f, tmqp.encode(f)[0]) for k, f in enumerate(frames)]


def _failing_stamp(monkeypatch: pytest.MonkeyPatch, module: Any, fails: str = FAILS) -> list[str]:
    """``with_source`` in ``module`` raising for the push with id ``fails``, every time
    it meets it; returns the ids it raised for (kept up to date)."""
    raised: list[str] = []
    real = message_module.with_source

    def with_source(m: Message, source: str) -> Message:
        if m.message_id == fails:
            raised.append(m.message_id)
            raise RuntimeError("injected: stamping this push failed")
        return real(m, source)

    monkeypatch.setattr(module, "with_source", with_source)
    return raised


def _kit(consumers: int, prefetch: int, status: QueueStatus) -> Kit:
    kit = Kit(auto_transmit=False, config=BrokerConfig(wall_clock=lambda: 1_700_000_000.0))
    kit.connect("p")
    for k in range(consumers):
        kit.connect(f"c{k}")
        kit.join(f"c{k}", CHANNEL)
    kit.queue("p", CHANNEL, 1, status=status, prefetch=prefetch, use_message_id=True)
    return kit


def _serve(kit: Kit, entry: str, items: list[tuple[int, Frame, bytes]]) -> tuple[Any, Any, Any]:
    """``items`` through ``entry`` of ``kit``'s engine, as ``receive_batch`` answers:
    (output, refused, later); ``receive_pushes`` with its refusals asked for."""
    if entry == "receive_batch":
        return kit.engine.receive_batch("p", items, kit.now)
    refused: list[tuple[int, str, str]] = []
    messages = [message_of(f, d) for _, f, d in items]
    return kit.engine.receive_pushes("p", messages, kit.now, refused), refused, []


#: (consumers, prefetch, status): all queued, all sent at once, sent then queued mid-run
#: (the window fills at the third push), two consumers taking turns.
SHAPES = {
    "no consumer": (0, 10, QueueStatus.PUSH),
    "one consumer": (1, 10, QueueStatus.PUSH),
    "window fills mid-run": (1, 2, QueueStatus.PUSH),
    "round robin": (2, 10, QueueStatus.ROUND_ROBIN),
}


@pytest.mark.parametrize("entry", ["receive_batch", "receive_pushes"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_push_raising_mid_run_fails_alone_as_one_by_one(
    shape: str, entry: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    consumers, prefetch, status = SHAPES[shape]
    raised = _failing_stamp(monkeypatch, queue_module)
    run, single = _kit(consumers, prefetch, status), _kit(consumers, prefetch, status)
    items = _items()
    got = _serve(run, entry, items)
    want = one_by_one(single.engine, "p", items, single.now)
    assert raised == [FAILS, FAILS]  # (once on each side)
    assert got == want
    assert _counters(run) == _counters(single)
    queue = run.engine.channels[CHANNEL].queues[1]
    assert (queue.sequence, queue.received) == (RUN - 1, RUN - 1)
    assert run.engine.services.errors == single.engine.services.errors == 1
    # nothing of the failed push left the broker: its resend is taken, on both sides
    monkeypatch.undo()
    resend = items[2][1]
    for kit in (run, single):
        kit.route(got[0] if kit is run else want[0])
        kit.send("p", resend)
        q = kit.engine.channels[CHANNEL].queues[1]
        assert (q.sequence, q.received, q.duplicates) == (RUN, RUN, 0)
    assert _counters(run) == _counters(single)
    for kit in (run, single):  # every push reaches a consumer once, the resend last
        for k in range(consumers):
            kit.transmit(f"c{k}")
        delivered = [p for k in range(consumers) for p in kit.payloads(f"c{k}")]
        queue = kit.engine.channels[CHANNEL].queues[1]
        waiting = queue.n_regular
        assert len(delivered) + waiting == RUN
        assert len(set(delivered)) == len(delivered)


# ---------------------------------------------------------------- broadcast run

MEMBERS = ("f1", "f2")


def _broadcast_kit() -> Kit:
    kit = Kit(config=BrokerConfig(wall_clock=lambda: 1_700_000_000.0))
    kit.engine.enable_fanout("tcp://127.0.0.1:5999")
    kit.connect("p")
    kit.queue("p", CHANNEL, 1, status=QueueStatus.BROADCAST, use_message_id=True)
    for member in MEMBERS:
        kit.connect(member)
        reply = kit.op(member, Operation.JOIN, CHANNEL, headers=((FANOUT, VERSION),),
                       response=True)  # fmt: skip
        ticket = header(reply, FANOUT_TICKET)
        assert ticket is not None
        assert kit.engine.fanout_claim(bytes.fromhex(ticket)) is not None
    return kit


def _published(outs: list[Any]) -> list[str]:
    return [o.frame.message_id for o in outs if type(o) is Publish and o.frame is not None]


@pytest.mark.parametrize("entry", ["receive_batch", "receive_pushes"])
def test_a_push_raising_mid_broadcast_run_fails_alone_and_the_run_is_counted(
    entry: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    kit = _broadcast_kit()
    raised = _failing_stamp(monkeypatch, broadcast_module)
    items = _items()
    outs, refused, _later = _serve(kit, entry, items)
    assert raised == [FAILS]
    assert refused == [(2, "failed", "internal error")]  # (the batch's acknowledge names it)
    ids = [f"m{k}" for k in range(RUN)]
    assert _published(outs) == [mid for mid in ids if mid != FAILS]
    queue = kit.engine.channels[CHANNEL].queues[1]
    taken = RUN - 1
    counts = (queue.sequence, queue.received, queue.sent, queue.deliveries)
    assert counts == (taken, taken, taken, taken * len(MEMBERS))
    assert kit.engine.services.errors == 1
    # the failed push was not published: its resend is, once, and counted
    monkeypatch.undo()
    resend = kit.engine.receive("p", items[2][1], kit.now, items[2][2])
    assert _published(resend) == [FAILS]
    assert (queue.sequence, queue.received, queue.sent, queue.duplicates) == (RUN, RUN, RUN, 0)


@pytest.mark.parametrize("entry", ["receive_batch", "receive_pushes"])
def test_a_run_raising_outside_its_pushes_is_refused_whole(
    entry: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queue's run path raising something else than ``RunFailed`` (how far it went
    is unknown): every push of the run is named refused -- at least once, never a false
    "taken" -- and the failure counted once."""

    def push_plain_run(*_args: Any) -> int:
        raise RuntimeError("injected: the run path failed")

    kit = _kit(1, 10, QueueStatus.PUSH)
    monkeypatch.setattr(queue_module.Queue, "push_plain_run", push_plain_run)
    _outs, refused, _later = _serve(kit, entry, _items())
    assert refused == [(k, "failed", "internal error") for k in range(RUN)]
    assert kit.engine.services.errors == 1


# ---------------------------------------------------------------- on the wire


def _delivered(consumer: Raw, last: str) -> list[str]:
    return [m.message_id for m in frames_until(consumer, last) if isinstance(m, tmqp.Frame)]


@pytest.mark.parametrize("push_runs", [True, False], ids=["records", "frames"])
def test_an_acknowledged_batch_whose_push_raises_names_it_and_takes_its_resend(
    zctx: Any, monkeypatch: pytest.MonkeyPatch, push_runs: bool
) -> None:
    """A live server: a producer's acknowledged batch of six plain pushes, the third
    raising; then a plain push, its resend, another push.  The batch's acknowledge names
    the failed one by index (before: an empty one, "all taken"), on both of the server's
    paths for a batch: every other push is delivered once, in order, and the resend of
    the failed one is."""
    _failing_stamp(monkeypatch, queue_module, "w2")
    options = ServerOptions(endpoint="tcp://127.0.0.1:*", push_runs=push_runs)
    server = Server(Engine(), options, context=zctx)
    endpoint = server.start()
    try:
        admin, consumer, producer = peers(zctx, endpoint)
        try:
            pushes = [push(f"w{i}", 1, b"w%d" % i) for i in range(RUN)]
            producer.send(_batch_of("b", pushes, ack=True))
            answer = producer.frame()
            assert (answer.message_type, answer.message_id) == (MessageType.ACK, "b")
            assert json.loads(answer.payload) == {"Refused": [[2, "failed", "internal error"]]}
            producer.send(push("end", 1, b"e"))
            assert _delivered(consumer, "end") == ["w0", "w1", "w3", "w4", "w5", "end"]
            monkeypatch.undo()
            producer.send(push("w2", 1, b"w2"))  # the resend
            producer.send(push("end2", 1, b"e"))
            assert _delivered(consumer, "end2") == ["w2", "end2"]
        finally:
            admin.close()
            consumer.close()
            producer.close()
    finally:
        server.stop()
