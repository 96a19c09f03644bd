"""The STOMP door's wildcard subscriptions, as the engine thread keeps them, and what a new
channel matches.

A channel created (by any door) is matched against each distinct wildcard once, and only
against the wildcards of its kind and virtual host (``broker.engine.patterns.PatternIndex``):
a thousand connections with many wildcard subscriptions each no longer cost every channel
created a pass over all of them.  Never another connection's temporary destination.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from broker.engine.patterns import PatternIndex
from broker.stomp.destinations import Destination, DestinationKind, temp_owner
from broker.stomp.engine_flow import SubExtras
from broker.stomp.engine_mapping import destination_of, wildcard_matches

#: (connection, subscription id)
Key = tuple[int, str]


@dataclass(slots=True)
class Wild:
    """A wildcard subscription: its wildcard destinations (a composite may name several)."""

    conn: int
    patterns: tuple[Destination, ...]
    prefetch: int | None
    exclusive: bool
    channels: set[str] = field(default_factory=set)  # the channels it joined
    extras: SubExtras | None = None

    def matches(self, channel: str) -> bool:
        return any(wildcard_matches(d, channel, self.conn) for d in self.patterns)


class Wildcards:
    """Wildcard subscriptions by (connection, subscription id), indexed by destination
    kind and namespace."""

    def __init__(self) -> None:
        self._wild: dict[Key, Wild] = {}
        self._index: dict[tuple[DestinationKind, str], PatternIndex[Key]] = {}

    def __bool__(self) -> bool:
        return bool(self._wild)

    def __len__(self) -> int:
        return len(self._wild)

    def new_patterns(self, wild: Wild) -> int:
        """How many of ``wild``'s patterns no subscription holds yet."""
        texts = set()
        for d in wild.patterns:
            index = self._index.get((d.kind, d.namespace))
            if d.pattern is not None and (index is None or d.pattern.text not in index):
                texts.add((d.kind, d.namespace, d.pattern.text))
        return len(texts)

    def distinct(self) -> int:
        """Distinct patterns held (per kind and namespace)."""
        return sum(len(index) for index in self._index.values())

    def add(self, key: Key, wild: Wild) -> None:
        """Keep ``wild`` (one already under ``key`` is replaced)."""
        self.pop(key)
        self._wild[key] = wild
        for d in wild.patterns:
            if d.pattern is not None:
                self._index.setdefault((d.kind, d.namespace), PatternIndex()).add(key, d.pattern)

    def pop(self, key: Key) -> Wild | None:
        wild = self._wild.pop(key, None)
        if wild is not None:
            for d in wild.patterns:
                index = self._index.get((d.kind, d.namespace))
                if index is not None and d.pattern is not None:
                    index.discard(key, d.pattern)
                    if not len(index):
                        del self._index[(d.kind, d.namespace)]
        return wild

    def drop_connection(self, conn: int) -> None:
        for key in [k for k in self._wild if k[0] == conn]:
            self.pop(key)

    def matching(self, channel: str) -> Iterator[Wild]:
        """The wildcard subscriptions that match engine channel ``channel``, in the order
        they were made."""
        destination = destination_of(channel)
        index = self._index.get((destination.kind, destination.namespace))
        if index is None:
            return
        matched = index.matched(destination.name)
        if not matched:
            return
        owner = temp_owner(destination.name)
        for key in index.holders(matched):
            wild = self._wild.get(key)
            if wild is None or (owner is not None and owner[1] != wild.conn):
                continue
            yield wild
