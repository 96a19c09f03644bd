"""The engine's Store over the log: blob format, sequence mapping, recovery, definitions."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from broker.engine.delivery import PersistentDeliveryHandler
from broker.engine.engine import Engine
from broker.engine.options import ChannelQueueOptions
from broker.message import Message
from broker.protocol import ConnectionInfo
from broker.store import StoredMessage
from broker.store.durable import (
    BLOB_VERSION,
    DurableStore,
    decode_message,
    decode_record,
    encode_message,
)
from broker.store.log import CorruptRecord, LogStore

FULL = Message(
    message_id="id-é",
    source="producer-1",
    target="orders",
    content_type=7,
    high_priority=True,
    first_acquirer=True,
    wants_ack=True,
    ttl=31,
    headers=(("Key", "v:1"), ("Ünïcode", "välue"), ("Empty", "")),
    payload=b"\x00\x01payload\xff",
)


def test_round_trip_keeps_every_field() -> None:
    message, producer = decode_message(encode_message(FULL, "client-9"))
    assert message == FULL
    assert producer == "client-9"
    plain, producer = decode_message(encode_message(Message()))
    assert plain == Message() and producer == ""


def test_memoryview_payload_and_wire_form_are_not_kept() -> None:
    m = FULL._replace(payload=memoryview(b"abc"), wire=(object(), b"octets"))
    message, _ = decode_message(encode_message(m))
    assert message.payload == b"abc" and message.wire is None


def test_blob_layout_by_hand() -> None:
    """An independent vector: the octets worked out from the module docstring."""
    m = Message(message_id="a", target="q", content_type=258, ttl=5, payload=b"P")
    expected = (
        bytes([2, 0, 5]) + struct.pack("<H", 258) + struct.pack("<Q", 0x0102030405)
        + b"\x01\x00a" + b"\x00\x00" + b"\x01\x00q" + b"\x02\x00me"
        + b"\x00\x00" + b"P"
    )  # fmt: skip
    assert BLOB_VERSION == 2
    assert encode_message(m, "me", 0x0102030405) == expected
    assert decode_record(expected) == (m, "me", 0x0102030405)


def test_version_1_blobs_are_still_read() -> None:
    """Written before the engine's sequence number was kept: no u64 after the head."""
    old = bytes([1, 0, 5]) + struct.pack("<H", 258) + b"\x01\x00a" + b"\x00\x00" * 4 + b"P"
    m = Message(message_id="a", content_type=258, ttl=5, payload=b"P")
    assert decode_record(old) == (m, "", 0)


@pytest.mark.parametrize("cut", [0, 1, 4, 6, 9, 20])
def test_truncated_blob_is_corrupt(cut: int) -> None:
    blob = encode_message(FULL, "client-9")
    with pytest.raises(CorruptRecord):
        decode_message(blob[:cut])


def test_unknown_version_and_bad_text_are_corrupt() -> None:
    blob = encode_message(FULL)
    with pytest.raises(CorruptRecord, match="version"):
        decode_message(bytes([BLOB_VERSION + 1]) + blob[1:])
    bad = (
        bytes([BLOB_VERSION, 0, 0, 0, 0]) + bytes(8)
        + b"\x02\x00\xff\xfe" + b"\x00\x00" * 3 + b"\x00\x00"
    )  # fmt: skip
    with pytest.raises(CorruptRecord, match="UTF-8"):
        decode_message(bad)


def test_fields_that_do_not_fit_are_refused() -> None:
    with pytest.raises(ValueError):
        encode_message(Message(ttl=256))
    with pytest.raises(ValueError):
        encode_message(Message(message_id="x" * 70_000))
    for message, sequence in (
        (Message(ttl=-1), 0),
        (Message(content_type=-1), 0),
        (Message(content_type=0x1_0000), 0),
        (Message(), -1),
        (Message(), 2**64),
        (Message(headers=(("h", "v"),) * 0x1_0000), 0),
    ):
        with pytest.raises(ValueError):
            encode_message(message, "p", sequence, {})
    # the edges that fit
    edge = Message(message_id="x" * 0xFFFF, ttl=255, content_type=0xFFFF)
    decoded, producer, sequence = decode_record(encode_message(edge, "p", 2**64 - 1))
    assert (decoded, producer, sequence) == (edge, "p", 2**64 - 1)


def test_sequences_map_and_survive_reopen(tmp_path: Path) -> None:
    key = ("orders", 1)
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        for seq in (10, 11, 12):
            store.append(key, StoredMessage(seq, FULL._replace(message_id=str(seq)), "p", 1))
        assert store.appended > 0
        store.remove(key, 11)
        store.remove(key, 99)  # unknown: ignored
        assert log.wait(store.appended, 10)
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        assert store.queues() == [key]
        back = list(store.iterate(key))
        assert [m.message.message_id for m in back] == ["10", "12"]
        # the engine's numbers (before blob version 2 these came back as the log's: 1, 3)
        assert [m.sequence for m in back] == [10, 12]
        assert back[0].producer_id == "p" and back[0].put_backs == 1
        store.remove(key, back[0].sequence)  # recovered numbers are removable
    with LogStore(tmp_path) as log:
        assert [m.message.message_id for m in DurableStore(log).iterate(key)] == ["12"]


def test_last_sequence_survives_an_emptied_queue(tmp_path: Path) -> None:
    key, other = ("orders", 1), ("orders", 2)
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        for seq in (4, 5):
            store.append(key, StoredMessage(seq, Message(message_id=str(seq))))
        store.append(other, StoredMessage(9, Message()))
        store.remove(key, 4)
        store.remove(key, 5)  # the queue is empty now
        assert store.last_sequence(key) == 5
        log.flush()
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        assert list(store.iterate(key)) == []
        assert store.last_sequence(key) == 5
        assert store.last_sequence(other) == 9  # equal numbers: the log's own, not iterated
        assert [m.sequence for m in store.iterate(other)] == [9]
        assert store.last_sequence(other) == 9
        assert store.definitions() == {}  # the kept numbers are not engine definitions
        store.drop_queue(key)
        assert store.last_sequence(key) == 0


def test_undecodable_record_is_skipped_and_the_rest_kept(tmp_path: Path) -> None:
    key = ("orders", 1)
    with LogStore(tmp_path) as log:
        log.append(key, encode_message(Message(message_id="a")))
        log.append(key, b"\x09garbage")
        log.append(key, encode_message(Message(message_id="c")))
    with LogStore(tmp_path) as log:
        ids = [m.message.message_id for m in DurableStore(log).iterate(key)]
    assert ids == ["a", "c"]


def test_engine_recovers_definitions_and_messages_in_order(tmp_path: Path) -> None:
    handlers = {"persistent": PersistentDeliveryHandler()}
    options = ChannelQueueOptions(message_delivery_handler="persistent", request_acknowledge=True)
    with LogStore(tmp_path) as log:
        engine = Engine(store=DurableStore(log), handlers=handlers)
        engine.create_channel("orders")
        engine.create_queue("orders", 3, options)
        producer, _ = engine.connect(ConnectionInfo(client_id="producer"), now=0.0)
        for i in range(5):
            m = Message(target="orders", content_type=3, message_id=f"m{i}", payload=b"x")
            engine.publish(producer, m, now=0.0)
        engine.create_channel("empty")
    with LogStore(tmp_path) as log:
        engine = Engine(store=DurableStore(log), handlers=handlers)
        assert engine.recover(1.0) == 5
        queue = engine.channels["orders"].queues[3]
        assert queue.options == options
        assert "empty" in engine.channels
        assert queue.message_count == 5
        consumer, _ = engine.connect(ConnectionInfo(client_id="consumer"), now=1.0)
        out = engine.subscribe(consumer, "orders", now=1.0)
        ids = [o.frame.message_id for o in out if isinstance(o.frame, Message)]
        assert ids == [f"m{i}" for i in range(5)]


def test_a_save_the_store_refuses_is_negatively_acknowledged(tmp_path: Path) -> None:
    log = LogStore(tmp_path)
    engine = Engine(store=DurableStore(log), handlers={"persistent": PersistentDeliveryHandler()})
    engine.create_channel("orders")
    engine.create_queue("orders", 1, ChannelQueueOptions(message_delivery_handler="persistent"))
    producer, _ = engine.connect(ConnectionInfo(client_id="p"), now=0.0)
    log.close()  # the store refuses every write from now on
    m = Message(target="orders", content_type=1, message_id="m1", wants_ack=True)
    out = engine.publish(producer, m, now=0.0)
    acks = [o.frame for o in out if o.client_id == producer]
    assert len(acks) == 1 and ("Nack-Reason", "failed") in acks[0].headers
    assert engine.errors == 1
