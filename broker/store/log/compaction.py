"""Which segments to compact, and which of their records are still needed.

``SegmentTable`` keeps, per segment, its size and the octets of live data in it (PUT and
KV_PUT records the index points at).  A finished segment whose live share falls below
``compact_ratio``, or in which recovery found damage, is a victim: the store copies its
live records to the head, then writes RETIRE(victim), makes that durable, and deletes the
file.  Until RETIRE is durable the victim stays authoritative and the copies are
duplicates that replay harmlessly (same queue and sequence number, or the same name); once
it is durable, recovery deletes a victim it finds still on disk.

Tombstones (REMOVE, PURGE, KV_DEL) are not live data but must outlive every copy of what
they hide: ``tombstone_needed`` keeps one while any segment from its ``origin`` (the first
segment that held the hidden record) up to, not including, its own segment still exists.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field


@dataclass(slots=True)
class SegmentInfo:
    size: int = 0
    live: int = 0
    damaged: bool = False


@dataclass(slots=True)
class SegmentTable:
    compact_ratio: float
    segments: dict[int, SegmentInfo] = field(default_factory=dict)
    _ids: list[int] = field(default_factory=list)

    def add(self, segment: int, size: int = 0) -> SegmentInfo:
        info = self.segments.get(segment)
        if info is None:
            info = self.segments[segment] = SegmentInfo(size)
            bisect.insort(self._ids, segment)
        return info

    def drop(self, segment: int) -> None:
        if self.segments.pop(segment, None) is not None:
            self._ids.remove(segment)

    def ids(self) -> list[int]:
        return list(self._ids)

    def live(self, segment: int, delta: int) -> None:
        self.segments[segment].live += delta

    def exists_between(self, low: int, high: int, excluding: int = 0) -> bool:
        """A segment with ``low <= id < high`` other than ``excluding`` exists."""
        i = bisect.bisect_left(self._ids, low)
        while i < len(self._ids) and self._ids[i] < high:
            if self._ids[i] != excluding:
                return True
            i += 1
        return False

    def tombstone_needed(self, origin: int, own: int) -> bool:
        """A tombstone in segment ``own`` hiding records first written in ``origin``."""
        return self.exists_between(origin, own, excluding=own)

    def victim(self, head: int) -> int | None:
        """The oldest finished segment below ``compact_ratio`` (or damaged), or None.

        Oldest first, not emptiest first: tombstones count as dead octets, and a segment
        full of tombstones is needed while an older segment holds what they hide; taking
        the emptiest first would copy those tombstones again and again and never reach the
        older segment that keeps them needed.
        """
        for segment in self._ids:
            if segment == head:
                continue
            info = self.segments[segment]
            if info.damaged or info.live < info.size * self.compact_ratio:
                return segment
        return None
