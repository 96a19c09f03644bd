"""Issue 10's trash "emptied by a retention policy": the time bound, ``TrashRetention``.

The count bound (``TrashLimit``) has its test in ``test_trash.py``; the time bound had
none.  Engine-level, the clock and the wall clock under the test's control: an entry is
listed until ``TrashRetention`` ms after it came, then gone; on a persistent queue the
age counts in wall-clock time across a restart, and an entry past its time is forgotten
by the store too (a later restart does not bring it back).
"""

from __future__ import annotations

from pathlib import Path

from broker.engine.delivery import PersistentDeliveryHandler
from broker.engine.options import BrokerConfig
from broker.protocol import Header, MessageType, Operation
from broker.sequence import decode_browse
from broker.store.durable import DurableStore
from broker.store.log import LogStore

from .engine_kit import Kit

TIMEOUT_MS = 1_000  # MessageTimeout: a message waits this long, then goes to the trash
RETENTION_MS = 10_000  # TrashRetention
KEY = ("jobs", 1)


class Wall:
    """A wall clock the test moves (what ``BrokerConfig.wall_clock`` reads)."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def _kit(wall: Wall, store: DurableStore | None = None) -> Kit:
    handlers = {"persistent": PersistentDeliveryHandler()}
    if store is None:
        return Kit(handlers=handlers, config=BrokerConfig(wall_clock=wall))
    return Kit(store=store, handlers=handlers, config=BrokerConfig(wall_clock=wall))


def _jobs(kit: Kit, persistent: bool) -> str:
    producer = kit.connect("producer")
    handler = {"message_delivery_handler": "persistent"} if persistent else {}
    kit.queue(producer, "jobs", 1, message_timeout=TIMEOUT_MS, trash_retention=RETENTION_MS,
              **handler)  # fmt: skip
    return producer


def _push(kit: Kit, producer: str, *names: str) -> None:
    for name in names:
        kit.push(producer, "jobs", 1, name.encode(), ack=True, mid=name)
    acks = [f for f in kit.take(producer) if f.message_type == MessageType.ACK]
    assert len(acks) == len(names) and not any(f.headers for f in acks)


def _trash(kit: Kit) -> list[bytes]:
    """The payloads the trash lists (op 210), in sequence order."""
    admin = kit.connect("admin")
    reply = kit.op(admin, Operation.TRASH_LIST, "jobs", headers=((Header.QUEUE_ID, "1"),),
                   response=True)  # fmt: skip
    assert reply.content_type == 0, reply.headers
    kit.disconnect(admin)
    return [bytes(b.message.payload) for b in decode_browse(reply.payload)]


def test_an_entry_is_listed_until_its_retention_time_then_gone() -> None:
    kit = _kit(Wall())
    producer = _jobs(kit, persistent=False)
    _push(kit, producer, "a", "b")
    kit.advance(2.0)  # t=102: a, b expire into the trash
    _push(kit, producer, "c")
    kit.advance(2.0)  # t=104: c too
    assert _trash(kit) == [b"a", b"b", b"c"]
    kit.advance(9.0)  # t=113: a and b are 11 s in the trash, c 9 s
    assert _trash(kit) == [b"c"]
    kit.advance(2.0)  # t=115: c 11 s
    assert _trash(kit) == []


def test_a_persistent_trash_ages_in_wall_clock_time_across_restarts(tmp_path: Path) -> None:
    wall = Wall()
    with LogStore(tmp_path) as log:
        kit = _kit(wall, DurableStore(log))
        producer = _jobs(kit, persistent=True)
        _push(kit, producer, "a", "b")
        kit.advance(2.0)  # expired: saved in the store's trash, at the wall clock's time
        assert _trash(kit) == [b"a", b"b"]
    wall.now += 5.0  # down for 5 s: 5 s of its 10 s retention gone
    with LogStore(tmp_path) as log:
        kit = _kit(wall, DurableStore(log))
        kit.engine.recover(kit.now)
        assert _trash(kit) == [b"a", b"b"]
        kit.advance(4.0)  # 9 s in all
        assert _trash(kit) == [b"a", b"b"]
    wall.now += 6.0  # 11 s since they came (the engine's own clock starts again)
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        kit = _kit(wall, store)
        kit.engine.recover(kit.now)
        assert _trash(kit) == []
        assert list(store.trashed(KEY)) == []  # forgotten in the store as well
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        assert list(store.trashed(KEY)) == []
        kit = _kit(wall, store)
        kit.engine.recover(kit.now)
        assert _trash(kit) == []
