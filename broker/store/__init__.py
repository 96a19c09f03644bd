"""Message stores behind one interface (memory now; a journal later)."""

from __future__ import annotations

from broker.store.base import NOT_SAVED, IndexEntry, QueueKey, Store, StoredMessage
from broker.store.memory import MemoryStore

__all__ = ["NOT_SAVED", "IndexEntry", "MemoryStore", "QueueKey", "Store", "StoredMessage"]
