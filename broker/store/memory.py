"""In-memory store: saved messages live as long as the process."""

from __future__ import annotations

from collections.abc import Iterator

from broker.store.base import QueueKey, Store, StoredMessage


class MemoryStore(Store):
    def __init__(self) -> None:
        self._queues: dict[QueueKey, dict[int, StoredMessage]] = {}

    def append(self, queue: QueueKey, message: StoredMessage) -> None:
        self._queues.setdefault(queue, {})[message.sequence] = message

    def remove(self, queue: QueueKey, sequence: int) -> None:
        messages = self._queues.get(queue)
        if messages is not None:
            messages.pop(sequence, None)
            if not messages:
                del self._queues[queue]

    def iterate(self, queue: QueueKey) -> Iterator[StoredMessage]:
        messages = self._queues.get(queue, {})
        return iter(sorted(messages.values(), key=lambda m: m.sequence))

    def queues(self) -> list[QueueKey]:
        return sorted(self._queues)

    def drop_queue(self, queue: QueueKey) -> None:
        self._queues.pop(queue, None)

    def __len__(self) -> int:
        return sum(len(m) for m in self._queues.values())
