"""The storage interface the engine writes saved queue messages through.

A store keeps, per queue (channel name, queue id), the messages a delivery decision chose
to save, keyed by the queue's monotonic sequence number.  The engine appends when a
message is saved and removes it when the message is finished (acknowledged, or sent on a
queue without acknowledges, or timed out/cleared).  On start the engine can replay
``iterate`` to rebuild queues.  Implementations must be cheap per call; a durable one
batches its fsyncs and makes ``flush`` the barrier.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from array import array
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from broker.message import Message

#: Why a message taken while the store failed (its disk full or failing) is answered
#: as not saved: every front door (TMQP acknowledges, STOMP ERRORs) says these words.
NOT_SAVED = "not saved: the store failed"

#: (channel name, queue id)
QueueKey = tuple[str, int]


class StoredMessage(NamedTuple):
    """One saved message: its per-queue sequence number, the message as produced, and
    what a restart must keep of its life in the queue: put-backs, deliveries so far, and
    its MessageTimeout deadline as wall-clock UNIX seconds (0: none), so that the clock
    keeps running while the broker is down.

    A named tuple, not a frozen dataclass: one is made per persistent message saved, and
    a frozen dataclass's ``__init__`` (one ``object.__setattr__`` per field) cost ~3x a
    tuple's (``bench/bench_persistent.py --calls``).  Change one with ``_replace``."""

    sequence: int
    message: Message
    producer_id: str = ""
    put_backs: int = 0
    #: times it was sent to a consumer that had to acknowledge it
    delivery_count: int = 0
    deadline: float = 0.0


class IndexEntry(NamedTuple):
    """A saved message's place in its queue, without its payload (``Store.index``): what
    a restart needs to queue it (order, priority, put-backs, delivery count, deadline);
    ``stored`` is the whole message when the store had to read it anyway, else None
    (``Store.read`` gives it when it is wanted)."""

    sequence: int
    high_priority: bool
    put_backs: int
    delivery_count: int
    deadline: float
    stored: StoredMessage | None


class Store(ABC):
    #: Is :meth:`read` worth calling instead of holding a message in memory (the store
    #: keeps its messages elsewhere than in this process's memory)?  A queue pages the
    #: payloads of its saved waiting messages out only to such a store.
    pages = False
    #: Does :meth:`append` keep the :class:`Message` objects it is given (True), or only
    #: what it encodes of them at once (False)?  The engine drops a message's wire form
    #: (its door's octets) only for a store that keeps it: a copy per saved message.
    keeps_messages = True

    @property
    def failed(self) -> bool:
        """Has the store stopped taking saves for good (its disk full or failing)?  A
        queue then answers no retry as a duplicate done (``Queue.duplicate``): the
        message it took first may never have been saved."""
        return False

    @abstractmethod
    def append(self, queue: QueueKey, message: StoredMessage) -> None:
        """Save a message (sequence numbers only grow within a queue)."""

    def append_many(self, queue: QueueKey, messages: Sequence[StoredMessage]) -> None:
        """:meth:`append` of each message, in order (one queue's batch of pushes); a store
        may save them with one write and one durability wait.  Callers that need to know
        which message a failure concerns append one by one."""
        for message in messages:
            self.append(queue, message)

    def append_each(
        self, queue: QueueKey, messages: Sequence[StoredMessage]
    ) -> list[tuple[int, Exception]]:
        """:meth:`append` of each message, in order, each on its own: one the store
        refuses does not stop the others (what a run of pushes saves, each answered for
        itself).  Returns (position, error) of each refused, which is not saved; a
        store that holds appends (:meth:`hold`) may take the others as one group."""
        refused: list[tuple[int, Exception]] = []
        for k, message in enumerate(messages):
            try:
                self.append(queue, message)
            except Exception as exc:
                refused.append((k, exc))
        return refused

    def hold(self) -> None:  # noqa: B027 - optional hook
        """Appends from now until :meth:`release` may be kept back and written together
        (one group, one durability wait).  Each still raises at once what its write
        would; any other call writes what is held first, so writes keep their order."""

    def release(self) -> None:  # noqa: B027 - optional hook
        """Write what :meth:`hold` kept back (before the caller's output leaves)."""

    @abstractmethod
    def remove(self, queue: QueueKey, sequence: int) -> None:
        """Forget a message; unknown sequence numbers are ignored."""

    @abstractmethod
    def iterate(self, queue: QueueKey) -> Iterator[StoredMessage]:
        """Saved messages of a queue in sequence order."""

    @abstractmethod
    def queues(self) -> list[QueueKey]:
        """Queues that have saved messages."""

    def update(  # noqa: B027
        self, queue: QueueKey, message: StoredMessage, *, durable: bool = False
    ) -> None:
        """A saved message's put-backs, delivery count or deadline changed (the message
        itself did not); a store that does not outlive the process may ignore it, and so
        may a store for an unknown sequence number.  ``durable``: what the engine answers
        next depends on it (a put-back), so it counts as a write replies wait for."""

    def retain(self, queue: QueueKey, message: StoredMessage) -> None:
        """A saved message was consumed on a queue that keeps consumed messages readable
        (option ``Retain``): keep it apart from the queue's live messages (``retained``)
        instead of forgetting it.  A store that does not outlive the process forgets it."""
        self.remove(queue, message.sequence)

    def retained(self, queue: QueueKey) -> Iterator[StoredMessage]:
        """The queue's retained messages (what ``retain`` kept), in sequence order."""
        return iter(())

    def forget_retained(self, queue: QueueKey, sequence: int) -> None:  # noqa: B027
        """A retained message was released or pushed out (unknown numbers are ignored)."""

    def removals_answered(self) -> None:  # noqa: B027 - optional hook
        """The next reply depends on the removals made so far (an explicit release is
        answered only once they are durable; an acknowledge's removal is not waited for:
        see ``broker.store.durable``, "Tickets")."""

    def trash(self, queue: QueueKey, message: StoredMessage, reason: str, at: float) -> None:  # noqa: B027
        """A saved message went to its queue's trash (``reason``, at wall-clock UNIX
        seconds ``at``): keep it there (the engine removes the live record after this).
        A store that does not outlive the process may ignore it."""

    def trashed(self, queue: QueueKey) -> Iterator[tuple[StoredMessage, str, float]]:
        """The queue's kept trash (message, reason, wall-clock time), in sequence order."""
        return iter(())

    def forget_trashed(self, queue: QueueKey, sequence: int) -> None:  # noqa: B027
        """A trashed message was resubmitted, purged or pushed out (unknown: ignored)."""

    def read(self, queue: QueueKey, sequence: int) -> StoredMessage:
        """One saved message, by its sequence number; LookupError when the store holds
        none under that number (a store may raise its own subclass, or its own error for
        a record it cannot read)."""
        for message in self.iterate(queue):
            if message.sequence == sequence:
                return message
        raise LookupError(f"{queue} holds no message {sequence}")

    def read_many(
        self, queue: QueueKey, sequences: list[int]
    ) -> dict[int, StoredMessage | Exception]:
        """:meth:`read` for each of ``sequences``: the message, or the error that one
        raised (the others still read)."""
        found: dict[int, StoredMessage | Exception] = {}
        for seq in sequences:
            try:
                found[seq] = self.read(queue, seq)
            except Exception as exc:
                found[seq] = exc
        return found

    def index(self, queue: QueueKey) -> Iterator[IndexEntry]:
        """:meth:`iterate` without payloads where the store can (see
        :class:`IndexEntry`); this default reads every message."""
        for m in self.iterate(queue):
            yield IndexEntry(
                m.sequence, m.message.high_priority, m.put_backs, m.delivery_count, m.deadline, m
            )

    def index_chunks(self, queue: QueueKey) -> Iterator[list[IndexEntry] | array]:
        """:meth:`index` a list at a time (a restart's bulk path).  A store may give an
        ``array`` of sequence numbers instead of a list: messages of regular priority,
        without deadline, not read (put-backs and delivery count come with ``read``)."""
        chunk: list[IndexEntry] = []
        for entry in self.index(queue):
            chunk.append(entry)
            if len(chunk) >= 1024:
                yield chunk
                chunk = []
        if chunk:
            yield chunk

    def last_sequence(self, queue: QueueKey) -> int:
        """The highest sequence number this store knows the queue has given, saved
        messages or not (0: none); a restart numbers the queue's messages above it."""
        return max((m.sequence for m in self.iterate(queue)), default=0)

    def drop_queue(self, queue: QueueKey) -> None:
        """Forget every message of a queue (queue removed or stopped)."""
        for message in list(self.iterate(queue)):
            self.remove(queue, message.sequence)

    def put_definition(self, name: str, value: bytes) -> None:  # noqa: B027 - optional hook
        """Keep a definition (a channel's or a queue's options) across restarts; a store
        that does not outlive the process may ignore it."""

    def delete_definition(self, name: str) -> None:  # noqa: B027 - optional hook
        """Forget a definition (unknown names are ignored)."""

    def definitions(self) -> dict[str, bytes]:
        """Every definition kept, by name (what a restart recreates)."""
        return {}

    def flush(self) -> None:  # noqa: B027 - optional hook
        """Make everything appended so far durable (no-op for memory)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""
