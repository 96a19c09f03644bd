"""A channel queue: one class that has its parts.

:class:`Queue` holds a queue's identity, options, counters and flow-control windows, and
owns one object per concern, each in its own module (every import pointing down, none
back at this module; the parts see their queue as a
:class:`~broker.engine.queue.protocols.QueueCore`):

* :attr:`Queue.messages` -- the waiting messages in consumption order
  (``broker.engine.queue.messages``);
* :attr:`Queue.hooks` -- the delivery handler and which of its hooks matter
  (``broker.engine.queue.hooks``);
* :attr:`Queue.ledger` -- the store and producer acknowledges (``broker.engine.queue.ledger``);
* :attr:`Queue.tracker` -- consumer acknowledges, put-backs and timers
  (``broker.engine.queue.acks``);
* :attr:`Queue.dispatch` -- sending to consumers and settling deliveries
  (``broker.engine.queue.dispatch``);
* pull requests are answered by ``broker.engine.queue.pull``;
* :attr:`Queue.strategy` -- everything that depends on the queue's status (is a push
  accepted, is it sent, kept or dropped, who receives it, is a pull answered, what a
  switch does): one small object per status (``broker.engine.queue.statuses``), chosen
  from a table when the status is set; ``Queue.status`` stays the QueueStatus.

This module itself takes pushes (the general :meth:`Queue.accept` and the plain-push
fast path :meth:`Queue.push_plain`), changes options at runtime and removes messages.

The queue never reads a clock and never touches the wire: it appends
:class:`~broker.protocol.Outgoing` frames to the list it is given and asks its host (the
engine) to wake it at its next deadline.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any

from broker.engine import models
from broker.engine.delivery import ALLOW, AckWhen, Decision, PutBack
from broker.engine.flow import AUTO, AUTO_RUN, PLAIN, make_tracked, unsent_copies
from broker.engine.frames import ack as ack_frame
from broker.engine.message import (
    DELAYED,
    DONE,
    INFLIGHT,
    QUEUED,
    Delivery,
    Headers,
    Message,
    QueueMessage,
    derive,
    with_source,
)
from broker.engine.options import ChannelQueueOptions
from broker.engine.queue import pull
from broker.engine.queue.acks import AckTracker
from broker.engine.queue.broadcast_run import publish_plain_run
from broker.engine.queue.dedupe import RecentIds
from broker.engine.queue.dispatch import Dispatcher
from broker.engine.queue.hooks import HandlerHooks
from broker.engine.queue.ledger import Ledger
from broker.engine.queue.messages import PAGE_IN_BATCH, MessageOrder
from broker.engine.queue.plain_prefix import forget_from, plain_prefix, raise_failed
from broker.engine.queue.protocols import QueueHost
from broker.engine.queue.retained import Retained
from broker.engine.queue.seqindex import SequenceIndex
from broker.engine.queue.statuses import Push, RoundRobin, StatusStrategy, strategy_for
from broker.engine.queue.trash import Trash, Trashed
from broker.engine.receipts import requested as receipt_requested
from broker.message import parked
from broker.protocol import (
    AutoRun,
    DeliveredRun,
    NackReason,
    Outgoing,
    PlainSends,
    QueueStatus,
    ResultCode,
    Tracked,
)
from broker.store import IndexEntry, Store, StoredMessage

if TYPE_CHECKING:
    from broker import tmqp
    from broker.engine.channel import Channel as _Channel
    from broker.engine.channel import Client as _Client

    Channel = _Channel[Any]
    Client = _Client[Any]

__all__ = [
    "DELAYED",
    "DONE",
    "INFLIGHT",
    "QUEUED",
    "Delivery",
    "Queue",
    "QueueHost",
    "QueueMessage",
]

_INF = float("inf")
#: ``Queue.unique_to`` while ``accept_many`` numbers a run of the door's own ids.
_OPEN = 1 << 62
#: The statuses whose ``admit`` sends a push at once when nothing waits, else keeps it
#: (``statuses._send_or_keep``): ``Queue.accept_many`` does that itself.
_SENDS_OR_KEEPS = (Push, RoundRobin)
#: Recovered messages read back from the store at once (``Queue.restore_index``).
_READ_BATCH = 1024
#: ``Tracked(client_id, frame)`` without the named tuple's Python-level __new__.
_tracked = tuple.__new__
#: ``Message(...)`` from a tuple of every field, the same way.
_new_message = tuple.__new__
#: ``DeliveredRun(...)`` (``AutoRun(...)``: ``_tracked``), the same way.
_new_run = tuple.__new__
#: Methods of :class:`Queue` that only pass the call on to one of its parts: each queue
#: binds them to the part's own method (an instance attribute shadows the class's
#: function), which saves a call on paths that run per message.  The ``def`` below stay
#: as the documentation (and for the type checker).
_TO_LEDGER = ("save", "delivered", "finish", "side_effects", "drop", "ack_producer")
_TO_TRACKER = (
    "on_ack",
    "ack_taken",
    "consumer_gone",
    "put_back",
    "track",
    "start_timeout",
    "expire",
    "tick",
)
_TO_DISPATCH = (
    "materialize",
    "in_send_order",
    "quiet",
    "send",
    "with_room",
    "choose_one",
    "eligible",
    "hand",
    "after_send",
    "settle_unsent",
)


def _next_in_turn(
    consumers: list[Client], rr: int, used: dict[str, int], name: str, window: int
) -> tuple[Client | None, int]:
    """The consumer ``Dispatcher.choose_one`` takes for a message the handler's quiet test
    passed (no filter asked) whose id no delivery in flight can share (the door's own):
    the next with room from the round-robin position ``rr``, low-priority consumers only
    when no other has room; with the position it moves to (None, ``rr``: none has room)."""
    n = len(consumers)
    start = rr % n
    later = False  # a low-priority consumer was passed over (second round for it)
    for low in (False, True):
        for i in range(n):
            c = consumers[(start + i) % n]
            if c.low_priority is not low:
                later = later or c.low_priority
                continue
            if used.get(c.id, 0) >= (c.prefetch.get(name) or window):
                continue
            return c, (start + i + 1) % n
        if not later:
            break
    return None, rr


def _entries(chunk: list[IndexEntry] | array) -> list[IndexEntry]:
    """A chunk of ``Store.index_chunks`` as entries (an array: plain numbers)."""
    if isinstance(chunk, array):
        new = tuple.__new__
        return [new(IndexEntry, (seq, False, 0, 0, 0.0, None)) for seq in chunk]
    return chunk


class Queue:
    """One queue of a channel; see the module docstring."""

    #: Deadline of a delivery whose queue has no acknowledge timeout.
    NEVER = _INF

    def __init__(
        self,
        channel: Channel,
        queue_id: int,
        options: ChannelQueueOptions,
        host: QueueHost[Queue],
    ) -> None:
        self.channel = channel
        self.id = queue_id
        self.key = (channel.name, queue_id)
        self.host = host
        self.alive = True
        #: Per-queue sequence number of the latest message (grows monotonically).
        self.sequence = 0
        #: Round-robin position (index into the channel's consumer list).
        self.rr = 0
        #: Deliveries in flight per consumer id (see ``broker.engine.flow``); absent: none.
        self.used: dict[str, int] = {}
        #: AUTO deliveries in flight (``broker.engine.flow.AUTO``): each waits for its
        #: acknowledge by taking as a ``pending`` entry would (counted with them).
        self.auto_in_flight = 0
        #: The sequence numbers ``unique_from`` to ``unique_to`` went, in one unbroken
        #: stretch, to messages ``accept_many`` took with the door's own ids (unique:
        #: no other message of the queue shares one; none empty: ``unique_from`` is
        #: then above ``unique_to``).  Any other intake (a push of another kind, a
        #: restore) breaks the stretch: the next such run starts a new one.  The drain
        #: sends AUTO deliveries of those messages only (``Dispatcher.taking_for``).
        self.unique_from = 1
        self.unique_to = 0
        #: The last drain stopped with messages waiting and no consumer able to take one
        #: (full windows): the next settled delivery drains again.
        self.stalled = False
        # counters (QueueInformation)
        self.received = 0
        self.sent = 0
        self.deliveries = 0
        self.acks = 0
        self.nacks = 0
        self.timeouts = 0
        self.saves = 0
        #: Saves the delivery handler wanted that the store refused (``Ledger.save``).
        self.unsaved = 0
        self.removed = 0
        #: Broadcast copies not sent because the consumer's window was full or it left.
        self.dropped = 0
        self.errors = 0
        self.last_received: float | None = None
        self.last_sent: float | None = None
        # the parts
        self.messages = MessageOrder()
        #: Consumed messages kept readable by sequence (option ``Retain``; ``reading``).
        self.retained = Retained()
        #: Producer message ids taken lately (option ``UseMessageId``; ``dedupe``).
        self.recent = RecentIds()
        #: Pushes taken as duplicates of a message id in that window.
        self.duplicates = 0
        #: What left without being consumed (``trash``).
        self.trash = Trash(self._forget_trashed)
        #: Held messages by sequence number, built by the first bounds/browse
        #: (``broker.engine.queue.seqindex``); None: nobody reads this queue by sequence.
        self.index: SequenceIndex | None = None
        self.ledger = Ledger(self)
        self.tracker = AckTracker(self)
        self.dispatch = Dispatcher(self)
        self.options = options
        self.status = options.status
        #: What the status decides (``broker.engine.queue.statuses``).
        self.strategy: StatusStrategy = strategy_for(options.status)
        self.window = self._window(options)
        self.hooks = HandlerHooks(
            host.handler_for(options.message_delivery_handler), self, self.error
        )
        self.plain = self._plain()
        self._set_paging()
        # the calls made per message go straight to the part that answers them
        self.drain = self.dispatch.drain
        self.settle_plain = self.dispatch.settle_plain
        self.settle_auto = self.dispatch.settle_auto
        self.settle_sent = self.dispatch.settle_sent
        for part, names in ((self.ledger, _TO_LEDGER), (self.tracker, _TO_TRACKER)):
            for name in names:
                setattr(self, name, getattr(part, name))
        for name in _TO_DISPATCH:
            setattr(self, name, getattr(self.dispatch, name))

    # ------------------------------------------------------------------ options

    def _window(self, options: ChannelQueueOptions) -> int:
        """Deliveries in flight per consumer unless it asked for its own at JOIN."""
        config = self.host.config
        return min(options.prefetch or config.prefetch, config.max_prefetch)

    def _plain(self) -> bool:
        """May pushes take :meth:`push_plain` (nothing can intervene)?"""
        opts = self.options
        return not (
            self.hooks.any
            or opts.request_acknowledge
            or opts.send_only_first_acquirer
            or opts.hide_client_names
            or opts.message_timeout
            or opts.retain
        )

    def apply_options(self, options: ChannelQueueOptions, now: float, out: list[Outgoing]) -> None:
        """Switch options (status included) at runtime; only Stopped clears messages.

        Deliveries in flight made without their tracked bookkeeping (AUTO deliveries,
        plain pushes) first become the tracked ones they stand for
        (:meth:`track_in_flight`): what the new options do to deliveries in flight (a
        ``Retain`` keeping what is consumed, a handler's hooks, Stopped dropping them) is
        then what they do to tracked ones."""
        self.track_in_flight(now, plain=True)
        old = self.options
        self.options = options
        self.status = options.status
        self.strategy = strategy_for(options.status)
        self.window = self._window(options)
        self.dispatch.out_version += 1
        if options.duplicate_window:  # (made smaller: its newest ids only, on every path)
            self.recent.keep_newest(options.duplicate_window)
        if options.message_delivery_handler != old.message_delivery_handler:
            handler = self.host.handler_for(options.message_delivery_handler)
            self.hooks = HandlerHooks(handler, self, self.error)
        self.plain = self._plain()
        self._set_paging()
        self.strategy.entered(self, old.status, out)
        self.drain(now, out)

    def _set_paging(self) -> None:
        """Page saved waiting messages out to the store (``messages``: "Paging") when it
        keeps them on disk and no hook of the delivery handler looks at a message while
        it waits or is sent (a message read back is a new object), or the handler says
        its hooks only read what a message read back has too (``pages_safely``)."""
        order = self.messages
        store = self.host.store
        if store is None or not store.pages:
            order.window = 0
            return
        order.page_in = self._page_in
        hooks = self.hooks
        watched = (
            hooks.begin_send or hooks.can_receive or hooks.received or hooks.end_send
            or hooks.dequeued
        )  # fmt: skip
        safe = bool(getattr(hooks.handler, "pages_safely", False))
        order.window = 0 if watched and not safe else self.host.config.limits.paged_window

    def expire_paged(self, now: float, out: list[Outgoing]) -> None:
        """Paged-out messages whose deadline came (``MessageOrder.paged_due``) expire as
        any waiting one (trash, counts, hooks), read back a batch at a time."""
        due = self.messages.paged_due(now)
        for i in range(0, len(due), PAGE_IN_BATCH):
            batch = due[i : i + PAGE_IN_BATCH]
            found = self._page_in(batch, timers=False)
            for seq in batch:
                m = found.get(seq)
                if m is not None:  # (one that cannot be read is reported and gone)
                    self.tracker.expire(m, out)

    def _page_in(self, seqs: list[int], timers: bool = True) -> dict[int, QueueMessage]:
        """Paged messages read back from the store (``MessageOrder.page_in``); one that
        cannot be read is reported, forgotten by the store and left out.  ``timers``:
        start the MessageTimeout timers of those read back (not for ones expiring)."""
        store, key, now = self.host.store, self.key, self.host.now
        found: dict[int, QueueMessage] = {}
        deadlines: list[tuple[float, QueueMessage]] = []
        opts = self.options
        timeout = opts.message_timeout / 1000.0 if opts.message_timeout else 0.0
        wall = 0.0
        loaded = store.read_many(key, seqs)
        for seq in seqs:
            s = loaded.get(seq)
            if not isinstance(s, StoredMessage):
                self.error(f"paged message {seq} lost", s or LookupError(seq))
                self.removed += 1
                try:
                    store.remove(key, seq)
                except Exception as err:
                    self.error("store.remove", err)
                continue
            m = QueueMessage(seq, parked(s.message), None, False, now)
            m.saved = True
            m.put_backs = s.put_backs
            m.delivered = s.delivery_count
            if s.deadline:  # (paged after a restart with its clock running: it goes on)
                wall = wall or self.host.config.wall_clock()
                deadlines.append((now + (s.deadline - wall), m))
            elif timeout:  # (saved before the queue had a timeout: its clock starts now)
                deadlines.append((now + timeout, m))
            found[seq] = m
        if deadlines and timers:
            self.tracker.restore_deadlines(deadlines)
        index = self.index
        if index is not None:  # the numbers' entries become the objects read back...
            index.paged_in(found.values())
            if len(found) < len(seqs):  # ...or go with the unreadable ones
                index.discard(seq for seq in seqs if seq not in found)
        return found

    @property
    def handler(self) -> Any:
        """The queue's delivery handler."""
        return self.hooks.handler

    def information(self, wall: float, now: float) -> dict[str, Any]:
        """QueueInformation (document model); ``wall``/``now``: current wall/monotonic."""
        return models.queue_information(self, wall, now)

    def summary(self) -> dict[str, Any]:
        """QueueSummary / QueueEvent model."""
        return models.queue_summary(self)

    # ------------------------------------------------------------------ state views

    @property
    def n_priority(self) -> int:
        return self.messages.n_priority

    @property
    def n_regular(self) -> int:
        return self.messages.n_regular

    @property
    def message_count(self) -> int:
        return self.messages.n_priority + self.messages.n_regular

    @property
    def pending(self) -> OrderedDict[tuple[str, str], Delivery]:
        """Deliveries waiting for their consumer's acknowledge (``acks``)."""
        return self.tracker.pending

    @property
    def wake_at(self) -> float | None:
        """Earliest deadline the engine was asked to wake this queue for."""
        return self.tracker.wake_at

    @property
    def store(self) -> Store:
        return self.host.store

    def waiting(self) -> bool:
        """Messages wait in the queue (a new one would queue behind them)."""
        messages = self.messages
        return bool(messages.n_priority or messages.n_regular or messages.front)

    def blocked(self) -> bool:
        """WaitForAcknowledge holds every send until the pending acknowledges arrive (an
        AUTO delivery in flight waits for its acknowledge by taking as one would)."""
        return bool(
            self.options.wait_for_acknowledge and (self.tracker.pending or self.auto_in_flight)
        )

    def is_empty(self) -> bool:
        return not self.messages.count and self.tracker.idle() and not self.auto_in_flight

    def enqueue(self, m: QueueMessage) -> None:
        m.park()  # (memory: see broker.message.parked)
        messages = self.messages
        if m.deadline and messages.paging:
            # its timer (just started) goes if it is paged out: the tail keeps its deadline
            expiry = self.tracker.expiry
            timed = bool(expiry) and expiry[-1][1] is m
            if messages.enqueue(m, deadline_ok=timed) and timed:
                expiry.pop()
                self.tracker.arm(m.deadline)  # (the tail's front is due first)
        else:
            messages.enqueue(m)
        if self.index is not None:
            self.index.enqueued(self.messages, m)  # (paged out: its entry becomes its number)

    # ------------------------------------------------------------------ the host

    def client(self, client_id: str) -> Client | None:
        return self.host.client(client_id)

    def wake(self, when: float) -> None:
        self.host.wake(self, when)

    def error(self, where: str, exc: Exception) -> None:
        self.errors += 1
        self.host.count_error(f"queue {self.channel.name}/{self.id} {where}", exc)

    def hook(self, m: QueueMessage | None, name: str, *args: Any) -> Decision:
        return self.hooks.call(m, name, *args)

    # ------------------------------------------------------------------ the ledger

    def save(self, m: QueueMessage) -> None:
        self.ledger.save(m)

    def delivered(self, m: QueueMessage, now: float) -> None:
        self.ledger.delivered(m, now)

    def put_back_saved(self, m: QueueMessage, now: float) -> None:
        """A saved message was put back: its new count is kept (``Ledger.delivered``)."""
        self.ledger.delivered(m, now, durable=True)

    def finish(self, m: QueueMessage) -> None:
        self.ledger.finish(m)

    def ack_producer(
        self, m: QueueMessage, when: AckWhen, out: list[Outgoing], reason: str, source: str = ""
    ) -> None:
        self.ledger.ack_producer(m, when, out, reason, source)

    def to_trash(self, m: QueueMessage, reason: str) -> None:
        """``m`` leaves without being consumed (expired, past its put-back limit, nacked
        and not put back): keep it in the queue's trash (the caller finishes it)."""
        opts = self.options
        message = m.message
        if message.wire is not None:
            message = message.replace()
        item = Trashed(message, reason, self.host.now)
        if m.saved and opts.trash_limit:  # kept on disk too (before the live record goes)
            producer = m.producer.id if m.producer is not None else ""
            stored = StoredMessage(m.seq, message, producer, m.put_backs, m.delivered)
            try:
                self.store.trash(self.key, stored, reason, self.host.config.wall_clock())
            except Exception as exc:
                self.error("store.trash", exc)
        self.trash.add(m.seq, item, opts.trash_limit, opts.trash_retention)

    def _forget_trashed(self, seq: int) -> None:
        try:
            self.store.forget_trashed(self.key, seq)
        except Exception as exc:
            self.error("store.forget_trashed", exc)

    def restore_trashed(self, stored: StoredMessage, reason: str, at: float, now: float) -> None:
        """A trashed message kept in the store, after a restart (``at``: wall-clock time
        it was trashed; its age counts toward ``TrashRetention``)."""
        age = max(0.0, self.host.config.wall_clock() - at) if at else 0.0
        opts = self.options
        item = Trashed(stored.message, reason, now - age)
        self.trash.add(stored.sequence, item, opts.trash_limit, opts.trash_retention)
        if stored.sequence not in self.trash.entries:  # no room (TrashLimit 0): gone
            self._forget_trashed(stored.sequence)

    def side_effects(self, m: QueueMessage, d: Decision, out: list[Outgoing]) -> None:
        self.ledger.side_effects(m, d, out)

    def drop(self, m: QueueMessage, out: list[Outgoing], reason: str, count: bool = True) -> None:
        """Remove a message that was not consumed; a waiting producer gets a nack."""
        self.ledger.drop(m, out, reason, count)

    # ------------------------------------------------------------------ the tracker

    def on_ack(self, client: Client, ack: Message, now: float, out: list[Outgoing]) -> bool:
        """A consumer acknowledge for this queue; False when no delivery matches."""
        return self.tracker.on_ack(client, ack, now, out)

    def ack_taken(self, client: Client, message_id: str, now: float, out: list[Outgoing]) -> None:
        """A delivery the consumer acknowledges by taking it was taken by the transport."""
        self.tracker.ack_taken(client, message_id, now, out)

    def consumer_gone(self, client: Client, now: float, out: list[Outgoing]) -> None:
        """The consumer disconnected: its unacknowledged deliveries fail."""
        self.tracker.consumer_gone(client, now, out)

    def put_back(self, m: QueueMessage, where: PutBack, now: float, out: list[Outgoing]) -> None:
        self.tracker.put_back(m, where, now, out)

    def track(self, m: QueueMessage, c: Client, deadline: float) -> Delivery:
        return self.tracker.track(m, c, deadline)

    def start_timeout(self, m: QueueMessage, now: float) -> None:
        self.tracker.start_timeout(m, now)

    def expire(self, m: QueueMessage, out: list[Outgoing]) -> None:
        self.tracker.expire(m, out)

    def tick(self, now: float, out: list[Outgoing]) -> None:
        """Run the timers due by ``now`` (put-back delays, acknowledge/message timeouts)."""
        self.tracker.tick(now, out)

    def next_deadline(self) -> float | None:
        return self.tracker.next_deadline()

    def drain_again(self, when: float) -> None:
        """Ask the engine for a tick at ``when`` (a drain that stopped at its bound while
        it was making progress: the next one goes on, after what else is waiting)."""
        self.tracker.arm(when)

    # ------------------------------------------------------------------ windows

    def room(self, c: Client) -> bool:
        """May consumer ``c`` take one more delivery of this queue now?"""
        return self.used.get(c.id, 0) < (c.prefetch.get(self.channel.name) or self.window)

    def _room_of(self, consumers: list[Client]) -> int:
        """How many more deliveries ``consumers``' windows take in all (what
        :meth:`next_with_room` hands out before it finds none)."""
        used = self.used
        name = self.channel.name
        window = self.window
        return sum(max(0, (c.prefetch.get(name) or window) - used.get(c.id, 0)) for c in consumers)

    def release(self, client_id: str) -> None:
        """One of the consumer's deliveries left its window."""
        used = self.used
        n = used.get(client_id, 0) - 1
        if n > 0:
            used[client_id] = n
        else:
            used.pop(client_id, None)

    def next_with_room(self, consumers: list[Client]) -> Client | None:
        """Round robin: the next consumer with room in its window (None: all full)."""
        n = len(consumers)
        start = self.rr % n
        for i in range(n):
            c = consumers[(start + i) % n]
            if self.room(c):
                self.rr = (start + i + 1) % n
                return c
        return None

    # ------------------------------------------------------------------ the dispatcher

    def send(
        self,
        m: QueueMessage,
        consumers: Sequence[Client],
        now: float,
        out: list[Outgoing],
        keep: bool = True,
    ) -> bool:
        return self.dispatch.send(m, consumers, now, out, keep)

    def publish(self, m: QueueMessage, stream: Any, now: float, out: list[Outgoing]) -> bool:
        """Publish ``m`` once on the channel's fan-out ``stream`` (``broker.engine.fanout``)
        for its members; False (nothing done) when it needs per-consumer work: the queue
        requests acknowledges or has delivery hooks, or ``m`` asks for a receipt."""
        hooks = self.hooks
        if (
            self.options.request_acknowledge
            or hooks.begin_send
            or hooks.received
            or hooks.end_send
            or hooks.can_receive
        ):
            return False
        headers = m.message.headers
        if headers and receipt_requested(headers)[0]:
            return False  # (a receipt counts who received the message: one by one)
        stream.publish(self.dispatch.out_message(m), out)
        self.sent += 1
        self.deliveries += len(stream.members)
        self.last_sent = now
        m.state = INFLIGHT
        return True

    def eligible(self, m: QueueMessage, c: Client) -> bool:
        return self.dispatch.eligible(m, c)

    def with_room(
        self, m: QueueMessage, consumers: Sequence[Client], req_ack: bool, keep: bool
    ) -> list[Client]:
        return self.dispatch.with_room(m, consumers, req_ack, keep)

    def choose_one(
        self, m: QueueMessage, consumers: Sequence[Client], rotate: bool, req_ack: bool
    ) -> tuple[Client, ...]:
        return self.dispatch.choose_one(m, consumers, rotate, req_ack)

    def hand(
        self,
        c: Client,
        kind: int,
        m: QueueMessage | None,
        frame: Message | tmqp.Frame,
        out: list[Outgoing],
    ) -> None:
        self.dispatch.hand(c, kind, m, frame, out)

    def after_send(
        self, m: QueueMessage, c: Client, req_ack: bool, deadline: float, out: list[Outgoing]
    ) -> None:
        self.dispatch.after_send(m, c, req_ack, deadline, out)

    def materialize(
        self, c: Client, message: Message | QueueMessage, seq: int, now: float
    ) -> QueueMessage | None:
        """An AUTO delivery becomes its tracked one (``Dispatcher.materialize``)."""
        return self.dispatch.materialize(c, message, seq, now)

    def materialize_plain(self, message: Message, seq: int, now: float) -> QueueMessage:
        """A plain push in flight becomes its tracked copy (``Dispatcher.materialize_plain``)."""
        return self.dispatch.materialize_plain(message, seq, now)

    def track_in_flight(self, now: float, plain: bool = False) -> None:
        """The queue's AUTO deliveries still unsent (and with ``plain`` its plain pushes)
        become the tracked deliveries they stand for, in their consumers' ``unsent`` and
        in send order in ``pending`` (``flow.make_tracked``, ``AckTracker.place``).  Paid
        by the operation that needs it (a browse, a purge of deliveries in flight, an
        options change), never per message; nothing to do (one test) when none are out."""
        if not self.alive or not (self.auto_in_flight or (plain and self.used)):
            return
        orders = make_tracked(self, self._holders(), now, plain)
        if orders:
            self.tracker.place(orders)

    def copies_in_flight(self) -> list[QueueMessage]:
        """The queue messages of deliveries in flight that await no acknowledge and the
        transport has not taken (``flow.unsent_copies``)."""
        return unsent_copies(self, self._holders()) if self.used else []

    def _holders(self) -> list[Client]:
        """The clients that may hold deliveries of this queue in ``unsent``: each such
        delivery holds a slot of its window (``used``) until it is settled."""
        found = (self.host.client(cid) for cid in list(self.used))
        return [c for c in found if c is not None]

    def in_send_order(self, client_id: str, message_id: str) -> None:
        """A leaving consumer's unsent tracked delivery, in send order
        (``Dispatcher.in_send_order``)."""
        self.dispatch.in_send_order(client_id, message_id)

    def quiet(self, headers: Headers) -> bool:
        """The handler's quiet test of ``headers`` (``Dispatcher.quiet``)."""
        return self.dispatch.quiet(headers)

    def settle_unsent(
        self,
        kind: int,
        client_id: str,
        m: QueueMessage | None,
        frame: Message | None,
        seq: int,
        now: float,
        out: list[Outgoing],
    ) -> None:
        """The consumer went away before the transport took a delivery (``flow.abandon``)."""
        self.dispatch.settle_unsent(kind, client_id, m, frame, seq, now, out)

    # ------------------------------------------------------------------ removal, recovery

    def clear(self, out: list[Outgoing], *, priority: bool, regular: bool, in_flight: bool) -> int:
        """Remove waiting (and optionally in-flight / delayed) messages; returns the count."""
        held, paged = self.messages.take_paged(priority=priority, regular=regular)
        taken = self.messages.take(priority=priority, regular=regular)
        taken += held
        for m in taken:
            self.drop(m, out, NackReason.CLEARED)
        self.forget_paged(paged)
        if in_flight:
            if self.auto_in_flight:  # (AUTO deliveries are dropped as tracked ones)
                self.track_in_flight(self.host.now)
            self.tracker.clear(out)
        return len(taken) + len(paged)

    def forget_paged(self, seqs: list[int]) -> None:
        """Paged messages taken out of the queue unconsumed (cleared): the store forgets
        them (nobody waits for them: a paged message's producer was answered)."""
        self.removed += len(seqs)
        if self.index is not None:
            self.index.discard(seqs)
        store, key = self.host.store, self.key
        for seq in seqs:
            try:
                store.remove(key, seq)
            except Exception as exc:
                self.error("store.remove", exc)

    def close(self, out: list[Outgoing]) -> None:
        """The queue is removed: drop everything and stop timers."""
        self.clear(out, priority=True, regular=True, in_flight=True)
        self.retained.clear()
        self.recent.clear()
        self.trash.clear()
        self.index = None
        self.alive = False

    def restore(self, stored: StoredMessage, producer: Client | None, now: float) -> None:
        """Re-enqueue a message recovered from the store: its sequence number, priority,
        put-backs and delivery count kept, its MessageTimeout deadline (wall clock in the
        store) still where it was -- passed while the broker was down: it expires at the
        next tick.  A message saved without a deadline on a queue that has a timeout
        starts its clock now."""
        self.restore_all((stored,), now, producer)

    def restore_all(
        self, stored: Iterable[StoredMessage], now: float, producer: Client | None = None
    ) -> int:
        """:meth:`restore` for a whole queue's saved messages at once (a restart), in the
        order given; returns how many.  The same state as one :meth:`restore` per
        message -- order per priority, sequence numbers, put-backs, delivery counts,
        deadlines, remembered ids -- with the lookups done once, the deques appended to
        directly and the deadlines merged into the expiry order in one sort."""
        opts = self.options
        remember = self.recent.add if opts.use_message_id and opts.duplicate_window else None
        window = opts.duplicate_window
        timeout = opts.message_timeout / 1000.0 if opts.message_timeout else 0.0
        wall = self.host.config.wall_clock()
        order = self.messages
        priority, regular = order.priority, order.regular
        deadlines: list[tuple[float, QueueMessage]] = []
        n_priority = n_regular = 0
        highest = self.sequence
        for s in stored:
            m = QueueMessage(s.sequence, parked(s.message), producer, False, now)
            m.saved = True
            m.put_backs = s.put_backs
            m.delivered = s.delivery_count  # sent before the restart: flagged redelivered
            m.state = QUEUED
            m.out = None
            if remember is not None and m.message_id:
                remember(m.message_id, now, window)
            if m.seq > highest:
                highest = m.seq
            if m.high_priority:
                priority.append(m)
                n_priority += 1
            else:
                regular.append(m)
                n_regular += 1
            if s.deadline:
                deadlines.append((now + (s.deadline - wall), m))
            elif timeout:
                deadlines.append((now + timeout, m))
        order.n_priority += n_priority
        order.n_regular += n_regular
        self.sequence = highest
        self.index = None  # rebuilt by the next read by sequence
        if deadlines:
            self.tracker.restore_deadlines(deadlines)
        return n_priority + n_regular

    def restore_index(self, chunks: Iterable[list[IndexEntry] | array], now: float) -> int:
        """:meth:`restore_all` for a queue that pages (``messages``: "Paging"): from the
        store's index (``Store.index``), the first :attr:`MessageOrder.window` messages
        per priority read back whole (:data:`_READ_BATCH` at a time), the rest left in
        the store as their numbers, each with its deadline (its clock runs while it
        waits) -- except one due before the number paged ahead of it, read and held
        (``PagedTail``: "Deadlines").  The ids of the newest ``DuplicateWindow`` messages
        are remembered (read back for those paged).  Returns how many."""
        order = self.messages
        window = order.window
        self.index = None  # rebuilt by the next read by sequence
        if not window:
            return self.restore_all(self._whole(e for c in chunks for e in _entries(c)), now)
        opts = self.options
        dedupe = opts.duplicate_window if opts.use_message_id else 0
        newest: deque[int] = deque(maxlen=dedupe or 1)
        #: (entry, held in the tail?) waiting to be read back and queued, in order
        batch: list[tuple[IndexEntry, bool]] = []
        in_memory = [0, 0]  # per priority (regular, high): messages bound for the deque
        highest = self.sequence
        count = 0
        regular_tail = order.paged_regular
        timeout = opts.message_timeout / 1000.0 if opts.message_timeout else 0.0
        for chunk in chunks:
            if (  # plain, the regular deque full (their clock starts now: in order)
                isinstance(chunk, array)
                and regular_tail.seqs
                and (not timeout or regular_tail.last_deadline() <= now + timeout)
            ):
                regular_tail.extend(chunk, [now + timeout] * len(chunk) if timeout else None)
                order.n_regular += len(chunk)
                count += len(chunk)
                highest = max(highest, chunk[-1])
                if dedupe:
                    newest.extend(chunk[-dedupe:])
                continue
            entries = _entries(chunk)
            count += self._restore_chunk(
                entries, now, in_memory, batch, newest if dedupe else None
            )
            if entries:
                highest = max(highest, max(e.sequence for e in entries))
        self._restore_batch(batch, now)
        self.sequence = highest
        if dedupe:
            self._remember_ids(list(newest), now, dedupe)
        return count

    def _restore_chunk(
        self,
        chunk: list[IndexEntry],
        now: float,
        in_memory: list[int],
        batch: list[tuple[IndexEntry, bool]],
        newest: deque[int] | None,
    ) -> int:
        """``restore_index`` for one chunk, entry by entry."""
        order = self.messages
        window = order.window
        opts = self.options
        timeout = opts.message_timeout / 1000.0 if opts.message_timeout else 0.0
        wall = self.host.config.wall_clock() if timeout or any(e.deadline for e in chunk) else 0.0
        for e in chunk:
            seq = e.sequence
            high = e.high_priority
            tail = order.paged_priority if high else order.paged_regular
            paging = len(tail.seqs) > tail.head or in_memory[high] >= window
            if not paging:
                in_memory[high] += 1
                batch.append((e, False))
            else:
                # paged out with its deadline (its clock running since it was saved),
                # unless that is earlier than the one before it: then read and held
                if e.deadline:
                    deadline = now + (e.deadline - wall)
                else:
                    deadline = now + timeout if timeout else 0.0
                if e.stored is not None or not tail.append(seq, deadline):
                    tail.slot(seq)
                    batch.append((e, True))
            if len(batch) >= _READ_BATCH:
                self._restore_batch(batch, now)
                batch.clear()
            if high:
                order.n_priority += 1
            else:
                order.n_regular += 1
            if newest is not None:
                newest.append(seq)
        return len(chunk)

    def _restore_batch(self, batch: list[tuple[IndexEntry, bool]], now: float) -> None:
        """Queue recovered entries whole (``restore_index``), read back together."""
        if not batch:
            return
        order = self.messages
        wanted = [e.sequence for e, _ in batch if e.stored is None]
        loaded = self.host.store.read_many(self.key, wanted) if wanted else {}
        opts = self.options
        timeout = opts.message_timeout / 1000.0 if opts.message_timeout else 0.0
        wall = self.host.config.wall_clock()
        deadlines: list[tuple[float, QueueMessage]] = []
        for e, held in batch:
            seq = e.sequence
            stored = e.stored or loaded.get(seq)
            if not isinstance(stored, StoredMessage):
                if held:  # its number stays in the tail: reported when its turn comes
                    continue
                self.error(f"recovered message {seq} lost", stored or LookupError(seq))
                if e.high_priority:
                    order.n_priority -= 1
                else:
                    order.n_regular -= 1
                continue
            m = QueueMessage(seq, parked(stored.message), None, False, now)
            m.saved = True
            m.put_backs = stored.put_backs
            m.delivered = stored.delivery_count  # sent before the restart: redelivered
            m.state = QUEUED
            if held:
                tail = order.paged_priority if e.high_priority else order.paged_regular
                tail.held[seq] = m
            elif e.high_priority:
                order.priority.append(m)
            else:
                order.regular.append(m)
            if stored.deadline:
                deadlines.append((now + (stored.deadline - wall), m))
            elif timeout:
                deadlines.append((now + timeout, m))
        if deadlines:
            self.tracker.restore_deadlines(deadlines)

    def _remember_ids(self, seqs: list[int], now: float, window: int) -> None:
        """The ids of recovered messages count for duplicate suppression (``dedupe``)."""
        found = self.host.store.read_many(self.key, seqs) if seqs else {}
        for seq in seqs:
            stored = found.get(seq)
            if isinstance(stored, StoredMessage) and stored.message.message_id:
                self.recent.add(stored.message.message_id, now, window)

    def _whole(self, entries: Iterable[IndexEntry]) -> Iterator[StoredMessage]:
        """The entries' messages, each read back if the index did not give it."""
        for e in entries:
            if e.stored is not None:
                yield e.stored
                continue
            try:
                yield self.host.store.read(self.key, e.sequence)
            except Exception as exc:
                self.error(f"recovered message {e.sequence} lost", exc)

    # ------------------------------------------------------------------ push

    def check_push(self, size: int) -> int:
        """Result code a push of ``size`` payload octets would get (0 = accepted)."""
        strategy = self.strategy
        if not strategy.accepts_pushes:
            return ResultCode.UNACCEPTABLE
        opts = self.options
        if opts.message_size_limit and size > opts.message_size_limit:
            return ResultCode.LIMIT_EXCEEDED
        if (
            opts.message_limit
            and strategy.limits_count
            and self.message_count >= opts.message_limit
        ):
            return ResultCode.LIMIT_EXCEEDED
        return 0

    def push_plain(self, m: Message, sender: Client, now: float, out: list[Outgoing]) -> bool:
        """Take a push without the general path when nothing could decide otherwise.

        Taken when the queue is :attr:`plain` (default hooks, no acknowledge requests,
        no message timeout, names not hidden), in push or round-robin status, the message
        is addressed to this queue without headers, acknowledge wish or first-acquirer
        flag, and it passes the size limit.  Then :meth:`accept` would send the message
        (source stamped) to a consumer or queue it: this does the same with less
        bookkeeping.  Sent at once (nothing waits, one consumer takes it: round robin, or
        push with one consumer) it needs no QueueMessage at all: the message and its
        sequence number are enough to put it back if the consumer goes away before it is
        sent (``broker.engine.flow``); it leaves as it came (with its wire form, if its
        door gave it one).  Returns False (use :meth:`accept`) for anything else.  The
        caller has checked the authorization, that the producer waits for no answer and
        that no MESSAGE_PRODUCED subscriber waits.
        """
        strategy = self.strategy
        if (
            not self.plain
            or not strategy.takes_plain
            or m.headers
            or m.wants_ack
            or m.first_acquirer
            or m.content_type != self.id
            or m.target != self.channel.name
        ):
            return False
        opts = self.options
        if (opts.wait_for_acknowledge and self.tracker.pending) or (
            opts.message_size_limit and len(m.payload) > opts.message_size_limit
        ):
            return False
        if not m.message_id and opts.use_message_id:
            return False  # accept() gives it an id
        dedupe = opts.use_message_id and opts.duplicate_window
        if dedupe and self.recent.seen(m.message_id, now, opts.duplicate_window_time):
            return False  # a duplicate: answered by duplicate()
        if m.source != sender.id:  # (first: a push failing here changed nothing)
            m = with_source(m, sender.id)
        consumers = self.channel.consumer_list
        messages = self.messages
        c: Client | None = None
        if consumers and not (messages.n_priority or messages.n_regular or messages.front):
            if len(consumers) == 1 or strategy.plain_many:
                c = strategy.plain_target(self, consumers)  # None: full windows, it waits
            else:
                return False  # a push to several consumers is followed as a QueueMessage
        if c is None and opts.message_limit:
            return False  # accept() after check_push
        if dedupe:
            recent = self.recent  # (RecentIds.add of an id just found unseen)
            recent.add_new(m.message_id, now, opts.duplicate_window)
            if now != recent.newest:
                recent.added_at(now)  # (at the same now again it changes nothing)
        self.sequence += 1
        self.received += 1
        self.last_received = now
        if c is not None:
            cid = c.id
            out.append(_tracked(Tracked, (cid, m)))
            c.unsent.append((PLAIN, self, None, m, self.sequence))
            used = self.used
            used[cid] = used.get(cid, 0) + 1
            return True
        qm = QueueMessage(self.sequence, parked(m), sender, False, now)
        self._enqueue_plain(qm)
        if consumers and (not self.stalled or qm.high_priority):
            self.drain(now, out)  # (stalled: see accept)
        return True

    def _enqueue_plain(self, qm: QueueMessage) -> None:
        """A plain push that no consumer took at once waits (``MessageOrder.enqueue``,
        inline but for a paging queue: this runs per message)."""
        messages = self.messages
        index = self.index
        if index is not None:
            index.add(qm)
        if messages.window or messages.paged_regular.seqs or messages.paged_priority.seqs:
            messages.enqueue(qm)  # (paging)
            if index is not None:
                index.enqueued(messages, qm)  # (paged out: its entry becomes its number)
        elif qm.high_priority:
            messages.priority.append(qm)
            messages.n_priority += 1
        else:
            messages.regular.append(qm)
            messages.n_regular += 1

    def push_plain_run(
        self, ms: Sequence[Message], start: int, sender: Client, now: float, out: list[Outgoing]
    ) -> int:
        """:meth:`push_plain` for several pushes of one producer in one call (a TMQP
        batch, ``broker.batch``): ``ms[start:]``; returns how many it took from
        ``start`` on; the one after them (if any) is not plain and takes the general
        path, then the rest may come here again.  The conditions are checked once for
        the run where they cannot change within it (the queue's options and status, a
        wait for acknowledges), per message where they can (headers and flags, size,
        its id against the duplicate window, which is swept once); one consumer's room
        is read once instead of per message; the messages no consumer takes at once
        wait and the queue is drained once at the end, not once per message.  The
        outcome is what :meth:`push_plain` one message at a time gives (tested against
        it: ``tests/broker/test_engine_batch_path.py``).  The caller has checked what
        :meth:`push_plain`'s caller checks, for the whole run.
        """
        strategy = self.strategy
        if not self.plain:
            return 0
        if not strategy.takes_plain:
            stream = self.channel.fanout
            if stream is None or strategy.status is not QueueStatus.BROADCAST:
                return 0
            return publish_plain_run(self, stream, ms, start, sender, now, out)
        opts = self.options
        if opts.wait_for_acknowledge and self.tracker.pending:
            return 0
        consumers = self.channel.consumer_list
        messages = self.messages
        direct = bool(consumers) and not (
            messages.n_priority or messages.n_regular or messages.front
        )
        if direct and len(consumers) > 1 and not strategy.plain_many:
            return 0  # a push to several consumers is followed as a QueueMessage
        limited = opts.message_limit
        name = self.channel.name
        used = self.used
        one: Client | None = None  # the single consumer: its room read once
        room = 0
        if direct and len(consumers) == 1:
            one = strategy.plain_target(self, consumers)  # (its side effects, once)
            if one is None:
                direct = False
            else:
                room = (one.prefetch.get(name) or self.window) - used.get(one.id, 0)
        most = len(ms)
        if limited:  # (a push no consumer takes at once goes through check_push)
            if not direct:
                return 0
            most = room if one is not None else self._room_of(consumers)
        end = plain_prefix(ms, start, most, self.id, name, opts, self.recent, now)
        if end == start:
            return 0
        sid = sender.id
        queued = False
        high = False
        sent_one = 0  # deliveries to ``one``: its count in ``used`` grows once, at the end
        seq = first = self.sequence  # (written back at the end, even if a message raises)
        k = start
        failed: BaseException | None = None
        # The single consumer's room, read once, takes the first pushes in a loop of its
        # own (a delivery each, nothing to choose); the general loop takes the rest.
        rest = min(end, start + room) if one is not None else start
        try:
            if rest > start:
                assert one is not None
                cid = one.id
                deliver = out.append
                keep = one.unsent.append
                for k in range(start, rest):
                    m = ms[k]
                    if m.source != sid:
                        m = with_source(m, sid)
                    seq += 1
                    deliver(_tracked(Tracked, (cid, m)))
                    keep((PLAIN, self, None, m, seq))
                sent_one = rest - start
                room -= sent_one
            for k in range(rest, end):
                m = ms[k]
                if m.source != sid:
                    m = with_source(m, sid)
                seq += 1
                c: Client | None = None
                if direct:
                    if one is not None:
                        if room > 0:
                            room -= 1
                            c = one
                        else:
                            direct = False
                    else:
                        c = strategy.plain_target(self, consumers)
                        if c is None:
                            direct = False
                if c is not None:
                    out.append(_tracked(Tracked, (c.id, m)))
                    c.unsent.append((PLAIN, self, None, m, seq))
                    if c is one:
                        sent_one += 1
                    else:
                        used[c.id] = used.get(c.id, 0) + 1
                    continue
                self.sequence = seq  # (the queue message is numbered from it)
                qm = QueueMessage(seq, parked(m), sender, False, now)
                self._enqueue_plain(qm)
                queued = True
                high = high or qm.high_priority
        except BaseException as exc:  # push k raised before it was delivered or placed
            failed = exc
            seq = first + (k - start)  # (its number unused)
            if k < rest:  # (in the single consumer's loop: those before it were delivered)
                sent_one = k - start
            forget_from(ms, k, end, self.recent)
            end = k
        self.sequence = seq
        if sent_one:
            assert one is not None
            used[one.id] = used.get(one.id, 0) + sent_one
        taken = end - start
        self.received += taken
        self.last_received = now
        if queued and consumers and (not self.stalled or high):
            self.drain(now, out)  # (stalled: see accept)
        if failed is not None:
            raise_failed(failed, taken)
        return taken

    def accept(
        self,
        message: Message,
        sender: Client | None,
        now: float,
        out: list[Outgoing],
        producer_waits: bool,
        headers: tuple[tuple[str, str], ...] | None = None,
        message_id: str | None = None,
    ) -> QueueMessage | None:
        """Enqueue (or broadcast) a pushed message that passed :meth:`check_push`.

        ``headers``/``message_id`` override the message's (CC copies, routers).  Returns
        the queue message, or None when the delivery handler rejected it.
        """
        opts = self.options
        mid = message.message_id if message_id is None else message_id
        remember = bool(mid) and opts.use_message_id and opts.duplicate_window > 0
        if not mid and (opts.use_message_id or opts.request_acknowledge or producer_waits):
            mid = self.host.new_id()
        src = sender.id if sender is not None else message.source
        hdrs = message.headers if headers is None else headers
        message = derive(message, False, self.id, mid, src, self.channel.name, hdrs)
        m = self._numbered(message, sender, producer_waits, now)
        unsaved = self.unsaved
        try:
            d = self.hooks.handler.received_from_producer(self, m, sender)
        except Exception as exc:
            self.error("received_from_producer", exc)
            d = Decision(allow=False, send_ack=AckWhen.NEGATIVE)
        if d is not ALLOW and not self._decided(m, d, out):
            return None
        if remember and self.unsaved == unsaved:
            # (a push its handler could not save is not remembered: a retry of it is
            # taken again, not answered as a duplicate done)
            self.recent.add(mid, now, opts.duplicate_window)
        dispatch = self.dispatch
        dispatch.fresh, dispatch.fresh_message = m, message  # (sent at once: not rebuilt)
        try:
            self.strategy.admit(self, m, now, out)
        finally:
            dispatch.fresh = dispatch.fresh_message = None
        return m

    def accept_many(
        self,
        ms: Sequence[Message],
        start: int,
        end: int,
        sender: Client,
        now: float,
        out: list[Outgoing],
        max_messages: int,
        *,
        remember_ids: bool = True,
    ) -> tuple[int, int | Exception]:
        """:meth:`check_push` then :meth:`accept` (no producer waiting) for each of
        ``ms[start:end]`` in turn, as the engine's run of typed pushes does one by one
        (``Engine._push_run``), with what cannot change within the run read once.

        For an acknowledged queue (a STOMP ``/queue/``: its consumers acknowledge, the
        STOMP door's runs of SENDs come here).  Returns how many were taken from
        ``start`` on, and the result code refusing the next one (0: all taken; a store
        that refused a save also ends the run, after that message: the caller compares
        :attr:`unsaved`) or the exception the next one raised (what it did before it
        raised stays done, as for :meth:`accept`).  ``max_messages``: the broker's bound
        on the messages one queue holds (``ChannelRegistry.check_push``).
        ``remember_ids`` False: the ids are the door's own, unique (``Engine.publish_many``'s
        ``unique_ids``), not kept in the duplicate window.

        Per message, the same steps and order as :meth:`accept` then the status's
        ``admit`` for Push and RoundRobin (sent at once when nothing waits ahead of it
        and no acknowledge is awaited, else queued and drained): the same sequence
        numbers, duplicate window, handler decisions, round robin, windows, priorities
        and deliveries (tested against one by one: ``tests/broker/test_accept_many.py``).
        Any other status admits each message itself.

        An AUTO delivery (``broker.engine.flow.AUTO``): a message sent at once to one
        consumer -- the one round robin chooses (``_next_in_turn``), or a Push queue's
        only one -- which acknowledges the channel by taking (``Client.auto_acked``,
        STOMP ``ack:auto``), leaves without a queue message, ``pending`` entry or
        ``Delivery`` when all of these hold -- Push or RoundRobin, nothing waiting ahead
        of it, room in the consumer's window, the handler's quiet
        test passes its header block and its ``received_from_producer`` said ALLOW (not
        saved: a ``persistent`` message stays tracked), the ids are the door's own
        (``remember_ids`` False), no browse index, no message or acknowledge timeout, no
        WaitForAcknowledge, no Retain, no ``end_send`` or ``message_dequeued`` hook.  It
        goes out as the frame the tracked path sends and counts as that delivery does
        (``flow.transmitted``, ``Dispatcher.settle_auto``); anything else it meets makes
        it the tracked delivery first (``Dispatcher.materialize``).  A single consumer
        whose transport takes runs (``Client.auto_runs``: the STOMP door's) gets a run of
        AUTO deliveries as one item (:meth:`_send_auto_run`); any other gets a
        ``Tracked`` frame per delivery.  With the
        door's own ids the numbers given extend the stretch of unique ids
        (:attr:`unique_from`) the drain's AUTO deliveries come from."""
        strategy = self.strategy
        if not strategy.accepts_pushes:
            return 0, ResultCode.UNACCEPTABLE
        opts = self.options
        size_limit = opts.message_size_limit
        count_limit = opts.message_limit if strategy.limits_count else 0
        broker_limit = max_messages if strategy.limits_count else 0
        messages = self.messages
        channel = self.channel
        name = channel.name
        qid = self.id
        sid = sender.id
        needs_id = opts.use_message_id or opts.request_acknowledge
        remember = remember_ids and opts.use_message_id and opts.duplicate_window > 0
        window = opts.duplicate_window
        recent = self.recent
        hooks = self.hooks
        received = hooks.handler.received_from_producer
        by_headers = hooks.received_by_headers
        asked: Headers | None = None  # the header block received was asked about last
        answer = ALLOW  # (its answer)
        dispatch = self.dispatch
        send = dispatch.send
        tracker = self.tracker
        pending = tracker.pending
        timeout = opts.message_timeout
        wait = opts.wait_for_acknowledge
        sends = type(strategy) in _SENDS_OR_KEEPS
        admit = strategy.admit
        unsaved = self.unsaved
        # A message sent at once to one consumer (round robin's, or Push's only one) that
        # acknowledges this channel by taking goes out as an AUTO delivery
        # (``broker.engine.flow``: no queue message, no ``pending`` entry) when nothing
        # the tracked path does for it could matter: checked here once for the run, per
        # message below (see the docstring).
        quiet = hooks.quiet
        taking = (
            sends
            and quiet is not None
            and not remember_ids  # (the door's own ids: no other delivery shares one)
            and self.index is None
            and opts.request_acknowledge
            and not (timeout or wait or opts.acknowledge_timeout or opts.retain)
            and not (hooks.end_send or hooks.dequeued)
            # (no consumer acknowledges by taking: nothing to look at per message; the
            # consumers and their modes do not change within a run)
            and any(name in c.auto_acked for c in channel.consumer_list)
        )
        quiet_headers: Headers | None = None  # the block the quiet test was asked about
        quiet_answer = False  # (its answer: valid while only AUTO deliveries were made)
        hide = opts.hide_client_names
        rotates = type(strategy) is RoundRobin
        used = self.used
        k = start
        ks = iter(range(start, end))  # (the single consumer's loop below takes some of them)
        if not remember_ids:  # the numbers given below extend the stretch of unique ids
            if self.unique_to != self.sequence:  # (broken since the last such run)
                self.unique_from = self.sequence + 1
            self.unique_to = _OPEN  # (up to the end of this run: a drain within it sees it)
        try:
            for k in ks:
                message = ms[k]
                if message.wire is not None:
                    message = message.replace()  # octets come only from the door
                if size_limit and len(message.payload) > size_limit:
                    return k - start, ResultCode.LIMIT_EXCEEDED
                if (count_limit or broker_limit) and (
                    (count_limit and messages.n_priority + messages.n_regular >= count_limit)
                    or (broker_limit and messages.n_priority + messages.n_regular >= broker_limit)
                ):
                    return k - start, ResultCode.LIMIT_EXCEEDED
                mid = message.message_id
                keep_id = remember and bool(mid)
                if not mid and needs_id:
                    mid = self.host.new_id()
                if (  # (derive's test without its call: the door's messages pass it)
                    mid != message.message_id
                    or sid != message.source
                    or qid != message.content_type
                    or message.wants_ack
                    or name != message.target
                ):
                    message = derive(message, False, qid, mid, sid, name, message.headers)
                # (_numbered without its call: numbered, counted, in the browse index;
                # an AUTO delivery's queue message is made only if it is needed)
                self.sequence = seq = self.sequence + 1
                m: QueueMessage | None = None
                if not taking:
                    m = QueueMessage(seq, message, sender, False, now)
                    if self.index is not None:
                        self.index.add(m)
                self.received += 1
                self.last_received = now
                if message.headers is asked:  # (by_headers: its answer for this block)
                    d = answer
                else:
                    if m is None:
                        m = QueueMessage(seq, message, sender, False, now)
                    try:
                        d = received(self, m, sender)
                        if by_headers:
                            asked, answer = message.headers, d
                    except Exception as exc:
                        self.error("received_from_producer", exc)
                        d = Decision(allow=False, send_ack=AckWhen.NEGATIVE)
                if taking and d is ALLOW:
                    consumers = channel.consumer_list
                    n = len(consumers)
                    c: Client | None = None
                    turn = 0
                    if n and not (messages.n_priority or messages.n_regular or messages.front):
                        if n == 1:
                            c = consumers[0]
                        elif rotates:  # (Push: a copy each, tracked)
                            c, turn = _next_in_turn(consumers, self.rr, used, name, self.window)
                    if c is not None and name in c.auto_acked:
                        cid = c.id
                        u = used.get(cid, 0)
                        headers = message.headers
                        if headers is not quiet_headers:  # (asked once per block)
                            quiet_headers = headers
                            try:
                                quiet_answer = bool(quiet(headers))  # type: ignore[misc]
                            except Exception:
                                quiet_answer = False  # (the tracked send counts it)
                        if (
                            quiet_answer
                            and u < (c.prefetch.get(name) or self.window)
                            # (a delivery of its id still unacknowledged by c: a TMQP
                            # producer's message that took the id first; tracked, held)
                            and not (pending and (cid, mid) in pending)
                        ):
                            # (what out_message makes of it: the acknowledge wished)
                            if n == 1 and by_headers and c.auto_runs:
                                more = self._send_auto_run(ms, k, end, c, message, seq, out)
                                if rotates:
                                    self.rr = turn
                                if more:  # (those taken: the loop goes on after them)
                                    next(islice(ks, more, more), None)
                                continue
                            frame = _new_message(
                                Message,
                                (
                                    mid,
                                    "" if hide else message.source,
                                    name,
                                    qid,
                                    message.high_priority,
                                    message.first_acquirer,
                                    True,
                                    message.ttl,
                                    message.headers,
                                    message.payload,
                                    None,
                                ),
                            )
                            out.append(_tracked(Tracked, (cid, frame)))
                            c.unsent.append((AUTO, self, None, message, seq))
                            used[cid] = u + 1
                            self.auto_in_flight += 1
                            if rotates:
                                self.rr = turn  # (choose_one's move past the one chosen)
                            continue
                quiet_headers = None  # (the tracked path below may change the answer)
                if m is None:
                    m = QueueMessage(seq, message, sender, False, now)
                if d is not ALLOW and not self._decided(m, d, out):
                    continue  # (dropped: taken, as accept returning None)
                if keep_id:
                    recent.add(mid, now, window)
                dispatch.fresh, dispatch.fresh_message = m, message
                try:
                    if not sends:
                        admit(self, m, now, out)
                    else:
                        if timeout:
                            tracker.start_timeout(m, now)
                        consumers = channel.consumer_list
                        if (
                            consumers
                            and not (messages.n_priority or messages.n_regular or messages.front)
                            and not (wait and (tracker.pending or self.auto_in_flight))
                        ):
                            send(m, consumers, now, out)
                        else:
                            self.enqueue(m)
                            if not self.stalled or m.high_priority:
                                self.drain(now, out)
                finally:
                    dispatch.fresh = dispatch.fresh_message = None
                if self.unsaved != unsaved:
                    return k - start + 1, 0
        except Exception as exc:
            return k - start, exc  # (the caller counts it: the push that raised is refused)
        finally:
            if not remember_ids:
                self.unique_to = self.sequence
        return end - start, 0

    def _auto_stretch(
        self, ms: Sequence[Message], start: int, stop: int, previous: Message, cid: str
    ) -> int:
        """Where the messages that may follow ``previous`` (an AUTO delivery to the
        queue's single consumer just made) as AUTO deliveries end, from ``start`` on and
        before ``stop`` (the consumer's room read by the caller).

        The outer loop's steps for each, with what cannot change between two AUTO
        deliveries read once: the limits on messages held (nothing was queued), the one
        consumer and its mode, the round-robin position, the handler's answers for the
        header block (``received_by_headers``: the block's ALLOW, and its quiet test's
        True) and the consumer's room.  Per message: its header block is ``previous``'s
        (the same object), the door's own (no octets, an id, the sender, this queue,
        no acknowledge wish), within the size limit, its id not that of a delivery to
        ``cid`` still unacknowledged (a TMQP producer's message that took it first).  The
        first that is not goes back to the outer loop, which decides it as before."""
        if stop <= start:
            return start
        pending = self.tracker.pending
        name = self.channel.name
        headers = previous.headers
        sid = previous.source
        qid = self.id
        size_limit = self.options.message_size_limit
        if (
            ms.__class__ is PlainSends
            and not pending  # (else each id is looked up below)
            and ms.headers is headers
            and ms.source == sid
            and ms.queue_id == qid
            and ms.target == name
        ):  # the door's run: alike by construction, only the sizes to read
            bodies = ms.bodies
            if not size_limit or max(map(len, bodies[start:stop])) <= size_limit:
                return stop
            k = start
            for body in islice(bodies, start, stop):
                if len(body) > size_limit:
                    break
                k += 1
            return k
        k = start
        for message in islice(ms, start, stop):
            mid, source, target, ctype, _, _, wants, _, hs, payload, wire = message
            if (
                hs is not headers
                or wire is not None
                or not mid
                or wants
                or source != sid
                or ctype != qid
                or target != name
                or (size_limit and len(payload) > size_limit)
                or (pending and (cid, mid) in pending)
            ):
                break
            k += 1
        return k

    def _send_auto_run(
        self,
        ms: Sequence[Message],
        k: int,
        end: int,
        c: Client,
        message: Message,
        seq: int,
        out: list[Outgoing],
    ) -> int:
        """:meth:`accept_many`'s AUTO delivery of ``message`` (``ms[k]`` as taken in,
        number ``seq``, counted received) to the queue's single consumer ``c``, and the
        ones that may follow it (:meth:`_auto_stretch`), as ONE item: an
        :class:`~broker.protocol.AutoRun` in ``out`` and one
        :data:`~broker.engine.flow.AUTO_RUN` entry in ``c.unsent``, nothing made per
        delivery.  Counted as their AUTO deliveries are.  Returns how many of
        ``ms[k + 1:end]`` went with it."""
        name = self.channel.name
        cid = c.id
        used = self.used
        u = used.get(cid, 0) + 1
        room = (c.prefetch.get(name) or self.window) - u
        stop = self._auto_stretch(ms, k + 1, min(end, k + 1 + room), message, cid)
        first = ms[k]  # (of the door's PlainSends: a new tuple, equal to the one taken)
        same = message is first or (ms.__class__ is PlainSends and message == first)
        messages = ms[k:stop] if same else [message, *ms[k + 1 : stop]]
        source = "" if self.options.hide_client_names else message.source
        run = _new_run(DeliveredRun, (messages, source, name, self.id, message.headers))
        out.append(_tracked(AutoRun, (cid, run)))
        c.unsent.append((AUTO_RUN, self, None, messages, seq))
        more = stop - k - 1
        c.unsent_extra += more
        used[cid] = u + more
        self.auto_in_flight += 1 + more
        if more:
            self.sequence = seq + more
            self.received += more
        return more

    def _numbered(
        self, message: Message, sender: Client | None, producer_waits: bool, now: float
    ) -> QueueMessage:
        """A pushed message taken in: numbered, counted, in the browse index."""
        self.sequence += 1
        m = QueueMessage(self.sequence, message, sender, producer_waits, now)
        if self.index is not None:
            self.index.add(m)
        self.received += 1
        self.last_received = now
        return m

    def _decided(self, m: QueueMessage, d: Decision, out: list[Outgoing]) -> bool:
        """What the handler decided for a push other than a plain ALLOW (save, answer
        the producer, drop): False when ``m`` was dropped."""
        if d.save:
            self.save(m)
            if not m.saved and d.send_ack is AckWhen.IF_SAVED:
                # the store refused it: a negative ack, not silence (ledger docstring)
                self.ack_producer(m, AckWhen.NEGATIVE, out, NackReason.FAILED)
        if d.send_ack is not AckWhen.NONE:
            self.ack_producer(m, d.send_ack, out, NackReason.UNACCEPTABLE)
        if not d.allow and d.put_back is PutBack.NO:
            self.drop(m, out, NackReason.UNACCEPTABLE)
            return False
        return True

    def remember_id(self, message_id: str, now: float) -> None:
        """A message recovered after a restart: its id counts for duplicate suppression."""
        opts = self.options
        if message_id and opts.use_message_id and opts.duplicate_window:
            self.recent.add(message_id, now, opts.duplicate_window)

    def duplicate(
        self,
        message_id: str,
        sender: Client | None,
        producer_waits: bool,
        now: float,
        out: list[Outgoing],
    ) -> bool:
        """Is this push a duplicate of a message id the queue took within its window
        (``dedupe``)?  Then it is answered as done (a positive acknowledge to a producer
        that waits for one) and must not be accepted."""
        opts = self.options
        if not (message_id and opts.use_message_id and opts.duplicate_window):
            return False
        if not self.recent.seen(message_id, now, opts.duplicate_window_time):
            return False
        if self.store.failed:  # (the push taken first may never have been saved: the
            return False  # retry is taken again and the store refuses it aloud)
        self.duplicates += 1
        if producer_waits and sender is not None and self.client(sender.id) is sender:
            frame = ack_frame(self.id, message_id, "", self.channel.name)
            out.append(Outgoing(sender.id, frame))
        return True

    # ------------------------------------------------------------------ pull

    def pull(
        self, client: Client, request: Message, now: float, out: list[Outgoing], max_count: int
    ) -> None:
        """Answer a pull request from a consumer of the channel (checks done by the caller)."""
        self.strategy.pull(self, client, request, now, out, max_count)

    def pull_messages(
        self, client: Client, request: Message, now: float, out: list[Outgoing], limit: int
    ) -> None:
        """Pull status: up to ``Count`` messages leave the queue (``pull``)."""
        pull.pull_messages(self, client, request, now, out, limit)

    def pull_latest(self, client: Client, request: Message, out: list[Outgoing]) -> None:
        """Cache status: the latest message, which stays in the queue (``pull``)."""
        pull.pull_latest(self, client, request, out)

    def refuse_pull(self, client: Client, request: Message, out: list[Outgoing]) -> None:
        """A status without pull: Unacceptable and End markers (``pull``)."""
        pull.refuse_pull(self, client, request, out)
