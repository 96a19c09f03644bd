"""An in-memory reference :class:`~broker.stomp.backend.Backend` (no persistence).

It exists so the listener can be run and tested against real STOMP clients before the
broker engine grows its typed operations; it follows the backend contract exactly.

Semantics:

* Queues (``/queue/``, ``/temp-queue/``, ``/dsub/``) keep messages in sequence order
  (sequences count from 1 per queue) until a consumer settles them.  Each message goes
  to one consumer, round-robin over consumers with credit and an accepting connection;
  an ``exclusive`` consumer, while one is attached, gets everything (the earliest one;
  the next takes over when it leaves); a ``message_group`` sticks to one consumer,
  chosen by rendezvous (consistent) hashing with xxhash; when a consumer joins, groups
  with nothing unacknowledged are re-hashed over the new set.  Unacknowledged
  messages go back (``redeliveries + 1``, at their place in sequence order) on NACK,
  UNSUBSCRIBE or disconnect.  ``from-seq`` limits a consumer to sequences ``>= N``
  (``-1``: only messages arriving after it subscribed); ``include-seq`` is served.
* Browsers (``browser:true``) read without consuming, from ``from-seq`` (default the
  head), then get the ``browser:end`` marker unless ``browser-end:false`` keeps them
  listening for new messages.
* Topics fan out to every matching subscription present (a copy that meets no credit
  or a full connection is dropped) and to durable subscriptions (a queue per
  ``persistent:true`` id, global to the backend, fed by its topic destinations).
  ``retain:set`` keeps the last message of a topic for new subscribers;
  ``retain:remove`` forgets it.
* Expired messages (``expires`` in the past, wall clock ms) are dropped when met.
* Temporary destinations are deleted when their connection detaches; wildcard
  subscriptions never match another connection's temporary destinations.
* Limits: ``max_queue_messages`` per queue (a SEND beyond it is refused with an ERROR;
  nothing accepted is dropped) and ``max_destinations`` queues + topics.
* Selectors filter what a subscription is offered (queue messages a consumer's selector
  refuses stay for others; a browser skips them).
* Not honoured (accepted, ignored): ``persistent`` on SEND -- nothing survives a
  restart here.
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import xxhash

from broker.stomp.backend import ConnectionInfo, Delivery, DeliverySink
from broker.stomp.destinations import Destination, DestinationKind, temp_owner
from broker.stomp.errors import BackendError
from broker.stomp.subscription import AckMode, PublishSpec, RetainAction, SubscriptionSpec

#: Messages one queue may hold (ready + unacknowledged).
DEFAULT_MAX_QUEUE_MESSAGES = 100_000
#: Queues + topics the backend may hold.
DEFAULT_MAX_DESTINATIONS = 10_000


@dataclass(frozen=True, slots=True)
class _Message:
    id: str
    destination: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    timestamp_ms: int
    sender: str
    expires: int | None = None
    group: str | None = None
    seq: int | None = None
    redeliveries: int = 0


@dataclass(eq=False, slots=True)
class _Sub:
    conn: _Conn
    spec: SubscriptionSpec
    count: int  # credit windows (see the manual: a message goes while either is > 0)
    size: int
    min_seq: dict[str, int] = field(default_factory=dict)  # queue name -> first sequence
    browse_cursor: dict[str, int] = field(default_factory=dict)
    queues: list[_Queue] = field(default_factory=list)
    durable: _Queue | None = None

    @property
    def has_credit(self) -> bool:
        return self.spec.ack is AckMode.AUTO or self.count > 0 or self.size > 0

    @property
    def key(self) -> str:
        return f"{self.conn.info.id}/{self.spec.id}"


@dataclass(eq=False, slots=True)
class _Conn:
    info: ConnectionInfo
    sink: DeliverySink
    paused: bool = False
    tags: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    subs: dict[str, _Sub] = field(default_factory=dict)
    unacked: dict[int, _Unacked] = field(default_factory=dict)


@dataclass(slots=True)
class _Unacked:
    sub: _Sub
    queue: _Queue | None  # None: a topic copy or a browser read (nothing to consume)
    message: _Message
    credit_returned: bool = False  # by a transactional ACK (Backend.credit)


@dataclass(eq=False, slots=True)
class _Queue:
    kind: DestinationKind
    name: str
    messages: dict[int, _Message] = field(default_factory=dict)  # every unconsumed one
    ready: deque[int] = field(default_factory=deque)  # sorted sequences not in flight
    next_seq: int = 1
    consumers: list[_Sub] = field(default_factory=list)
    browsers: list[_Sub] = field(default_factory=list)
    rr: int = 0
    groups: dict[str, _Sub] = field(default_factory=dict)
    group_in_flight: dict[str, int] = field(default_factory=dict)
    topics: tuple[Destination, ...] = ()  # a durable subscription's topic destinations

    @property
    def stomp(self) -> str:
        prefix = "/dsub/" if self.kind is DestinationKind.DSUB else "/queue/"
        return prefix + self.name


class MemoryBackend:
    def __init__(
        self,
        *,
        max_queue_messages: int = DEFAULT_MAX_QUEUE_MESSAGES,
        max_destinations: int = DEFAULT_MAX_DESTINATIONS,
        broker_id: str = "default",
        wall_clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.max_queue_messages = max_queue_messages
        self.max_destinations = max_destinations
        self.broker_id = broker_id
        self.wall_clock_ms = wall_clock_ms
        self._conns: dict[int, _Conn] = {}
        self._queues: dict[str, _Queue] = {}
        self._dsubs: dict[str, _Queue] = {}
        self._topics: set[str] = set()
        self._retained: dict[str, _Message] = {}
        self._topic_subs: list[_Sub] = []
        self._pattern_subs: list[_Sub] = []  # queue subscriptions with wildcards
        self._ids = itertools.count(1)

    # -- public views (tests, admin) -----------------------------------------------------

    def queue_depth(self, name: str) -> int:
        """Unconsumed messages of queue ``name`` (ready + unacknowledged)."""
        queue = self._queues.get(name)
        return len(queue.messages) if queue else 0

    def durable_depth(self, sub_id: str) -> int | None:
        queue = self._dsubs.get(sub_id)
        return len(queue.messages) if queue else None

    @property
    def connections(self) -> int:
        return len(self._conns)

    def destination_names(self) -> set[str]:
        return set(self._queues) | self._topics

    # -- Backend --------------------------------------------------------------------------

    def attach(self, connection: ConnectionInfo, sink: DeliverySink) -> None:
        self._conns[connection.id] = _Conn(connection, sink)

    def detach(self, connection_id: int) -> None:
        conn = self._conns.pop(connection_id, None)
        if conn is None:
            return
        for sub_id in list(conn.subs):
            self._drop_sub(conn, sub_id)
        owner = (self.broker_id, connection_id)
        for name in [n for n in self._queues if temp_owner(n) == owner]:
            self._delete_queue(name)
        for name in [n for n in self._topics if temp_owner(n) == owner]:
            self._topics.discard(name)
            self._retained.pop(name, None)
        self._pump_all()

    def publish(self, connection_id: int, spec: PublishSpec) -> None:
        conn = self._conn(connection_id)
        for destination in spec.destinations:
            if destination.kind is DestinationKind.QUEUE:
                queue = self._queue(destination.name)
                if len(queue.messages) >= self.max_queue_messages:
                    raise BackendError(f"queue {destination.name!r} is full")
            elif destination.kind is DestinationKind.DSUB and destination.name not in self._dsubs:
                raise BackendError(f"no durable subscription {destination.name!r}")
        now = self.wall_clock_ms()
        for destination in spec.destinations:
            message = _Message(
                id=f"{self.broker_id}-{next(self._ids)}",
                destination=destination.stomp,
                headers=spec.headers,
                body=spec.body,
                timestamp_ms=now,
                sender=conn.info.user,
                expires=spec.expires,
                group=spec.message_group,
            )
            if destination.kind is DestinationKind.TOPIC:
                self._publish_topic(destination.name, message, spec.retain)
            elif destination.kind is DestinationKind.QUEUE:
                self._enqueue(self._queue(destination.name), message)
            else:
                self._enqueue(self._dsubs[destination.name], message)

    def subscribe(self, connection_id: int, spec: SubscriptionSpec) -> None:
        conn = self._conn(connection_id)
        sub = _Sub(conn, spec, spec.credit.count, spec.credit.size)
        conn.subs[spec.id] = sub
        try:
            self._attach(sub)
        except BackendError:
            self._drop_sub(conn, spec.id)  # nothing half-attached stays behind
            raise
        for queue in list(sub.queues):
            if spec.browser:
                self._browse(queue, sub)
            else:
                self._pump(queue)

    def _attach(self, sub: _Sub) -> None:
        if sub.spec.persistent:
            self._subscribe_durable(sub)
            return
        for destination in sub.spec.destinations:
            if destination.kind is DestinationKind.DSUB:
                queue = self._dsubs.get(destination.name)
                if queue is None:
                    raise BackendError(f"no durable subscription {destination.name!r}")
                self._attach_queue(sub, queue)
            elif destination.kind is DestinationKind.QUEUE and destination.wildcard:
                if sub not in self._pattern_subs:
                    self._pattern_subs.append(sub)
                for queue in list(self._queues.values()):
                    if self._visible(sub, destination, queue.name):
                        self._attach_queue(sub, queue)
            elif destination.kind is DestinationKind.QUEUE:
                self._attach_queue(sub, self._queue(destination.name))
            elif sub not in self._topic_subs:
                self._topic_subs.append(sub)
                self._send_retained(sub)

    def unsubscribe(self, connection_id: int, subscription_id: str, *, destroy: bool) -> None:
        conn = self._conn(connection_id)
        sub = conn.subs.get(subscription_id)
        if sub is not None:
            self._drop_sub(conn, subscription_id)
        if destroy:
            queue = self._dsubs.pop(subscription_id, None)
            if queue is None and sub is None:
                raise BackendError(f"no durable subscription {subscription_id!r}")
            if queue is not None:
                for consumer in list(queue.consumers):
                    self._drop_sub(consumer.conn, consumer.spec.id)
        self._pump_all()

    def ack(self, connection_id: int, tags: Sequence[int]) -> None:
        self._settle(connection_id, tags, consume=True)

    def nack(self, connection_id: int, tags: Sequence[int]) -> None:
        self._settle(connection_id, tags, consume=False)

    def credit(self, connection_id: int, tags: Sequence[int]) -> None:
        conn = self._conns.get(connection_id)
        if conn is None:
            return
        for tag in tags:
            entry = conn.unacked.get(tag)
            if entry is not None and not entry.credit_returned:
                entry.credit_returned = True
                self._return_credit(entry)
        self._pump_connection(conn)

    def resume(self, connection_id: int) -> None:
        conn = self._conns.get(connection_id)
        if conn is None or not conn.paused:
            return
        conn.paused = False
        self._pump_connection(conn)

    def _pump_connection(self, conn: _Conn) -> None:
        """Offer again to every subscription of ``conn`` (room or credit came back)."""
        for sub in list(conn.subs.values()):
            for queue in list(sub.queues):
                if sub.spec.browser:
                    self._browse(queue, sub)
                else:
                    self._pump(queue)

    # -- queues ---------------------------------------------------------------------------

    def _conn(self, connection_id: int) -> _Conn:
        conn = self._conns.get(connection_id)
        if conn is None:
            raise BackendError("connection is not attached")
        return conn

    def _queue(self, name: str) -> _Queue:
        queue = self._queues.get(name)
        if queue is None:
            self._check_room()
            queue = _Queue(DestinationKind.QUEUE, name)
            self._queues[name] = queue
            for sub in self._pattern_subs:
                for destination in sub.spec.destinations:
                    if destination.wildcard and self._visible(sub, destination, name):
                        self._attach_queue(sub, queue)
                        break
        return queue

    def _check_room(self) -> None:
        if len(self._queues) + len(self._topics) >= self.max_destinations:
            raise BackendError(f"too many destinations (max {self.max_destinations})")

    def _visible(self, sub: _Sub, destination: Destination, name: str) -> bool:
        owner = temp_owner(name)
        if owner is not None and owner != (self.broker_id, sub.conn.info.id):
            return False
        return destination.matches(DestinationKind.QUEUE, name)

    def _attach_queue(self, sub: _Sub, queue: _Queue) -> None:
        if queue in sub.queues:
            return
        sub.queues.append(queue)
        from_seq = sub.spec.from_seq
        if from_seq == -1:
            sub.min_seq[queue.name] = queue.next_seq
        elif from_seq is not None:
            sub.min_seq[queue.name] = from_seq
        if sub.spec.browser:
            sub.browse_cursor[queue.name] = sub.min_seq.get(queue.name, 0)
            queue.browsers.append(sub)
            return
        queue.consumers.append(sub)
        self._rebalance_groups(queue)

    def _rebalance_groups(self, queue: _Queue) -> None:
        """A consumer joined: groups with nothing in flight are hashed again."""
        for group in [g for g, sub in queue.groups.items() if not queue.group_in_flight.get(g)]:
            del queue.groups[group]

    def _delete_queue(self, name: str) -> None:
        queue = self._queues.pop(name, None)
        if queue is None:
            return
        for sub in queue.consumers + queue.browsers:
            if queue in sub.queues:
                sub.queues.remove(queue)

    def _enqueue(self, queue: _Queue, message: _Message) -> None:
        seq = queue.next_seq
        queue.next_seq += 1
        message = replace(message, seq=seq)
        queue.messages[seq] = message
        queue.ready.append(seq)
        for browser in list(queue.browsers):
            self._browse(queue, browser, newest=message)
        self._pump(queue)

    def _expired(self, message: _Message) -> bool:
        return message.expires is not None and message.expires <= self.wall_clock_ms()

    def _pump(self, queue: _Queue) -> None:
        """Hand ready messages to consumers, in sequence order, while any can take one.

        Messages no consumer may take now (a busy group owner, a ``from-seq`` above them)
        are put back at the head, in order; the walk stops when no consumer can take
        anything, so a pump costs what it delivers plus what it skips.
        """
        if not queue.consumers:
            return
        ready = queue.ready
        skipped: list[int] = []
        while ready:
            seq = ready[0]
            message = queue.messages.get(seq)
            if message is None or self._expired(message):
                ready.popleft()
                queue.messages.pop(seq, None)
                continue
            sub = self._choose(queue, message)
            if sub is None and not any(self._can_take(c) for c in queue.consumers):
                break
            skipped.append(ready.popleft())
            if sub is not None and self._offer(sub, queue, message):
                skipped.pop()
        ready.extendleft(reversed(skipped))

    def _can_take(self, sub: _Sub) -> bool:
        return sub.has_credit and not sub.conn.paused

    def _choose(self, queue: _Queue, message: _Message) -> _Sub | None:
        assert message.seq is not None
        candidates = [
            c
            for c in queue.consumers
            if self._can_take(c)
            and message.seq >= c.min_seq.get(queue.name, 0)
            and _selected(c, message)
        ]
        exclusive = [c for c in queue.consumers if c.spec.exclusive]
        if exclusive:
            return exclusive[0] if exclusive[0] in candidates else None
        if message.group is not None:
            owner = queue.groups.get(message.group)
            if owner is None or owner not in queue.consumers:
                owner = max(
                    queue.consumers,
                    key=lambda c: xxhash.xxh64_intdigest(f"{message.group}\0{c.key}".encode()),
                )
                queue.groups[message.group] = owner
            return owner if owner in candidates else None
        if not candidates:
            return None
        queue.rr = (queue.rr + 1) % len(candidates)
        return candidates[queue.rr]

    def _browse(self, queue: _Queue, sub: _Sub, newest: _Message | None = None) -> None:
        cursor = sub.browse_cursor.get(queue.name, 0)
        if newest is not None and newest.seq == cursor:  # caught up: just the new one
            if not _selected(sub, newest) or (
                self._can_take(sub) and self._offer(sub, None, newest)
            ):
                sub.browse_cursor[queue.name] = cursor + 1
            return
        for seq in sorted(s for s in queue.messages if s >= cursor):
            message = queue.messages[seq]
            if self._expired(message) or not _selected(sub, message):
                sub.browse_cursor[queue.name] = seq + 1
                continue
            if not self._can_take(sub) or not self._offer(sub, None, message):
                return  # resumed from the cursor later
            sub.browse_cursor[queue.name] = seq + 1
        if sub.spec.browser_end and sub in queue.browsers:
            queue.browsers.remove(sub)  # the browse is over: the end marker, then nothing
            self._offer(sub, None, None, browse_end=True)

    # -- topics ---------------------------------------------------------------------------

    def _publish_topic(self, name: str, message: _Message, retain: RetainAction | None) -> None:
        if name not in self._topics:
            self._check_room()
            self._topics.add(name)
        if retain is RetainAction.SET:
            self._retained[name] = message
        elif retain is RetainAction.REMOVE:
            self._retained.pop(name, None)
        for sub in list(self._topic_subs):
            matched = any(self._topic_match(sub, d, name) for d in sub.spec.destinations)
            if matched and self._can_take(sub) and _selected(sub, message):
                self._offer(sub, None, message)
        for queue in list(self._dsubs.values()):
            matched = any(d.matches(DestinationKind.TOPIC, name) for d in queue.topics)
            if matched and len(queue.messages) < self.max_queue_messages:
                self._enqueue(queue, message)

    def _topic_match(self, sub: _Sub, destination: Destination, name: str) -> bool:
        owner = temp_owner(name)
        if owner is not None and owner != (self.broker_id, sub.conn.info.id):
            return False
        return destination.matches(DestinationKind.TOPIC, name)

    def _send_retained(self, sub: _Sub) -> None:
        for name, message in list(self._retained.items()):
            matched = any(self._topic_match(sub, d, name) for d in sub.spec.destinations)
            if matched and _selected(sub, message):
                self._offer(sub, None, message)

    def _subscribe_durable(self, sub: _Sub) -> None:
        topics = tuple(d for d in sub.spec.destinations if d.kind is DestinationKind.TOPIC)
        queue = self._dsubs.get(sub.spec.id)
        if queue is None:
            if not topics:
                raise BackendError("a durable subscription needs /topic/ destinations")
            queue = _Queue(DestinationKind.DSUB, sub.spec.id, topics=topics)
            self._dsubs[sub.spec.id] = queue
        elif topics:
            queue.topics = topics  # a new destination updates the subscription
        sub.durable = queue
        self._attach_queue(sub, queue)

    # -- delivery and settlement ----------------------------------------------------------

    def _offer(
        self,
        sub: _Sub,
        queue: _Queue | None,
        message: _Message | None,
        *,
        browse_end: bool = False,
    ) -> bool:
        conn = sub.conn
        if conn.paused:
            return False
        tag = next(conn.tags)
        if message is None:
            delivery = Delivery(sub.spec.id, tag, "", "", (), b"", browse_end=browse_end)
            return conn.sink(delivery)
        delivery = Delivery(
            subscription=sub.spec.id,
            tag=tag,
            message_id=message.id,
            destination=message.destination,
            headers=message.headers,
            body=message.body,
            redeliveries=message.redeliveries,
            sequence=message.seq if queue is not None or sub.spec.browser else None,
            timestamp_ms=message.timestamp_ms,
            sender=message.sender,
        )
        if not conn.sink(delivery):
            conn.paused = True
            return False
        if sub.spec.ack is AckMode.AUTO:
            if queue is not None:
                self._consume(queue, message)
            return True
        sub.count -= 1
        sub.size -= len(message.body)
        conn.unacked[tag] = _Unacked(sub, queue, message)
        if queue is not None and message.group is not None:
            queue.group_in_flight[message.group] = queue.group_in_flight.get(message.group, 0) + 1
        return True

    def _consume(self, queue: _Queue, message: _Message) -> None:
        assert message.seq is not None
        queue.messages.pop(message.seq, None)

    def _settle(self, connection_id: int, tags: Sequence[int], *, consume: bool) -> None:
        conn = self._conns.get(connection_id)
        if conn is None:
            return
        touched: dict[int, _Queue] = {}
        for tag in tags:
            entry = conn.unacked.pop(tag, None)
            if entry is None:
                continue
            if not entry.credit_returned:
                self._return_credit(entry)
            if entry.queue is None:
                continue
            self._release_group(entry.queue, entry.message)
            if consume:
                self._consume(entry.queue, entry.message)
            else:
                self._requeue(entry.queue, entry.message)
            touched[id(entry.queue)] = entry.queue
        for sub in conn.subs.values():
            for queue in sub.queues:
                touched[id(queue)] = queue
        for queue in touched.values():
            self._pump(queue)
        for sub in conn.subs.values():
            if sub.spec.browser:
                for queue in sub.queues:
                    self._browse(queue, sub)

    @staticmethod
    def _return_credit(entry: _Unacked) -> None:
        entry.sub.count += 1
        entry.sub.size += len(entry.message.body)

    def _release_group(self, queue: _Queue, message: _Message) -> None:
        if message.group is None:
            return
        left = queue.group_in_flight.get(message.group, 0) - 1
        if left > 0:
            queue.group_in_flight[message.group] = left
        else:
            queue.group_in_flight.pop(message.group, None)

    def _requeue(self, queue: _Queue, message: _Message) -> None:
        assert message.seq is not None
        if message.seq not in queue.messages:
            return
        queue.messages[message.seq] = replace(message, redeliveries=message.redeliveries + 1)
        bisect.insort(queue.ready, message.seq)  # rare (NACK, disconnect): O(n) is fine

    def _drop_sub(self, conn: _Conn, sub_id: str) -> None:
        sub = conn.subs.pop(sub_id, None)
        if sub is None:
            return
        for tag, entry in list(conn.unacked.items()):
            if entry.sub is sub:
                del conn.unacked[tag]
                if entry.queue is not None:
                    self._release_group(entry.queue, entry.message)
                    self._requeue(entry.queue, entry.message)
        for queue in sub.queues:
            if sub in queue.consumers:
                queue.consumers.remove(sub)
            if sub in queue.browsers:
                queue.browsers.remove(sub)
            for group in [g for g, owner in queue.groups.items() if owner is sub]:
                del queue.groups[group]
        if sub in self._topic_subs:
            self._topic_subs.remove(sub)
        if sub in self._pattern_subs:
            self._pattern_subs.remove(sub)

    def _pump_all(self) -> None:
        for queue in list(self._queues.values()) + list(self._dsubs.values()):
            self._pump(queue)


def _selected(sub: _Sub, message: _Message) -> bool:
    selector = sub.spec.selector
    if selector is None:
        return True
    headers: dict[str, str] = {}
    for name, value in message.headers:
        headers.setdefault(name, value)
    return selector.matches(headers)
