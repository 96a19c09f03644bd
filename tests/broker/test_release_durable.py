"""An explicit release is answered only once its removals are durable.

An acknowledge's removal is not waited for (forgetting it late after a crash costs a
redelivery: ``broker.store.durable``, "Tickets"); a release's answer, though, tells the
queue's new first number, which a restart must not take back.  Was: the answer left at
once; after a ``kill -9`` the bounds read (1, 7) again where the answer had said (8, 7)
(``test_sequence_restart``, once in 4 runs at load 50)."""

from __future__ import annotations

from pathlib import Path

from broker.engine.delivery import PersistentDeliveryHandler
from broker.engine.options import BrokerConfig
from broker.protocol import Header, Operation, QueueStatus
from broker.store.durable import DurableStore
from broker.store.log import LogStore
from tests.broker.engine_kit import Kit, queue_messages


def _kit(log: LogStore) -> tuple[Kit, DurableStore, str]:
    store = DurableStore(log)
    kit = Kit(
        auto_transmit=True,
        store=store,
        handlers={"persistent": PersistentDeliveryHandler()},
        config=BrokerConfig(wall_clock=lambda: 1_700_000_000.0),
    )
    producer = kit.connect("producer")
    kit.queue(producer, "ch", 1, status=QueueStatus.PULL,
              message_delivery_handler="persistent", request_acknowledge=True,
              allow_release=True)  # fmt: skip
    for i in range(7):
        kit.push(producer, "ch", 1, b"e%d" % i)
    return kit, store, producer


def test_a_release_answer_waits_for_its_removals(tmp_path: Path) -> None:
    with LogStore(tmp_path) as log:
        kit, store, producer = _kit(log)
        saved = store.appended
        kit.ok(producer, Operation.QUEUE_RELEASE, "ch",
               headers=((Header.QUEUE_ID, "1"), (Header.THROUGH_SEQ, "7")))  # fmt: skip
        # the gate holds the answer until this ticket completes (broker.server.gate)
        assert store.appended > saved
        assert kit.engine.channels["ch"].queues[1].messages.count == 0


def test_an_acknowledge_does_not_wait_for_its_removal(tmp_path: Path) -> None:
    with LogStore(tmp_path) as log:
        kit, store, _producer = _kit(log)
        consumer = kit.connect("consumer")
        kit.join(consumer, "ch")
        delivery = queue_messages(kit.pull(consumer, "ch", 1))[0]
        assert delivery.pending_ack
        saved = store.appended
        kit.ack(consumer, delivery)
        assert store.appended == saved  # a removal alone: no wait (at least once)
