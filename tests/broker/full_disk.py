"""A store whose disk fills: the failing collaborator of the "not saved" tests (TMQP and
STOMP doors), a real store that raises as the log does on ENOSPC."""

from __future__ import annotations

from broker.store.base import QueueKey, StoredMessage
from broker.store.log.errors import StoreIOError
from broker.store.memory import MemoryStore


class FullDisk(MemoryStore):
    """A store with room for ``room`` messages: every later append raises."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room

    def append(self, queue: QueueKey, message: StoredMessage) -> None:
        if self.room <= 0:
            raise StoreIOError("No space left on device")
        self.room -= 1
        super().append(queue, message)
