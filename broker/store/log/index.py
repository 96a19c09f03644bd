"""The in-memory index of one queue: where each live record is, and its metadata.

Sequence numbers of a queue are gap-free, so the index is a set of parallel ``array``
columns addressed by ``seq - base`` (no object per message): segment id (0 = no live
record), offset, size, origin segment, delivery count, put-backs, flags, deadline —
33 octets a slot.  Slots of removed records stay until every slot before them is gone
too, then the dead prefix is cut off; so a queue costs 33 octets for every sequence
number from its oldest live record to its newest, live or not.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from broker.store.log.records import Meta

_TRIM_AT = 4096  # dead slots at the front before the columns are cut


#: One slot's values in column order (``QueueIndex.put_rows``): segment, offset, size,
#: origin, delivery count, put-backs, flags, deadline.
Row = tuple[int, int, int, int, int, int, int, float]


@dataclass(frozen=True, slots=True)
class Location:
    segment: int
    offset: int
    size: int
    origin: int


class QueueIndex:
    """Live records of one queue, by sequence number (the first one is 1)."""

    __slots__ = (
        "_base",
        "_count",
        "_deadline",
        "_flags",
        "_head",
        "_live",
        "_offset",
        "_origin",
        "_put_backs",
        "_segment",
        "_size",
        "next_seq",
    )

    def __init__(self) -> None:
        self.next_seq = 1
        self._base = 1  # sequence number of slot 0
        self._head = 0  # slots before it are all dead
        self._live = 0
        self._segment = array("I")
        self._offset = array("I")
        self._size = array("I")
        self._origin = array("I")
        self._count = array("I")
        self._put_backs = array("I")
        self._flags = array("B")
        self._deadline = array("d")

    def __len__(self) -> int:
        return self._live

    @property
    def first_seq(self) -> int:
        """The oldest live sequence number; ``next_seq`` when the queue is empty."""
        for i in range(self._head, len(self._segment)):
            if self._segment[i]:
                self._head = i
                return self._base + i
        return self.next_seq

    def _columns(self) -> tuple[array, ...]:
        return (
            self._segment,
            self._offset,
            self._size,
            self._origin,
            self._count,
            self._put_backs,
            self._flags,
            self._deadline,
        )

    def _slot(self, seq: int) -> int:
        """The slot of ``seq``, growing the columns at either end to cover it."""
        if seq < self._base:
            grow = self._base - seq
            for column in self._columns():
                column[0:0] = array(column.typecode, bytes(grow * column.itemsize))
            self._base = seq
            self._head = 0
        i = seq - self._base
        if i >= len(self._segment):
            grow = i + 1 - len(self._segment)
            for column in self._columns():
                column.extend(array(column.typecode, bytes(grow * column.itemsize)))
        return i

    def put(self, seq: int, location: Location, meta: Meta) -> Location | None:
        """Record ``seq`` at ``location``; the location it replaces (a copy), if any."""
        old = self.put_raw(
            seq,
            location.segment,
            location.offset,
            location.size,
            location.origin,
            meta.delivery_count,
            meta.put_backs,
            int(meta.priority),
            meta.deadline,
        )
        return None if old is None else Location(*old)

    def put_raw(
        self,
        seq: int,
        segment: int,
        offset: int,
        size: int,
        origin: int,
        count: int,
        put_backs: int,
        flags: int,
        deadline: float,
    ) -> tuple[int, int, int, int] | None:
        """``put`` without objects (the recovery scan's hot path); the old
        (segment, offset, size, origin) if ``seq`` was live."""
        if seq == self._base + len(self._segment):
            if not self._live:
                self._base = seq
                self._head = 0
                if self._segment:
                    for column in self._columns():
                        del column[:]
            self._segment.append(segment)
            self._offset.append(offset)
            self._size.append(size)
            self._origin.append(origin)
            self._count.append(count)
            self._put_backs.append(put_backs)
            self._flags.append(flags)
            self._deadline.append(deadline)
            self._live += 1
            if seq >= self.next_seq:
                self.next_seq = seq + 1
            return None
        if not self._live and seq >= self.next_seq:
            self._base = seq
            self._head = 0
            for column in self._columns():
                del column[:]
        i = self._slot(seq)
        old = None
        if self._segment[i]:
            old = (self._segment[i], self._offset[i], self._size[i], self._origin[i])
            origin = min(origin, old[3])
        else:
            self._live += 1
            if i < self._head:
                # a compaction copy replayed after the slots before it were found dead:
                # the first live slot moves back to it (``_head`` bounds every listing)
                self._head = i
        self._segment[i] = segment
        self._offset[i] = offset
        self._size[i] = size
        self._origin[i] = origin
        self._count[i] = count
        self._put_backs[i] = put_backs
        self._flags[i] = flags
        self._deadline[i] = deadline
        self.next_seq = max(self.next_seq, seq + 1)
        return old

    def put_rows(self, first: int, rows: list[Row]) -> None:
        """:meth:`put_raw` of each row (segment, offset, size, origin, count, put-backs,
        flags, deadline) for the numbers ``first``, ``first + 1``, ...: new records of a
        group (``LogStore.append_many``).  Added after the last slot, the columns grow
        once for them all; anywhere else, one row at a time."""
        if first != self._base + len(self._segment) or not rows:
            for seq, row in enumerate(rows, first):
                self.put_raw(seq, *row)
            return
        self.put_columns(first, len(rows), zip(*rows, strict=True))

    def takes_columns(self, first: int) -> bool:
        """Slots from ``first`` on can be given by :meth:`put_columns`: ``first`` is
        right after the last slot, or the index is empty and ``first`` is new (where
        ``put_raw`` would begin the columns again)."""
        return first == self._base + len(self._segment) or (
            not self._live and first >= self.next_seq
        )

    def put_columns(self, first: int, count: int, columns: Iterable[Iterable[Any]]) -> None:
        """``count`` new slots for ``first`` on (:meth:`takes_columns`), given as their
        eight columns in order (``Row``): what ``put_raw`` of each does, with one
        ``extend`` per column."""
        assert self.takes_columns(first), "put_columns where put_raw would search a slot"
        if not self._live:  # (as ``put_raw``: the columns begin again at ``first``)
            self._base = first
            self._head = 0
            if self._segment:
                for column in self._columns():
                    del column[:]
        for column, values in zip(self._columns(), columns, strict=True):
            column.extend(values)
        self._live += count
        if first + count > self.next_seq:
            self.next_seq = first + count

    def _location(self, i: int) -> Location | None:
        segment = self._segment[i]
        if not segment:
            return None
        return Location(segment, self._offset[i], self._size[i], self._origin[i])

    def _index(self, seq: int) -> int | None:
        i = seq - self._base
        if 0 <= i < len(self._segment) and self._segment[i]:
            return i
        return None

    def locate(self, seq: int) -> Location | None:
        i = self._index(seq)
        return None if i is None else self._location(i)

    def relocate(self, seq: int, segment: int, offset: int, size: int) -> None:
        i = self._index(seq)
        assert i is not None, "relocating a record that is not live"
        self._segment[i] = segment
        self._offset[i] = offset
        self._size[i] = size

    def meta(self, seq: int) -> Meta | None:
        i = self._index(seq)
        if i is None:
            return None
        return Meta(self._count[i], self._put_backs[i], bool(self._flags[i]), self._deadline[i])

    def set_meta(self, seq: int, meta: Meta) -> bool:
        i = self._index(seq)
        if i is None:
            return False
        self._set_meta(i, meta)
        return True

    def _set_meta(self, i: int, meta: Meta) -> None:
        self._count[i] = meta.delivery_count
        self._put_backs[i] = meta.put_backs
        self._flags[i] = int(meta.priority)
        self._deadline[i] = meta.deadline

    def remove(self, seq: int) -> Location | None:
        """Forget ``seq``; its location, or None if it was not live."""
        i = self._index(seq)
        if i is None:
            return None
        old = self._location(i)
        self._drop(i)
        return old

    def remove_raw(self, seq: int) -> tuple[int, int, int] | None:
        """:meth:`remove` without a Location (an acknowledge's hot path): the record's
        (segment, size, origin), or None if it was not live."""
        i = seq - self._base
        segment = self._segment
        if i < 0 or i >= len(segment) or not segment[i]:
            return None
        old = (segment[i], self._size[i], self._origin[i])
        self._drop(i)
        return old

    def _drop(self, i: int) -> None:
        self._segment[i] = 0
        self._live -= 1
        if self._live == 0:
            self._base = self.next_seq
            self._head = 0
            for column in self._columns():
                del column[:]
        elif i == self._head:
            self.first_seq  # noqa: B018 - moves _head to the next live slot
            if self._head >= _TRIM_AT and self._head * 2 >= len(self._segment):
                for column in self._columns():
                    del column[: self._head]
                self._base += self._head
                self._head = 0

    def sequences(self, start: int = 0) -> Iterator[int]:
        """Live sequence numbers from ``start`` on, in order (a snapshot is not taken:
        the caller holds the store's lock between steps or accepts a moving view)."""
        i = max(start - self._base, self._head, 0)
        segment = self._segment
        while i < len(segment):
            if segment[i]:
                yield self._base + i
            i += 1

    def live_slots(
        self, start: int, limit: int
    ) -> list[tuple[int, int, int, int, int, int, int, float]]:
        """Up to ``limit`` live records from ``start`` on, in order, as plain tuples
        (seq, segment, offset, size, delivery count, put-backs, priority flag, deadline):
        a restart's bulk read, without a Location and a Meta per record."""
        i = max(start - self._base, self._head, 0)
        segment, offset, size = self._segment, self._offset, self._size
        count, put_backs = self._count, self._put_backs
        flags, deadline = self._flags, self._deadline
        base, end = self._base, len(segment)
        found: list[tuple[int, int, int, int, int, int, int, float]] = []
        while i < end and len(found) < limit:
            if segment[i]:
                found.append(
                    (base + i, segment[i], offset[i], size[i], count[i], put_backs[i],
                     flags[i], deadline[i])
                )  # fmt: skip
            i += 1
        return found

    def columns(self, start: int, limit: int) -> tuple[int, array, array, array] | None:
        """Up to ``limit`` slots from ``start`` on, dead ones too, as copies of their
        columns: (the first slot's sequence number, segment (0: dead), flags, deadline);
        None past the end.  What a restart that pages needs, without a tuple per record."""
        i = max(start - self._base, self._head, 0)
        end = len(self._segment)
        if i >= end:
            return None
        j = min(i + limit, end)
        return self._base + i, self._segment[i:j], self._flags[i:j], self._deadline[i:j]

    def live_below(self, below: int) -> list[tuple[int, Location]]:
        """(seq, location) of every live record with a sequence number below ``below``."""
        found = []
        for seq in self.sequences():
            if seq >= below:
                break
            location = self.locate(seq)
            assert location is not None
            found.append((seq, location))
        return found

    def min_origin(self) -> int:
        """Smallest origin of the live records (0 when empty)."""
        live = range(self._head, len(self._segment))
        return min((self._origin[i] for i in live if self._segment[i]), default=0)

    def memory(self) -> int:
        """Octets the columns allocate."""
        return sum(c.buffer_info()[1] * c.itemsize for c in self._columns())
