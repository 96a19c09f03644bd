"""Every place that can make a queue's duplicate window smaller trims it at once.

The paths that store one id per push (``RecentIds.add_new`` and the run paths that inline
it: ``Queue.push_plain``, ``push_plain_run``, ``broadcast_run``, ``saved_run``) evict at
most one id per id stored: a window larger than ``DuplicateWindow`` stays larger under
them.  So the trim lives where the window gets smaller, and these tests pin each place:

* an option update (``Queue.apply_options`` -> ``RecentIds.keep_newest``), whichever path
  takes the pushes after it;
* a restart of a persistent broker whose queue was made smaller before (``kill -9``): the
  new window is filled from the recovered messages (``restore_index``/``restore_all``)
  with the newest ``DuplicateWindow`` of their ids only (a queue that pages reads the
  ids of its newest messages only, and ``RecentIds.add`` evicts past the window: the
  test fails with both removed).

Each case remembers ids a..e, makes the window 2, then pushes ``b`` (past the 2 newest:
must be queued) and ``e`` (within: must be a duplicate).  Removing a trim makes ``b`` a
duplicate (its producer told "done", the message dropped).
"""

from __future__ import annotations

from typing import Any

import pytest
import zmq

from broker import tmqp
from broker.client.blocking import Client
from broker.engine.options import BrokerConfig
from broker.protocol import MessageType, QueueStatus
from tests.broker.test_durable_serve import Broker

from .engine_kit import Frame, Kit

FIRST = ("a", "b", "c", "d", "e")
QUEUE = 1


def _frame(mid: str, *, acked: bool) -> Frame:
    return Frame(message_type=MessageType.QUEUE, content_type=QUEUE, target="ch",
                 message_id=mid, source="p", payload=b"x", pending_ack=acked)  # fmt: skip


def _as_run(kit: Kit, mids: tuple[str, ...], *, acked: bool = False) -> None:
    """The pushes in one TMQP batch (``Engine.receive_batch``: the run paths)."""
    frames = [_frame(mid, acked=acked) for mid in mids]
    items = [(i, f, tmqp.encode(f)[0]) for i, f in enumerate(frames)]
    kit.route(kit.engine.receive_batch("p", items, kit.now)[0])


def _one_by_one(kit: Kit, mids: tuple[str, ...]) -> None:
    for mid in mids:
        kit.push("p", "ch", QUEUE, mid=mid)


def _kit(path: str) -> Kit:
    kit = Kit(config=BrokerConfig(wall_clock=lambda: 1_700_000_000.0))
    kit.connect("p")
    if path == "broadcast run":  # a fan-out stream: broadcast_run.publish_plain_run
        kit.engine.enable_fanout("tcp://127.0.0.1:5999")
        kit.queue("p", "ch", QUEUE, status=QueueStatus.BROADCAST, use_message_id=True,
                  duplicate_window=100)  # fmt: skip
        return kit
    kit.queue("p", "ch", QUEUE, status=1, use_message_id=True, duplicate_window=100)
    kit.connect("c")
    kit.join("c", "ch")
    return kit


PATHS: dict[str, Any] = {
    "single pushes": _one_by_one,  # Queue.push_plain
    "plain run": _as_run,  # Queue.push_plain_run
    "broadcast run": _as_run,  # broadcast_run.publish_plain_run
    "acknowledged run": lambda kit, mids: _as_run(kit, mids, acked=True),  # saved_run
}


@pytest.mark.parametrize("path", list(PATHS))
def test_an_option_update_trims_the_window_for_every_path(path: str) -> None:
    kit = _kit(path)
    push = PATHS[path]
    push(kit, FIRST)
    kit.update("p", "ch", QUEUE, DuplicateWindow=2)  # the window now d, e
    push(kit, ("b",))  # forgotten: a new message
    info = kit.info("p", "ch", QUEUE)
    assert (info["DuplicateMessages"], info["ReceivedMessages"]) == (0, 6)
    push(kit, ("b",))  # remembered now: a duplicate (the suppression is on)
    info = kit.info("p", "ch", QUEUE)
    assert (info["DuplicateMessages"], info["ReceivedMessages"]) == (1, 6)


PERSISTENT = {
    "MessageDeliveryHandler": "persistent",
    "RequestAcknowledge": True,
    "UseMessageId": True,
    "DuplicateWindow": 100,
}


def _push(c: Client, mid: str) -> None:
    c.push("ch", QUEUE, mid.encode(), message_id=mid, ack=True)


def _duplicates(c: Client) -> tuple[int, int]:
    info = c.queue_info("ch", QUEUE)
    return info["DuplicateMessages"], info["ReceivedMessages"]


def test_a_restart_fills_a_smaller_window_with_the_newest_ids_only(
    served: Broker, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    """The window made 2 while five messages wait, then ``kill -9`` and a restart: the
    new window holds the ids of the two newest recovered messages (d, e), not all five."""
    with Client(served.endpoint, context=zctx, timeout=10).connect() as c:
        c.create_queue("ch", QUEUE, PERSISTENT)
        for mid in FIRST:
            _push(c, mid)  # acknowledged: saved and synced
        c.update_queue("ch", QUEUE, {"DuplicateWindow": 2})
    served.kill()
    served.start()
    with Client(served.endpoint, context=zctx, timeout=10).connect() as c:
        before = _duplicates(c)
        _push(c, "b")  # past the two newest recovered: queued
        assert _duplicates(c) == (before[0], before[1] + 1)
        _push(c, "e")  # the newest recovered: a duplicate
        assert _duplicates(c) == (before[0] + 1, before[1] + 1)
