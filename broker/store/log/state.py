"""What a store knows in memory: queue indexes, definitions, segment accounting.

Recovery builds a ``StoreState`` by replaying the log; the store then keeps it current
under its lock.  Applying a record here is the same whether it was just written or is
being replayed, so the two cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.store.log.compaction import SegmentTable
from broker.store.log.index import Location, QueueIndex
from broker.store.log.records import Meta, QueueKey


@dataclass(slots=True)
class KvEntry:
    value: bytes
    location: Location


@dataclass(slots=True)
class StoreState:
    table: SegmentTable
    queues: dict[QueueKey, QueueIndex] = field(default_factory=dict)
    kv: dict[str, KvEntry] = field(default_factory=dict)
    #: names deleted, with the origin their tombstone carries (kept while it is needed)
    kv_deleted: dict[str, int] = field(default_factory=dict)
    #: segments a durable RETIRE names (deleted, or to delete)
    retired: set[int] = field(default_factory=set)

    def queue(self, key: QueueKey) -> QueueIndex:
        index = self.queues.get(key)
        if index is None:
            index = self.queues[key] = QueueIndex()
        return index

    def apply_put(self, key: QueueKey, seq: int, location: Location, meta: Meta) -> None:
        old = self.queue(key).put(seq, location, meta)
        if old is not None:
            self._unlive(old)
        self.table.live(location.segment, location.size)

    def apply_remove(self, key: QueueKey, seq: int) -> Location | None:
        index = self.queues.get(key)
        old = None if index is None else index.remove(seq)
        if old is not None:
            self._unlive(old)
        return old

    def apply_remove_raw(self, key: QueueKey, seq: int) -> int | None:
        """:meth:`apply_remove` without a Location: the removed record's origin, or None
        if it was not live."""
        index = self.queues.get(key)
        old = None if index is None else index.remove_raw(seq)
        if old is None:
            return None
        segment, size, origin = old
        info = self.table.segments.get(segment)
        if info is not None:
            info.live -= size
        return origin

    def apply_mark(self, key: QueueKey, next_seq: int) -> None:
        index = self.queue(key)
        index.next_seq = max(index.next_seq, next_seq)

    def apply_purge(self, key: QueueKey, below: int) -> None:
        index = self.queue(key)
        for seq, _ in index.live_below(below):
            self.apply_remove(key, seq)
        index.next_seq = max(index.next_seq, below)

    def apply_kv_put(self, name: str, value: bytes, location: Location) -> None:
        old = self.kv.get(name)
        if old is not None:
            self._unlive(old.location)
        self.kv[name] = KvEntry(value, location)
        self.kv_deleted.pop(name, None)
        self.table.live(location.segment, location.size)

    def apply_kv_del(self, name: str, origin: int) -> None:
        old = self.kv.pop(name, None)
        if old is not None:
            self._unlive(old.location)
        known = self.kv_deleted.get(name)
        self.kv_deleted[name] = origin if known is None else min(known, origin)

    def _unlive(self, location: Location) -> None:
        if location.segment in self.table.segments:
            self.table.live(location.segment, -location.size)
