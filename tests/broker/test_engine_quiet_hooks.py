"""The per-message handler's quiet test (``DeliveryHandler.quiet_test``): a queue skips
``begin_send``, ``can_consumer_receive``, ``consumer_received`` and a positive
``acknowledge_received`` for a message the rules would leave alone.  Differential: two
engines built alike, one with the per-message handler, one with a subclass that
overrides a hook (so its quiet test is not honoured and every hook is called); the same
steps on both, comparing every output frame in order, the queues' counters, the credit
windows, the groups held and the expired count.

The steps mix what makes the rules speak with plain messages sent quietly: groups,
``expires`` come and not, ``persistent``, credit set while quiet deliveries are in
flight (their acknowledges give back nothing), credit that runs out, an exclusive
consumer, an owned channel, NACK redeliveries, a consumer that leaves holding quiet
deliveries (acknowledged by taking and by ACK) and one that leaves before the
transport took them."""

from __future__ import annotations

from typing import Any

from broker.engine.delivery import Decision, PerMessageDeliveryHandler
from broker.engine.engine import Engine
from broker.engine.options import BrokerConfig, ChannelQueueOptions
from broker.engine.per_message import PER_MESSAGE, Credit, PerMessageRules
from broker.message import Message
from broker.protocol import ConnectionInfo, NackReason, QueueStatus
from broker.store.memory import MemoryStore

STAMP = (("Stomp-User", "p"), ("Stomp-Timestamp", "1700000000000"))
WALL = 1_700_000_000.0
CHANNEL = "q"


class Loud(PerMessageDeliveryHandler):
    """The per-message rules with ``consumer_received`` overridden (and counted): the
    quiet test, defined above it, does not speak for it, so every hook is called."""

    def __init__(self, wall_clock: Any) -> None:
        super().__init__(wall_clock)
        self.received = 0

    def consumer_received(self, queue: Any, delivery: Any, receiver: Any) -> Decision:
        self.received += 1
        return super().consumer_received(queue, delivery, receiver)


class Broken(PerMessageDeliveryHandler):
    """The per-message rules whose quiet test raises."""

    def quiet_test(self, queue: Any) -> Any:
        def test(headers: Any) -> bool:
            raise RuntimeError("quiet test broke")

        return test

    # (the four hooks defined here too: the test is honoured, and raises)
    def begin_send(self, queue: Any, message: Any) -> Decision:
        return super().begin_send(queue, message)

    def can_consumer_receive(self, queue: Any, message: Any, receiver: Any) -> bool:
        return super().can_consumer_receive(queue, message, receiver)

    def consumer_received(self, queue: Any, delivery: Any, receiver: Any) -> Decision:
        return super().consumer_received(queue, delivery, receiver)

    def acknowledge_received(self, queue: Any, ack: Any, delivery: Any, success: bool) -> Decision:
        return super().acknowledge_received(queue, ack, delivery, success)


def _engine(handler: PerMessageDeliveryHandler) -> tuple[Engine, str]:
    engine = Engine(
        new_id=iter(f"id{n}" for n in range(1, 10_000)).__next__,
        store=MemoryStore(),
        config=BrokerConfig(wall_clock=lambda: WALL),
        handlers={PER_MESSAGE: handler},
    )
    producer, _ = engine.connect(ConnectionInfo(client_id="p"), 0.0)
    engine.create_channel(CHANNEL)
    options = ChannelQueueOptions(
        status=QueueStatus.ROUND_ROBIN,
        request_acknowledge=True,
        message_delivery_handler=PER_MESSAGE,
    )
    engine.create_queue(CHANNEL, 0, options)
    return engine, producer


def _consumer(engine: Engine, cid: str, auto: bool, window: int = 100) -> str:
    consumer, _ = engine.connect(ConnectionInfo(client_id=cid), 0.0)
    engine.subscribe(consumer, CHANNEL, 0.0, prefetch=window)
    if auto:
        assert engine.acknowledge_taken(consumer, CHANNEL)
    return consumer


def _m(i: int, *headers: tuple[str, str]) -> Message:
    return Message(f"m{i}", "p", CHANNEL, 0, headers=headers + STAMP, payload=b"%d" % i)


class Steps:
    """The same steps on one engine, everything they give recorded."""

    def __init__(self, handler: PerMessageDeliveryHandler) -> None:
        self.rules: PerMessageRules = handler.rules
        self.engine, self.producer = _engine(handler)
        self.trace: list[Any] = []
        self.held: dict[str, list[Message]] = {}

    def record(self, out: list[Any]) -> None:
        self.trace.append(out)
        for cid, frame in out:
            if isinstance(frame, Message) and frame.content_type == 0:
                self.held.setdefault(cid, []).append(frame)

    def publish(self, messages: list[Message]) -> None:
        out, taken, why = self.engine.publish_many(self.producer, messages, 0.0, unique_ids=True)
        self.trace.append((taken, why))
        self.record(out)

    def take(self, cid: str, count: int | None = None) -> None:
        """The transport took ``count`` (all) of what ``cid`` was sent and not yet taken."""
        client = self.engine.clients[cid]
        n = len(client.unsent) if count is None else count
        self.record(self.engine.transmitted({cid: n}, 0.0))

    def ack(self, cid: str, nack_first: bool = False) -> None:
        frames, self.held[cid] = self.held.get(cid, []), []
        acks = [
            (CHANNEL, 0, f.message_id, NackReason.NONE if nack_first and i == 0 else None)
            for i, f in enumerate(frames)
        ]
        self.record(self.engine.acknowledge_many(cid, acks, 0.0))

    def state(self) -> Any:
        q = self.engine.channels[CHANNEL].queues[0]
        return (
            q.received,
            q.message_count,
            q.sent,
            q.deliveries,
            q.acks,
            q.nacks,
            len(q.pending),
            dict(q.used),
            self.rules.expired_count,
            self.rules.group_owner(CHANNEL, "g"),
        )


def _scenario(handler: PerMessageDeliveryHandler) -> tuple[list[Any], Steps]:
    s = Steps(handler)
    auto = _consumer(s.engine, "auto", auto=True)
    client = _consumer(s.engine, "client", auto=False)
    n = iter(range(1000))

    def plain(k: int) -> list[Message]:
        return [_m(next(n)) for _ in range(k)]

    s.publish(plain(6))  # round robin, quiet
    s.take(auto)
    s.take(client)
    s.trace.append(s.state())
    credit = Credit(2, 0)  # set while the client holds quiet deliveries
    s.rules.set_credit(CHANNEL, client, credit)
    s.publish(plain(5))  # the client takes 2 more under credit, the rest go to auto
    s.take(auto)
    s.take(client)
    s.trace.append((credit.count, credit.size, s.state()))
    s.ack(client)  # the quiet ones give back nothing; the two charged give back 2
    s.trace.append((credit.count, credit.size, s.state()))
    s.rules.set_credit(CHANNEL, client, None)
    group = ("message_group", "g")
    s.publish([_m(next(n), group), *plain(2), _m(next(n), group), *plain(1)])
    s.take(auto)
    s.take(client)
    s.trace.append(s.state())
    s.ack(client, nack_first=True)  # the first one comes back with a delivery count
    s.take(auto)
    s.take(client)
    s.ack(client)
    s.trace.append(s.state())  # no group in flight now: the rules are quiet again
    s.publish(
        [
            _m(next(n), ("expires", "1")),  # its time has come: dropped
            *plain(1),
            _m(next(n), ("expires", "99999999999999")),
            _m(next(n), ("persistent", "true")),
        ]
    )
    s.take(auto)
    s.take(client)
    s.ack(client)
    s.trace.append(s.state())
    s.rules.set_exclusive(CHANNEL, client, True)
    s.publish(plain(4))  # all to the exclusive one
    s.take(client)
    s.ack(client)
    s.rules.set_exclusive(CHANNEL, client, False)
    s.rules.set_owner(CHANNEL, auto)
    s.publish(plain(3))  # all to the owner
    s.take(auto)
    s.rules.set_owner(CHANNEL, None)
    s.trace.append(s.state())
    s.publish(plain(6))
    s.take(auto, 1)  # auto leaves with two sent and not taken: back to the queue
    s.take(client)  # client leaves holding quiet deliveries: they go back too
    s.trace.append(s.state())
    s.record(s.engine.disconnect(auto, 1.0))
    s.record(s.engine.disconnect(client, 1.0))
    s.trace.append(s.state())
    late = _consumer(s.engine, "late", auto=True)
    s.record(s.engine.transmitted({}, 1.0))
    s.publish(plain(2))
    s.take(late)
    s.trace.append(s.state())
    return s.trace, s


def test_quiet_sends_give_what_the_hooks_give() -> None:
    quiet, _ = _scenario(PerMessageDeliveryHandler(lambda: WALL))
    loud_handler = Loud(lambda: WALL)
    loud, steps = _scenario(loud_handler)
    assert quiet == loud
    # the loud engine's handler saw every delivery (its quiet test was not honoured)
    q = steps.engine.channels[CHANNEL].queues[0]
    assert loud_handler.received >= q.sent > 30  # (handed; two were never taken)
    assert q.message_count == 0 and not q.pending and steps.engine.errors == 0


def test_a_quiet_test_that_raises_is_counted_and_the_hooks_decide() -> None:
    broken, steps = _scenario(Broken(lambda: WALL))
    reference, _ = _scenario(PerMessageDeliveryHandler(lambda: WALL))
    assert broken == reference  # nothing differs but the errors counted
    q = steps.engine.channels[CHANNEL].queues[0]
    assert steps.engine.errors >= q.sent > 30  # one per send at least
