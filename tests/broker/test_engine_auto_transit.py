"""AUTO transits (``broker.engine.flow.AUTO``): a message ``Queue.accept_many`` sends at
once to the single consumer of an acknowledged queue, which acknowledges it by taking
(STOMP ``ack:auto``), leaves without a queue message or ``pending`` entry.

Differential: two engines built alike (a STOMP ``/queue/``'s options, the per-message
handler), the same steps on both; one publishes with the door's own ids
(``unique_ids=True``: AUTO transits allowed), the other without (``unique_ids=False``:
every delivery tracked, as before AUTO transits existed).  Every output frame in order,
the queue's counters (received, sent, deliveries, acks, nacks, in flight, pending, the
window used, what waits), the store's appends and removals and the credit windows must
be the same; the first engine must have sent AUTO transits where the steps say so.

The steps are the adversary cases: runs that fill the window (the rest queued, then
drained), a persistent SEND among plain ones (tracked, saved, in order with them), the
quiet test turning False while AUTO deliveries are in flight (a ``credit``, a selector
elsewhere) and back, a consumer that leaves (disconnect) with AUTO and tracked
deliveries interleaved and not yet taken, an UNSUBSCRIBE whose deliveries the transport
gives back unwritten and NACKs (the STOMP listener's "unsubscribed meanwhile" and held
deliveries of a subscription that goes), a channel no longer acknowledged by taking
while AUTO deliveries are in flight (a shared subscription: the listener ACKs them), and
a mixed set of consumers (one ``ack:auto``, one ``ack:client``)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from broker.engine.delivery import Decision, PerMessageDeliveryHandler
from broker.engine.engine import Engine
from broker.engine.flow import AUTO
from broker.engine.options import BrokerConfig, ChannelOptions, ChannelQueueOptions
from broker.engine.per_message import PER_MESSAGE, Credit, PerMessageRules
from broker.message import Message
from broker.protocol import ConnectionInfo, NackReason, QueueStatus
from broker.store import StoredMessage
from broker.store.memory import MemoryStore

WALL = 1_700_000_000.0
CHANNEL = "q"
OTHER = "elsewhere"
STAMP = (("Stomp-User", "p"),)
#: A STOMP ``/queue/``'s options (``broker.stomp.engine_mapping.QUEUE_OPTIONS``).
OPTIONS = ChannelQueueOptions(
    status=QueueStatus.ROUND_ROBIN,
    request_acknowledge=True,
    acknowledge_timeout=0,
    message_delivery_handler=PER_MESSAGE,
)


class Counting(PerMessageDeliveryHandler):
    """The per-message handler with its quiet test and the four hooks it speaks for
    defined here (so the test is honoured), each hook call recorded: where the quiet
    test says False, the same hooks must be called for the same deliveries."""

    def __init__(self, wall_clock: Any) -> None:
        super().__init__(wall_clock)
        self.calls: list[tuple[str, str]] = []

    def quiet_test(self, queue: Any) -> Any:
        return super().quiet_test(queue)

    def begin_send(self, queue: Any, message: Any) -> Decision:
        self.calls.append(("begin_send", message.message_id))
        return super().begin_send(queue, message)

    def can_consumer_receive(self, queue: Any, message: Any, receiver: Any) -> bool:
        self.calls.append(("can_consumer_receive", message.message_id))
        return super().can_consumer_receive(queue, message, receiver)

    def consumer_received(self, queue: Any, delivery: Any, receiver: Any) -> Decision:
        self.calls.append(("consumer_received", delivery.message.message_id))
        return super().consumer_received(queue, delivery, receiver)

    def acknowledge_received(self, queue: Any, ack: Any, delivery: Any, success: bool) -> Decision:
        self.calls.append(("acknowledge_received", ack.message_id))
        return super().acknowledge_received(queue, ack, delivery, success)


class PerPush(Counting):
    """Its ``received_from_producer`` answers each push (not declared by header block):
    it is asked for every message, and refuses (drops) the messages whose id ends in 3,
    whatever their header block."""

    def received_from_producer(self, queue: Any, message: Any, sender: Any) -> Decision:
        self.calls.append(("received_from_producer", message.message_id))
        if message.message_id.endswith("3"):
            return Decision(allow=False)
        return super().received_from_producer(queue, message, sender)


class LoggedStore(MemoryStore):
    """A memory store that records every append and removal, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, Any, int]] = []

    def append(self, queue: Any, message: StoredMessage) -> None:
        self.log.append(("append", queue, message.sequence))
        super().append(queue, message)

    def remove(self, queue: Any, sequence: int) -> None:
        self.log.append(("remove", queue, sequence))
        super().remove(queue, sequence)


class Steps:
    """The same steps on one engine, everything they give recorded."""

    #: Its ``ack:auto`` consumers' transports take runs (``acknowledge_taken``'s
    #: ``runs``: ``Client.auto_runs``); here not: one ``Tracked`` frame per delivery.
    takes_runs = False

    def __init__(self, unique_ids: bool, window: int = 4, per_push: bool = False) -> None:
        handler = (PerPush if per_push else Counting)(lambda: WALL)
        self.handler = handler
        self.rules: PerMessageRules = handler.rules
        self.store = LoggedStore()
        self.engine = Engine(
            new_id=iter(f"id{n}" for n in range(1, 10_000)).__next__,
            store=self.store,
            config=BrokerConfig(wall_clock=lambda: WALL),
            handlers={PER_MESSAGE: handler},
        )
        self.unique_ids = unique_ids
        self.window = window
        self.producer, _ = self.engine.connect(ConnectionInfo(client_id="p"), 0.0)
        for name in (CHANNEL, OTHER):
            self.engine.create_channel(name)
            self.engine.create_queue(name, 0, OPTIONS)
        self.trace: list[Any] = []
        self.got: dict[str, list[Message]] = {}  # frames sent and not yet settled
        self.autos = 0  # AUTO transits seen in the consumers' unsent queues
        self.n = 0
        self.order: list[str] = []  # message ids a scenario noted

    @property
    def queue(self) -> Any:
        return self.engine.channels[CHANNEL].queues[0]

    def consumer(self, cid: str, auto: bool, channel: str = CHANNEL, low: bool = False) -> str:
        properties = {"Consumer-Priority": "low"} if low else {}
        info = ConnectionInfo(client_id=cid, properties=properties)
        consumer, out = self.engine.connect(info, 0.0)
        self.record(out)
        self.record(self.engine.subscribe(consumer, channel, 0.0, prefetch=self.window))
        if auto:
            assert self.engine.acknowledge_taken(consumer, channel, runs=self.takes_runs)
        return consumer

    def record(self, out: list[Any]) -> None:
        self.trace.append(list(out))
        for cid, frame in out:
            if isinstance(frame, Message) and frame.target == CHANNEL:
                self.got.setdefault(cid, []).append(frame)
        for client in self.engine.clients.values():
            self.autos += sum(1 for t in client.unsent if t[0] == AUTO)

    def messages(self, k: int, *headers: tuple[str, str]) -> list[Message]:
        made = []
        for _ in range(k):
            made.append(
                Message(
                    f"m{self.n}",
                    "p",
                    CHANNEL,
                    0,
                    headers=headers + STAMP,
                    payload=b"%d" % self.n,
                )
            )
            self.n += 1
        return made

    def block(self, k: int, *headers: tuple[str, str]) -> list[Message]:
        """``k`` messages sharing one header block object, as a run of the door's SENDs
        with the same headers does (``Queue._auto_stretch`` takes such runs)."""
        shared = headers + STAMP
        return [m._replace(headers=shared) for m in self.messages(k)]

    def publish(self, messages: list[Message]) -> None:
        out, taken, why = self.engine.publish_many(
            self.producer, messages, 0.0, unique_ids=self.unique_ids
        )
        self.trace.append((taken, why))
        self.record(out)

    def take(self, cid: str, count: int | None = None, unwritten: tuple[int, ...] = ()) -> None:
        """The transport is done with ``count`` (all) of what ``cid`` was sent and not yet
        taken; ``unwritten``: the positions among them that never reached the socket."""
        client = self.engine.clients[cid]
        n = len(client.unsent) if count is None else count
        left = {cid: unwritten} if unwritten else None
        self.record(self.engine.transmitted({cid: n}, 0.0, left))

    def settle(self, cid: str, frames: list[Message], ok: bool) -> None:
        reason = None if ok else NackReason.NONE
        acks = [(CHANNEL, 0, f.message_id, reason) for f in frames]
        self.record(self.engine.acknowledge_many(cid, acks, 0.0))

    def state(self) -> Any:
        q = self.queue
        waiting = [(m.seq, m.message_id, m.put_backs) for m in _waiting(q)]
        return (
            q.received,
            q.sequence,
            q.message_count,
            q.sent,
            q.deliveries,
            q.acks,
            q.nacks,
            len(q.pending) + q.auto_in_flight,  # (PendingAcknowledges)
            dict(q.used),
            q.rr,
            waiting,
            list(self.store.log),
            list(self.handler.calls),
            self.engine.errors,
        )

    def snapshot(self) -> None:
        self.trace.append(self.state())


def _waiting(q: Any) -> list[Any]:
    """The queue's waiting messages in the order they would be sent."""
    messages = q.messages
    messages.flush_front()
    return [*messages.priority, *messages.regular]


def _run(scenario: Any, window: int = 4) -> tuple[list[Any], list[Any], Steps]:
    """The scenario on both engines: (with AUTO transits, without, the first's steps)."""
    on = Steps(unique_ids=True, window=window)
    scenario(on)
    off = Steps(unique_ids=False, window=window)
    scenario(off)
    assert off.autos == 0
    return on.trace, off.trace, on


def _window_runs(s: Steps) -> None:
    a = s.consumer("a", auto=True)
    s.publish(s.messages(10))  # 4 AUTO, 6 queued
    s.snapshot()
    s.take(a, 2)  # room for 2: drained (tracked: from the queue)
    s.snapshot()
    s.take(a)
    s.take(a)
    s.take(a)
    s.snapshot()
    s.publish(s.messages(3))  # nothing waits: AUTO again
    s.take(a, 1)
    s.publish(s.messages(2))
    s.take(a)
    s.snapshot()


def _persistent_among_plain(s: Steps) -> None:
    a = s.consumer("a", auto=True)
    persistent = ("persistent", "true")
    s.publish([*s.messages(1), *s.messages(1, persistent), *s.messages(2)])
    s.snapshot()  # the persistent one tracked and saved, the others AUTO
    s.take(a, 2)
    s.snapshot()  # the saved one removed from the store once acknowledged by taking
    s.publish([*s.messages(1, persistent), *s.messages(1)])
    s.record(s.engine.disconnect(a, 1.0))  # all four back, in send order
    s.snapshot()
    b = s.consumer("b", auto=True)
    s.record(s.engine.transmitted({}, 1.0))
    s.take(b)
    s.take(b)
    s.snapshot()


def _quiet_turns(s: Steps) -> None:
    a = s.consumer("a", auto=True)
    other = s.consumer("o", auto=False, channel=OTHER)
    s.publish(s.messages(3))  # AUTO
    credit = Credit(5, 0)
    s.rules.set_credit(OTHER, other, credit)  # no longer quiet, broker-wide
    s.take(a, 1)  # taken now: the handler is asked (as for a tracked one)
    s.publish(s.messages(1))  # tracked
    s.take(a)
    s.snapshot()
    s.rules.set_credit(OTHER, other, None)
    s.publish(s.messages(3))  # AUTO again
    s.rules.set_selector(OTHER, other, _selects_x)  # a selector elsewhere: not quiet
    s.take(a)
    s.rules.set_selector(OTHER, other, None)
    s.snapshot()
    s.publish(s.messages(2))  # AUTO
    s.rules.set_credit(CHANNEL, a, Credit(2, 0))  # the consumer's own credit now
    s.publish(s.messages(3))  # tracked: two more within the credit, the third waits
    s.publish(s.messages(1, ("expires", "1")))  # waits behind it (dropped when reached)
    s.take(a)
    s.snapshot()
    s.rules.set_credit(CHANNEL, a, None)
    s.record(s.engine.transmitted({}, 0.0))
    s.take(a)
    s.publish(s.messages(1, ("expires", "1")))  # not quiet: begin_send drops it
    s.publish(s.messages(1, ("message_group", "g")))  # not quiet: tracked, group held
    s.publish(s.messages(1))  # not quiet (a group in flight): tracked
    s.take(a)
    s.snapshot()
    # one run, the plain ones sharing one header block object (as the door's SENDs
    # without headers share ``()``): a group sent tracked between them ends the quiet
    bare = [Message(f"b{i}", "p", CHANNEL, 0, payload=b"b") for i in range(4)]
    group = (("message_group", "h"), ("persistent", "true"))  # (saved: not asked quiet)
    grouped = Message("bg", "p", CHANNEL, 0, headers=group, payload=b"g")
    s.publish([bare[0], bare[1], grouped, bare[2], bare[3]])
    s.take(a)
    s.take(a)  # (the window's fourth went when the first were taken)
    s.snapshot()


def _leave_interleaved(s: Steps) -> None:
    a = s.consumer("a", auto=True)
    persistent = ("persistent", "true")
    s.publish(s.messages(1))  # AUTO
    s.rules.set_credit(OTHER, s.consumer("o", auto=False, channel=OTHER), Credit(5, 0))
    s.publish(s.messages(1))  # tracked (not quiet)
    s.rules.set_credit(OTHER, "o", None)
    s.publish([*s.messages(1), *s.messages(1, persistent)])  # AUTO, tracked
    s.take(a, 1)  # the first taken: three in flight, interleaved
    s.snapshot()
    s.record(s.engine.disconnect(a, 1.0))  # killed: back at the front, in send order
    s.snapshot()
    b = s.consumer("b", auto=False)  # a client-acknowledging consumer gets them
    s.record(s.engine.transmitted({}, 1.0))
    s.take(b)
    s.order = [f.message_id for f in s.got[b]]
    s.settle(b, s.got.pop(b, []), True)
    s.snapshot()


def _unsubscribed_meanwhile(s: Steps) -> None:
    a = s.consumer("a", auto=True)
    s.publish(s.messages(3))  # AUTO, on their way to the listener
    s.take(a, 1)  # the first one written
    s.record(s.engine.unsubscribe(a, CHANNEL, 0.0))
    # the listener: the other two reached a subscription gone, never written; NACKed
    frames = s.got.pop(a)[1:]
    s.take(a, 2, unwritten=(0, 1))
    s.settle(a, frames, False)
    s.snapshot()  # back, not counted sent, not redeliveries
    b = s.consumer("b", auto=True)
    s.record(s.engine.transmitted({}, 0.0))
    s.take(b)
    s.snapshot()


def _held_then_gone(s: Steps) -> None:
    """The listener held deliveries for an ack:auto subscription that goes (session 19's
    ``_return_held``): ``acknowledge_taken`` off first (``leaving``), then the held ones
    reported done with, unwritten, and NACKed; one tracked among them."""
    a = s.consumer("a", auto=True)
    s.publish(s.messages(2))
    s.rules.set_credit(OTHER, s.consumer("o", auto=False, channel=OTHER), Credit(5, 0))
    s.publish(s.messages(1))  # tracked
    s.rules.set_credit(OTHER, "o", None)
    s.publish(s.messages(1))
    s.take(a, 1)
    held = s.got.pop(a)[1:]
    s.engine.acknowledge_taken(a, CHANNEL, on=False)
    s.take(a, 3, unwritten=(0, 1, 2))
    s.settle(a, held, False)  # back, and sent to ``a`` again (tracked: not auto now)
    s.record(s.engine.unsubscribe(a, CHANNEL, 0.0))
    again = s.got.pop(a, [])  # they reach the listener after the subscription went
    assert [f.message_id for f in again] == ["m1", "m2", "m3"]
    s.take(a, 3, unwritten=(0, 1, 2))
    s.settle(a, again, False)
    s.snapshot()
    b = s.consumer("b", auto=True)
    s.record(s.engine.transmitted({}, 0.0))
    s.take(b)
    s.snapshot()


def _no_longer_taking(s: Steps) -> None:
    """A second subscription shares the consumer: the listener acknowledges from then on
    (``acknowledge_taken`` off) while AUTO deliveries are in flight; they wait for it."""
    a = s.consumer("a", auto=True)
    s.publish(s.messages(3))
    s.take(a, 1)
    s.engine.acknowledge_taken(a, CHANNEL, on=False)
    s.take(a)
    s.snapshot()  # two waiting for their acknowledge
    frames = s.got.pop(a)
    s.settle(a, frames[1:2], True)
    s.settle(a, frames[2:], False)  # the last one NACKed: redelivered
    s.take(a)
    s.snapshot()
    s.record(s.engine.disconnect(a, 1.0))  # holding it: back to the queue
    s.snapshot()
    b = s.consumer("b", auto=True)
    s.record(s.engine.transmitted({}, 1.0))
    s.take(b)
    s.order = [f.message_id for f in s.got[b]]
    s.snapshot()


def _mixed_consumers(s: Steps) -> None:
    a = s.consumer("a", auto=True)
    c = s.consumer("c", auto=False)
    s.publish(s.messages(5))  # two consumers: round robin, tracked
    s.take(a)
    s.take(c)
    s.settle(c, s.got.pop(c, []), True)
    s.snapshot()
    s.record(s.engine.disconnect(c, 1.0))
    s.publish(s.messages(3))  # one consumer left: AUTO
    c = s.consumer("c", auto=False)
    s.publish(s.messages(3))
    s.take(a)
    s.take(c)
    s.settle(c, s.got.pop(c, []), True)
    s.snapshot()


def _round_robin(s: Steps) -> None:
    """Several consumers: two ``ack:auto`` (AUTO transits in turn), one ``ack:client``
    (tracked in its turn), then a low-priority ``ack:auto`` one that gets a message only
    when the others are full; windows fill, consumers leave and come back."""
    a = s.consumer("a", auto=True)
    b = s.consumer("b", auto=True)
    c = s.consumer("c", auto=False)
    s.publish(s.messages(7))
    s.snapshot()
    s.take(a, 1)
    s.take(c)
    s.settle(c, s.got.pop(c, []), True)
    s.publish(s.messages(9))  # windows of 4: some wait
    s.snapshot()
    low = s.consumer("low", auto=True, low=True)
    s.publish(s.messages(2))  # the low-priority one takes what nobody else has room for
    s.snapshot()
    s.record(s.engine.disconnect(b, 1.0))  # b leaves holding AUTO deliveries
    s.take(a)
    s.take(low)
    s.take(c)
    s.settle(c, s.got.pop(c, []), True)
    s.publish(s.messages(5))
    for _ in range(4):
        s.take(a)
        s.take(low)
        s.take(c)
        s.settle(c, s.got.pop(c, []), True)
    s.snapshot()


def _shared_block_runs(s: Steps) -> None:
    """Runs whose messages share one header block: the single consumer's AUTO loop
    (``Queue._auto_stretch``) until its room runs out mid-run (the rest queued, drained
    tracked), then runs mixing blocks (each new block asked again, a persistent one
    tracked and saved between AUTO ones), a message with octets
    inside a run and one without an id (the outer loop decides them: replaced; an id
    made), and a run after the quiet test turned
    False and back."""
    a = s.consumer("a", auto=True)
    s.publish(s.block(s.window + 3))  # the window's room, the rest queued
    s.snapshot()
    s.take(a, 1)
    s.take(a)
    s.take(a)
    s.snapshot()
    first, second = s.block(3), s.block(2, ("k", "v"))
    persistent = s.block(2, ("persistent", "true"))
    s.publish([first[0], first[1], *second, first[2], persistent[0], *s.block(2)])
    s.take(a)
    s.take(a)
    s.snapshot()
    run = s.block(4)
    run[2] = run[2]._replace(wire=(b"d", b"x"))  # octets: replaced, then as before
    run[3] = run[3]._replace(message_id="")  # (an id made for it)
    s.publish(run)
    s.take(a)
    s.snapshot()
    s.publish([*persistent[1:], *s.block(2)])
    s.take(a)
    s.take(a)
    other = s.consumer("o", auto=False, channel=OTHER)
    s.rules.set_credit(OTHER, other, Credit(5, 0))  # not quiet: tracked
    s.publish(s.block(3))
    s.take(a)
    s.rules.set_credit(OTHER, other, None)
    s.publish(s.block(3))  # quiet again: AUTO
    s.take(a)
    s.take(a)
    s.snapshot()


SCENARIOS = {
    "shared-block": (_shared_block_runs, True),
    "round-robin": (_round_robin, True),
    "window": (_window_runs, True),
    "persistent": (_persistent_among_plain, True),
    "quiet-turns": (_quiet_turns, True),
    "leave-interleaved": (_leave_interleaved, True),
    "unsubscribed-meanwhile": (_unsubscribed_meanwhile, True),
    "held-then-gone": (_held_then_gone, True),
    "no-longer-taking": (_no_longer_taking, True),
    "mixed": (_mixed_consumers, True),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_auto_transits_give_what_tracked_deliveries_give(name: str) -> None:
    scenario, uses_auto = SCENARIOS[name]
    on, off, steps = _run(scenario)
    assert on == off
    assert (steps.autos > 0) is uses_auto
    q = steps.queue
    assert q.message_count == 0 and not q.pending and not q.used and not q.auto_in_flight
    assert steps.engine.errors == 0


@pytest.mark.parametrize("window", [1, 2])
def test_a_small_window_stops_the_single_consumers_loop(window: int) -> None:
    """Prefetch 1 and 2: the single consumer's AUTO loop has no room or one more."""
    on, off, steps = _run(_shared_block_runs, window=window)
    assert on == off
    assert steps.autos > 0
    assert steps.engine.errors == 0


def test_a_handler_answering_each_push_is_asked_for_each() -> None:
    """A handler whose answer is not the header block's (``received_by_headers``
    False) is asked for every message of a shared-block run, and a message it drops
    inside the run is dropped: the single consumer's AUTO loop does not take the run."""
    traces = []
    for unique in (True, False):
        s = Steps(unique_ids=unique, window=8, per_push=True)
        a = s.consumer("a", auto=True)
        s.publish(s.block(6))  # m0..m5: m3 dropped
        s.take(a)
        s.snapshot()
        traces.append((s.trace, s.autos))
    (on, autos), (off, _) = traces
    assert on == off
    assert autos > 0
    calls = on[-1][12]
    assert [mid for name, mid in calls if name == "received_from_producer"] == [
        f"m{i}" for i in range(6)
    ]


def test_nothing_given_back_is_a_redelivery() -> None:
    """What never reached the socket comes back without ``Delivery-Count``: the consumer
    that gets it next sees it as a first delivery (tracked and AUTO alike)."""
    s = Steps(unique_ids=True)
    _unsubscribed_meanwhile(s)
    frames = s.got["b"]
    assert [f.message_id for f in frames] == ["m1", "m2"]
    assert all(not any(k.lower() == "delivery-count" for k, _ in f.headers) for f in frames)
    q = s.queue
    assert (q.sent, q.deliveries, q.acks, q.nacks) == (3, 3, 3, 2)


def test_a_leaving_consumer_gets_its_deliveries_back_in_send_order() -> None:
    s = Steps(unique_ids=True)
    _leave_interleaved(s)
    assert s.order == ["m1", "m2", "m3"]
    assert s.autos > 0


def _selects_x(headers: Any) -> bool:
    return ("x", "1") in headers


def test_a_channel_destroyed_when_empty_waits_for_its_auto_deliveries() -> None:
    """Its only consumer leaves while AUTO deliveries are on their way (STOMP: an
    UNSUBSCRIBE the listener answers by NACKing them): the channel is not empty until
    they are back, so it is not removed with them (they would be lost)."""
    for unique_ids in (True, False):
        s = Steps(unique_ids)
        s.engine.create_channel("temp", ChannelOptions(destroy_when_empty=True))
        s.engine.create_queue("temp", 0, OPTIONS)
        a = s.consumer("a", auto=True, channel="temp")
        messages = [Message(f"t{i}", "p", "temp", 0, payload=b"t") for i in range(3)]
        out, taken, _ = s.engine.publish_many(s.producer, messages, 0.0, unique_ids=unique_ids)
        assert taken == 3 and len(out) == 3
        autos = sum(t[0] == AUTO for t in s.engine.clients[a].unsent)
        assert autos == (3 if unique_ids else 0)
        s.record(s.engine.unsubscribe(a, "temp", 0.0))
        assert "temp" in s.engine.channels  # three deliveries in flight
        s.take(a, 3, unwritten=(0, 1, 2))
        acks = [("temp", 0, f"t{i}", NackReason.NONE) for i in range(3)]
        s.record(s.engine.acknowledge_many(a, acks, 0.0))
        q = s.engine.channels["temp"].queues[0]
        assert q.message_count == 3 and q.nacks == 3 and q.sent == 0


def test_wait_for_acknowledge_waits_for_auto_deliveries_in_flight() -> None:
    """``WaitForAcknowledge`` turned on while AUTO deliveries (``accept_many``'s, sent at
    once) are in flight: a push waits until they are taken, as it waits for tracked
    deliveries (an AUTO one waits for its acknowledge by taking)."""
    traces = []
    for unique in (True, False):
        s = Steps(unique_ids=unique, window=8)
        a = s.consumer("a", auto=True)
        s.publish(s.block(3))
        q = s.queue
        out: list[Any] = []
        q.apply_options(dataclasses.replace(q.options, wait_for_acknowledge=True), 0.0, out)
        s.record(out)
        s.publish(s.block(2))  # (waits: three in flight)
        s.snapshot()
        s.take(a)
        s.take(a)
        s.take(a)
        s.snapshot()
        traces.append((s.trace, s.autos))
    (on, autos), (off, _) = traces
    assert autos > 0
    assert on == off
