"""A push its delivery handler wants saved, that the store refuses (full or failing
disk), is never answered as taken: a producer that waits for an acknowledge gets a
negative one (``Ledger``), one that waits for a response gets FAILED (``Engine._push``)
instead of the silence that means success; the message stays queued in memory."""

from __future__ import annotations

from broker.engine.delivery import PersistentDeliveryHandler
from broker.protocol import Header as H
from broker.protocol import MessageType, ResultCode, header
from broker.tmqp import Frame
from tests.broker.engine_kit import Kit
from tests.broker.full_disk import FullDisk


def _push(kit: Kit, mid: str, *, response: bool = False, ack: bool = False) -> list[Frame]:
    kit.send(
        "p",
        Frame(
            message_type=MessageType.QUEUE,
            content_type=1,
            target="orders",
            message_id=mid,
            source="p",
            payload=mid.encode(),
            pending_response=response,
            pending_ack=ack,
        ),
    )
    return [f for f in kit.take("p") if f.message_id == mid]


def _kit() -> Kit:
    kit = Kit(store=FullDisk(room=1), handlers={"persistent": PersistentDeliveryHandler()})
    kit.connect("p")
    kit.queue("p", "orders", 1, message_delivery_handler="persistent")
    kit.take("p")
    return kit


def test_a_producer_waiting_for_a_response_hears_the_store_refused_its_message() -> None:
    kit = _kit()
    assert _push(kit, "m1", response=True) == []  # saved: no refusal
    refused = _push(kit, "m2", response=True)
    assert [(f.message_type, f.content_type) for f in refused] == [
        (MessageType.RESPONSE, ResultCode.FAILED)
    ]
    assert "not saved" in str(header(refused[0], H.REASON))
    assert kit.info("p", "orders", 1)["Messages"] == 2  # m2 stays queued (in memory)


def test_a_producer_waiting_for_an_acknowledge_gets_one_negative_not_two() -> None:
    kit = _kit()
    assert [f.message_type for f in _push(kit, "m1", ack=True)] == [MessageType.ACK]
    refused = _push(kit, "m2", ack=True)
    assert [f.message_type for f in refused] == [MessageType.ACK]
    assert header(refused[0], H.NACK_REASON) is not None


def test_a_retry_of_a_push_the_store_refused_is_no_duplicate_answered_as_done() -> None:
    """A producer told "not saved" retries with the same id: the retry must not be taken
    for a duplicate of the refused push (a positive acknowledge for a message never
    saved); a retry of one that was saved still is (``UseMessageId``, on by default)."""
    kit = _kit()
    assert header(_push(kit, "m1", ack=True)[0], H.NACK_REASON) is None  # saved
    first = _push(kit, "m2", ack=True)
    assert [header(f, H.NACK_REASON) is not None for f in first] == [True]
    retry = _push(kit, "m2", ack=True)
    assert [f.message_type for f in retry] == [MessageType.ACK]
    assert header(retry[0], H.NACK_REASON) is not None, "a refused push's retry acked as done"
    again = _push(kit, "m1", ack=True)  # the saved one: a duplicate, answered as done
    assert [header(f, H.NACK_REASON) for f in again] == [None]
    assert kit.info("p", "orders", 1)["Messages"] == 3  # m1 once; m2 and its retry in memory


class _FailedLater(FullDisk):
    """A store whose writer fails after it took a save (a held group's write hitting a
    full disk): ``failed`` from then on, every later save refused."""

    broken = False

    @property
    def failed(self) -> bool:
        return self.broken


def test_once_the_store_failed_a_retry_is_no_duplicate_answered_as_done() -> None:
    """A save the store took and then lost with its writer (the gate turns its held
    acknowledge negative): the retry must not be answered as a duplicate done; it is taken
    again and refused aloud by the failed store."""
    store = _FailedLater(room=5)
    kit = Kit(store=store, handlers={"persistent": PersistentDeliveryHandler()})
    kit.connect("p")
    kit.queue("p", "orders", 1, message_delivery_handler="persistent")
    kit.take("p")
    assert header(_push(kit, "m1", ack=True)[0], H.NACK_REASON) is None
    store.broken, store.room = True, 0  # the writer failed after taking m1
    retry = _push(kit, "m1", ack=True)
    assert [f.message_type for f in retry] == [MessageType.ACK]
    assert header(retry[0], H.NACK_REASON) is not None, "a retry acked as done by a failed store"
