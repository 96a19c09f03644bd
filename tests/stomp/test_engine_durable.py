"""The engine backend with a durable store: a persistent SEND's answer (the RECEIPT) and
its deliveries wait until the store says the message is durable (``OutputGate.call``);
``expires`` drops a message the queue reaches too late; an ACK handed to the engine thread
as the server stops is applied before the store closes."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import zmq

from broker.engine.delivery import PerMessageDeliveryHandler
from broker.engine.engine import Engine
from broker.engine.per_message import PER_MESSAGE
from broker.server.gate import OutputGate
from broker.server.server import Server, ServerOptions
from broker.stomp.backend import ConnectionInfo, Delivery
from broker.stomp.destinations import parse_destinations
from broker.stomp.engine_backend import EngineBackend, EngineDoor
from broker.stomp.subscription import AckMode, PublishSpec, SubscriptionSpec
from broker.store.durable import DurableStore
from broker.store.log import LogStore
from tests.polling import WAIT, wait_until


def sink(into: list[Delivery]):  # type: ignore[no-untyped-def]
    """A connection that takes every delivery."""

    def take(delivery: Delivery) -> bool:
        into.append(delivery)
        return True

    return take


class Lagging:
    """The real store's tickets, except that completion is decided by the test."""

    def __init__(self, store: DurableStore) -> None:
        self.store = store
        self.completed = 0
        self.failed = False

    @property
    def appended(self) -> int:
        return self.store.appended

    def fileno(self) -> int:
        return -1

    def drain(self) -> int:
        return self.completed

    def flush(self) -> None:
        self.completed = self.appended


def queue(name: str) -> tuple:  # type: ignore[type-arg]
    return parse_destinations(name, broker_id="b", connection_id=1, allow_wildcards=False)


def producer_and_consumer(door: EngineDoor) -> tuple[EngineBackend, list[Delivery]]:
    """A backend on ``door`` whose deliveries run on the server thread, with connection 1
    (a producer) and connection 2 (a consumer taking every delivery into the list)."""
    backend = EngineBackend(door)
    got: list[Delivery] = []
    backend.bind(lambda fn: fn(), lambda: None)
    door.op_login(1, "producer", None, 0.0)
    backend.attach(ConnectionInfo(1, "producer", "default", "1.2"), lambda d: True)
    door.op_login(2, "consumer", None, 0.0)
    backend.attach(ConnectionInfo(2, "consumer", "default", "1.2"), sink(got))
    return backend, got


def lagging_door(store: DurableStore) -> tuple[EngineDoor, Lagging, OutputGate]:
    """A door on an engine saving to ``store``, whose answers wait for a gate on the
    store's tickets with completion decided by the test (``Lagging``)."""
    door = EngineDoor(Engine(store=store))
    lagging = Lagging(store)
    gate = OutputGate(lagging, lambda outs: None)
    door.after_durable = gate.call
    return door, lagging, gate


def durable_pair(
    log: LogStore,
) -> tuple[DurableStore, EngineDoor, Lagging, EngineBackend, list[Delivery], Callable[[], None]]:
    """:func:`lagging_door` on a store of ``log`` with :func:`producer_and_consumer`, and
    ``serve_durably``: one turn of the server thread with every write made durable."""
    store = DurableStore(log)
    door, lagging, gate = lagging_door(store)
    backend, got = producer_and_consumer(door)

    def serve_durably() -> None:
        door.run_ops(0.0)
        lagging.completed = store.appended
        gate.release()

    return store, door, lagging, backend, got, serve_durably


def test_persistent_publish_returns_only_once_durable(tmp_path: Path) -> None:
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        door, lagging, gate = lagging_door(store)
        backend, got = producer_and_consumer(door)
        door.run_ops(0.0)

        returned = threading.Event()
        spec = PublishSpec(queue("/queue/q"), (("persistent", "true"),), b"kept")

        def publish() -> None:
            backend.publish(1, spec)
            returned.set()

        subscribing = threading.Thread(
            target=backend.subscribe, args=(2, SubscriptionSpec("s", queue("/queue/q")))
        )
        subscribing.start()

        def serve_durably() -> bool:  # the server thread, with every write made durable
            door.run_ops(0.0)
            lagging.completed = store.appended  # (the channel's definition)
            gate.release()
            return not subscribing.is_alive()

        assert wait_until(serve_durably)
        producer = threading.Thread(target=publish)
        producer.start()
        assert wait_until(lambda: door.pending_ops > 0)
        door.run_ops(0.0)  # the engine saved it: the write is not durable yet
        assert store.appended > lagging.completed
        assert not returned.wait(0.2) and got == []  # no RECEIPT, no delivery
        lagging.completed = store.appended
        gate.release()
        producer.join(10)
        assert returned.is_set() and [d.body for d in got] == [b"kept"]
        door.close()


def test_expired_messages_are_not_delivered() -> None:
    wall = [1_000.0]
    handler = PerMessageDeliveryHandler(lambda: wall[0])
    engine = Engine(handlers={PER_MESSAGE: handler})
    door = EngineDoor(engine)
    backend = EngineBackend(door)
    got: list[Delivery] = []
    posted: list[Callable[[], None]] = []  # the listener loop's queue, run by the test
    backend.bind(posted.append, lambda: None)
    door.op_login(1, "c", None, 0.0)
    backend.attach(ConnectionInfo(1, "c", "default", "1.2"), sink(got))
    ok = threading.Thread(
        target=lambda: [
            backend.publish(1, PublishSpec(queue("/queue/e"), (("expires", "1000500"),), b"old")),
            backend.publish(1, PublishSpec(queue("/queue/e"), (("expires", "1002000"),), b"new")),
            backend.publish(1, PublishSpec(queue("/queue/e"), (("expires", "x"),), b"bad")),
        ]
    )
    ok.start()
    assert wait_until(lambda: door.run_ops(0.0) == [] and not ok.is_alive())
    wall[0] = 1_001.0  # the first one's time has come, not the second's
    sub = threading.Thread(
        target=backend.subscribe, args=(1, SubscriptionSpec("s", queue("/queue/e")))
    )
    sub.start()
    assert wait_until(lambda: door.run_ops(0.0) == [] and not sub.is_alive())
    while posted:  # the loop runs what was posted once subscribe() has returned
        posted.pop(0)()
    assert [d.body for d in got] == [b"new", b"bad"]
    assert handler.rules.expired_count == 1
    door.close()


def test_an_ack_handed_over_as_the_server_stops_is_applied(
    tmp_path: Path, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    """Regression: the loop left at the stop signal with the STOMP door's operations
    unrun, so the ACKs a client sent just before SIGTERM (DISCONNECT already receipted)
    were dropped and a clean restart redelivered acknowledged messages (test_serve's
    kill -9 test, about 1 run in 10 under load).  Here the ACK is handed over on the
    server's own thread right before it is told to stop: both wait in the same wake."""
    store = DurableStore(LogStore(tmp_path))
    engine = Engine(store=store)
    door = EngineDoor(engine)
    server = Server(
        engine, ServerOptions(endpoint="tcp://127.0.0.1:*"), context=zctx, durable=store
    )
    assert server.gate is not None
    door.after_durable = server.gate.call
    backend, got = producer_and_consumer(door)
    rfd, wfd = os.pipe()

    def ack_then_stop(now: float) -> list[object]:  # the server thread
        os.read(rfd, 1)
        backend.ack(2, [got[0].tag])  # the listener's hand-over: queued for the door
        server.stop()  # (run() on this thread: no join) the stop is now pending too
        return []

    server.add_reader(door.fileno(), door.run_ops)  # the door first: its turn comes
    server.add_reader(rfd, ack_then_stop)  # before the ACK in the wake that hands it over
    loop = threading.Thread(target=server.run, name="served")
    loop.start()
    try:
        backend.publish(1, PublishSpec(queue("/queue/q"), (("persistent", "true"),), b"k"))
        spec = SubscriptionSpec("s", queue("/queue/q"), ack=AckMode.CLIENT_INDIVIDUAL)
        backend.subscribe(2, spec)
        assert wait_until(lambda: [d.body for d in got] == [b"k"])
        os.write(wfd, b"s")
        loop.join(WAIT)
        assert not loop.is_alive()
    finally:
        if loop.is_alive():
            server.stop(timeout=WAIT)
        door.close()
        store.close()
        os.close(rfd)
        os.close(wfd)
    reopened = DurableStore(LogStore(tmp_path))
    try:
        live = [m.message.payload for key in reopened.queues() for m in reopened.iterate(key)]
    finally:
        reopened.close()
    assert live == []  # acknowledged: gone from the store (it was b"k" before the fix)


def test_an_answer_after_an_ack_waits_until_its_removal_is_durable(tmp_path: Path) -> None:
    """Regression (a RECEIPT after ACKs, ``EngineBackend.after_applied``): an ACK's
    removal from the store is not waited for in general (a late one costs a redelivery),
    but a RECEIPT after it promises it: the answer waited for nothing, and a kill -9
    right after it redelivered the acknowledged message (test_serve's kill -9 test, 2 runs
    in 8).  Here the store completes writes only when the test says so."""
    with LogStore(tmp_path) as log:
        _, door, _, backend, got, serve_durably = durable_pair(log)
        answers: list[str | None] = []
        backend.publish_async(
            1, PublishSpec(queue("/queue/q"), (("persistent", "true"),), b"k"), answers.append
        )
        spec = SubscriptionSpec("s", queue("/queue/q"), ack=AckMode.CLIENT_INDIVIDUAL)
        subscribing = threading.Thread(target=backend.subscribe, args=(2, spec))
        subscribing.start()
        assert wait_until(lambda: serve_durably() or (not subscribing.is_alive() and got != []))
        assert answers == [None] and [d.body for d in got] == [b"k"]
        applied: list[str | None] = []
        backend.ack(2, [got[0].tag])
        backend.after_applied(2, applied.append)
        door.run_ops(0.0)  # the ACK ran: its removal is written, not durable yet
        assert applied == []  # the RECEIPT waits for it
        serve_durably()
        assert applied == [None]
        door.close()
    reopened = DurableStore(LogStore(tmp_path))
    try:
        assert [m for key in reopened.queues() for m in reopened.iterate(key)] == []
    finally:
        reopened.close()


def _subscribe_after_an_ack(tmp_path: Path, second: SubscriptionSpec) -> None:
    """Connection 2 takes a persistent message of ``/queue/q`` (client-individual), ACKs
    it, then subscribes ``second`` (whose RECEIPT the session writes once ``subscribe``
    returns): ``subscribe`` must wait until the ACK's removal is durable.  The store
    completes writes only when the test says so."""
    with LogStore(tmp_path) as log:
        store, door, lagging, backend, got, serve_durably = durable_pair(log)
        answers: list[str | None] = []
        for name in ("/queue/other", "/queue/q"):  # (both queues exist before the ACK)
            spec = PublishSpec(queue(name), (("persistent", "true"),), b"k")
            backend.publish_async(1, spec, answers.append)
        first = SubscriptionSpec("s", queue("/queue/q"), ack=AckMode.CLIENT_INDIVIDUAL)
        subscribing = threading.Thread(target=backend.subscribe, args=(2, first))
        subscribing.start()
        assert wait_until(lambda: serve_durably() or (not subscribing.is_alive() and got != []))
        assert answers == [None, None] and [d.body for d in got] == [b"k"]
        durable = lagging.completed  # everything so far
        backend.ack(2, [got[0].tag])
        returned = threading.Event()

        def subscribe_second() -> None:
            backend.subscribe(2, second)
            returned.set()

        subscribing = threading.Thread(target=subscribe_second)
        subscribing.start()
        # the server thread runs the ACK, then the SUBSCRIBE, the store completing nothing:
        # the SUBSCRIBE's answer asks for the removal (a write past ``durable``) or, wrong,
        # it is given at once and ``subscribe`` returns
        assert wait_until(
            lambda: door.run_ops(0.0) == [] and (store.appended > durable or returned.is_set())
        )
        assert not returned.is_set()  # the RECEIPT waits for the ACK's removal
        assert wait_until(lambda: serve_durably() or returned.is_set())
        subscribing.join(WAIT)
        door.close()
    reopened = DurableStore(LogStore(tmp_path))
    try:  # the acknowledged message is gone for good
        kept = [m for key in reopened.queues() for m in reopened.iterate(key)]
        assert [m for m in kept if m.message.target == "q"] == []
    finally:
        reopened.close()


def test_a_browser_subscribe_after_an_ack_answers_once_its_removal_is_durable(
    tmp_path: Path,
) -> None:
    """Regression (session 12's open edge): a browser SUBSCRIBE's RECEIPT is written when
    ``subscribe`` returns, i.e. once the engine ran it -- after the ACKs before it -- but
    its answer did not wait for their removals to be durable (only ``op_applied`` asked
    the store for that): a kill -9 right after the RECEIPT could bring an acknowledged
    message back."""
    _subscribe_after_an_ack(tmp_path, SubscriptionSpec("b", queue("/queue/q"), browser=True))


def test_a_plain_subscribe_after_an_ack_answers_once_its_removal_is_durable(
    tmp_path: Path,
) -> None:
    """The same for an ordinary SUBSCRIBE (of another existing queue)."""
    _subscribe_after_an_ack(tmp_path, SubscriptionSpec("o", queue("/queue/other")))
