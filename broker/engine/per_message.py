"""Per-message delivery rules: a message's own headers, exclusive consumers, owned channels.

The queue options decide for every message of a queue; some producers (STOMP's
``persistent:true``, ``expires``) decide per message.  :class:`PerMessageRules` holds
these rules (sans-IO, no engine decisions here);
:class:`~broker.engine.delivery.PerMessageDeliveryHandler` keeps the default handler's
at-least-once rules and applies these, read from the message's headers (names compared
without case):

* ``persistent: true`` -- the message is saved in the engine's store when received (a
  queue without consumer acknowledges then acknowledges its producer once it is saved;
  with acknowledges the consumer's acknowledge is relayed as usual).  Any other value,
  or no header: not saved (as the default handler).
* ``expires: MS`` (milliseconds since the UNIX epoch) -- a message whose time has come
  is not sent: it is dropped when the queue reaches it (its producer, if it still waits,
  gets a negative acknowledge).  A value that is not a non-negative integer is ignored.

* ``message_group: NAME`` -- every message of a group goes to one consumer of the
  channel at a time: the consumer chosen by rendezvous (consistent) hashing with xxhash
  of the group name over the channel's consumers.  While a group has messages in flight
  (sent, not acknowledged) it stays with their consumer; once none are, it is hashed
  again over the consumers present -- so a consumer that joins takes over its share of
  the groups as soon as their in-flight messages are acknowledged (the rebalancing the
  Apollo manual describes), and a consumer that leaves hands its groups on.

And one rule per consumer: an *exclusive* consumer (:meth:`set_exclusive`, STOMP's
``exclusive:true``) -- while one is a consumer of the channel, the earliest of them
gets every message; when it leaves, its unacknowledged messages go back and the next
exclusive one (or, if none is left, every consumer) takes over.

And one rule per channel: a channel with an *owner* (:meth:`set_owner`, a STOMP
temporary destination) delivers to that consumer only.

And two more per consumer of a channel, set by the front door:

* a *selector* (:meth:`set_selector`, STOMP's ``selector`` on a queue): the consumer is
  offered only the messages whose headers it matches.  A message that no consumer with
  room selects stays in the queue and the messages behind it still go to the consumers
  that select them (the queue *looks past* it, see ``Dispatcher.drain``: at most
  ``LOOK_PAST_LIMIT`` messages per pass; one that no consumer selects at all is set
  aside, so the next pass goes on behind it); it goes once a consumer that selects it
  comes.
* a *first sequence* (:meth:`set_from_seq`, STOMP's ``from-seq`` on a consuming queue
  subscription): the consumer is offered only messages numbered that or higher in the
  queue; the older ones are looked past as unselected ones are.
* *credit* windows (:meth:`set_credit`, STOMP's ``credit:count,size``): a
  :class:`Credit` (shared by the channels of one subscription) of messages and payload
  octets.  A delivery takes one message and its payload size from it; the consumer may
  receive while either window is above zero (the Apollo rule).  The delivery's
  acknowledge, negative acknowledge, time-out or its consumer leaving gives it back;
  :meth:`return_credit` gives it back earlier (STOMP's transactional ACK), and then its
  acknowledge gives back nothing more.  The front door drains the queue after that.

Memory: one entry per owned channel, per group with messages in flight, per exclusive
consumer, per consumer with a selector or credit, and per delivery charged to a credit.

Sans-IO: the wall clock (UNIX seconds) is injected; ``now`` is never read here.  Register
the handler with the engine under :data:`PER_MESSAGE` (``Engine(handlers={PER_MESSAGE:
...})``) and select it with the queue option ``MessageDeliveryHandler``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import xxhash

if TYPE_CHECKING:
    from broker.engine.channel import Client
    from broker.engine.message import Delivery, QueueMessage
    from broker.engine.queue_view import QueueView as Queue

#: The handler's key among the engine's delivery handlers.
PER_MESSAGE = "per-message"
#: The header naming a message's group.
GROUP = "message_group"


#: (``persistent: true``, ``expires`` in ms or None, ``message_group`` or None) of a
#: header block: the rules a message's headers hold, read in one pass (:func:`facts`).
Facts = tuple[bool, "int | None", "str | None"]
#: A message's header block (``broker.message.Headers``: a tuple, kept as the cache key).
HeaderBlock = tuple[tuple[str, str], ...]
_NO_FACTS: Facts = (False, None, None)
#: Header blocks whose facts :class:`PerMessageRules` keeps (the messages of a producer's
#: run share one: one pass per run, not five per message); past it, the cache restarts.
FACTS_KEPT = 256


def facts(headers: Sequence[tuple[str, str]]) -> Facts:
    """The rules ``headers`` hold (names compared without case; the first of a name counts;
    an ``expires`` that is not a non-negative integer of at most 20 digits is ignored)."""
    persistent: str | None = None
    expires: str | None = None
    group: str | None = None
    for key, value in headers:
        size = len(key)  # (the length first: the usual header is none of these)
        if size == 10 and persistent is None and key.lower() == "persistent":
            persistent = value
        elif size == 7 and expires is None and key.lower() == "expires":
            expires = value
        elif size == 13 and group is None and key.lower() == GROUP:
            group = value
    deadline = (
        int(expires)
        if expires is not None and expires.isascii() and expires.isdigit() and len(expires) <= 20
        else None
    )
    return (persistent is not None and persistent.lower() == "true", deadline, group)


class Credit:
    """A consumer's credit windows (messages, payload octets); see the module docstring."""

    __slots__ = ("count", "size")

    def __init__(self, count: int, size: int) -> None:
        self.count = count
        self.size = size

    @property
    def open(self) -> bool:
        return self.count > 0 or self.size > 0

    def __repr__(self) -> str:
        return f"Credit(count={self.count}, size={self.size})"


#: A consumer's selector: the message's headers in, "offer it" out.
Selects = Callable[[Sequence[tuple[str, str]]], bool]


def rendezvous(group: str, consumers: Sequence[str]) -> str:
    """The consumer (id) a group goes to: highest xxhash of ``consumer NUL group``."""
    key = group.encode()
    return max(consumers, key=lambda c: xxhash.xxh64_intdigest(c.encode() + b"\0" + key))


class PerMessageRules:
    """``persistent``, ``expires``, ``message_group`` read per message, exclusive
    consumers and owned channels (what the delivery handler asks)."""

    def __init__(self, wall_clock: Callable[[], float]) -> None:
        self.wall_clock = wall_clock  # UNIX seconds
        #: Messages found expired (``expires`` time come) when their queue reached them.
        self.expired_count = 0
        #: channel -> its exclusive consumers' ids, in the order they asked
        self._exclusive: dict[str, list[str]] = {}
        #: (channel, group) -> [consumer id, messages in flight] while any are
        self._groups: dict[tuple[str, str], list[Any]] = {}
        #: channel -> the only consumer id it may deliver to
        self._owners: dict[str, str] = {}
        #: channel -> consumer id -> its selector
        self._selectors: dict[str, dict[str, Selects]] = {}
        #: channel -> consumer id -> the first queue sequence it may receive
        self._from_seq: dict[str, dict[str, int]] = {}
        #: (channel, consumer id) -> its credit windows
        self._credits: dict[tuple[str, str], Credit] = {}
        #: (channel, consumer id, message id) -> the credit a delivery took, its size
        self._charged: dict[tuple[str, str, str], tuple[Credit, int]] = {}
        #: Bumped whenever a selector or first sequence is set or removed.
        self.selection = 0
        #: header block -> its facts (at most FACTS_KEPT; see :func:`facts`)
        self._facts: dict[tuple[tuple[str, str], ...], Facts] = {}
        #: The last header block looked up (the object itself, kept alive here) and its
        #: facts: a message is asked about up to five times in a row, and the messages of
        #: a STOMP run without user headers share one block (the door's stamp).
        self._last_headers: object = ()
        self._last_facts: Facts = _NO_FACTS

    def _facts_of(self, headers: HeaderBlock) -> Facts:
        """:func:`facts` of a message's headers, read once per header block."""
        if headers is self._last_headers:
            return self._last_facts
        if not headers:
            return _NO_FACTS
        found = self._facts.get(headers)
        if found is None:
            found = facts(headers)
            if len(self._facts) >= FACTS_KEPT:
                self._facts.clear()
            self._facts[headers] = found
        self._last_headers = headers
        self._last_facts = found
        return found

    # -- selectors and credit (the front door says who) ----------------------------------

    def set_selector(self, channel: str, client_id: str, selects: Selects | None) -> None:
        """Offer ``client_id`` only the messages of ``channel`` it ``selects`` (None: all)."""
        self.selection += 1
        chosen = self._selectors.setdefault(channel, {})
        if selects is None:
            chosen.pop(client_id, None)
        else:
            chosen[client_id] = selects
        if not chosen:
            del self._selectors[channel]

    def set_from_seq(self, channel: str, client_id: str, first: int | None) -> None:
        """Offer ``client_id`` only messages of ``channel`` numbered ``first`` or more."""
        self.selection += 1
        firsts = self._from_seq.setdefault(channel, {})
        if first is None:
            firsts.pop(client_id, None)
        else:
            firsts[client_id] = first
        if not firsts:
            del self._from_seq[channel]

    def set_credit(self, channel: str, client_id: str, credit: Credit | None) -> None:
        """Limit what ``client_id`` has in flight from ``channel`` (None: no limit here)."""
        if credit is None:
            self._credits.pop((channel, client_id), None)
            for key in [k for k in self._charged if k[0] == channel and k[1] == client_id]:
                del self._charged[key]
        else:
            self._credits[(channel, client_id)] = credit

    def forget(self, channel: str, client_id: str) -> None:
        """``client_id`` no longer consumes ``channel``: its selector, first sequence and
        credit there go (its exclusive mark stays: the front door that set it clears it)."""
        chosen = self._selectors.get(channel)
        if chosen is not None and client_id in chosen:
            self.set_selector(channel, client_id, None)
        firsts = self._from_seq.get(channel)
        if firsts is not None and client_id in firsts:
            self.set_from_seq(channel, client_id, None)
        if (channel, client_id) in self._credits:
            # its deliveries in flight there are no longer: what they took goes back to
            # the windows (one object may serve other channels of a STOMP subscription)
            for key in [k for k in self._charged if k[0] == channel and k[1] == client_id]:
                self.return_credit(channel, client_id, key[2])
            self.set_credit(channel, client_id, None)

    def return_credit(self, channel: str, client_id: str, message_id: str) -> bool:
        """Give back now the credit of a delivery still in flight (once); True if it had
        taken some."""
        entry = self._charged.pop((channel, client_id, message_id), None)
        if entry is None:
            return False
        credit, size = entry
        credit.count += 1
        credit.size += size
        return True

    def looks_past(self, channel: str) -> bool:
        """Do consumers of ``channel`` select messages (a message nobody selects must not
        hold up the others)?"""
        return channel in self._selectors or channel in self._from_seq

    def selects(self, channel: str, message: QueueMessage, client_id: str) -> bool:
        """Does ``client_id``'s selector and first sequence on ``channel`` take
        ``message`` (whatever its credit, group or exclusivity)?"""
        firsts = self._from_seq.get(channel)
        if firsts is not None:
            first = firsts.get(client_id)
            if first is not None and message.seq < first:
                return False
        chosen = self._selectors.get(channel)
        if chosen is not None:
            selects = chosen.get(client_id)
            if selects is not None and not selects(message.headers):
                return False
        return True

    def set_owner(self, channel: str, client_id: str | None) -> None:
        """Only ``client_id`` may receive from ``channel`` (None: anyone again)."""
        if client_id is None:
            self._owners.pop(channel, None)
        else:
            self._owners[channel] = client_id

    # -- exclusive consumers (the front door says who) -----------------------------------

    def set_exclusive(self, channel: str, client_id: str, exclusive: bool) -> None:
        """Mark (or unmark) ``client_id`` as an exclusive consumer of ``channel``."""
        ids = self._exclusive.setdefault(channel, [])
        if client_id in ids:
            ids.remove(client_id)
        if exclusive:
            ids.append(client_id)
        if not ids:
            del self._exclusive[channel]

    def group_owner(self, channel: str, group: str) -> str | None:
        """The consumer a group is held by while it has messages in flight."""
        entry = self._groups.get((channel, group))
        return None if entry is None else str(entry[0])

    def _candidates(self, queue: Queue) -> list[str]:
        consumers = [c.id for c in queue.channel.consumer_list]
        exclusive = self._exclusive.get(queue.channel.name)
        if exclusive:
            present = [c for c in exclusive if c in consumers]
            if present:
                return present[:1]
        return consumers

    def eligible(self, queue: Queue, message: QueueMessage, receiver: Client) -> bool:
        """May ``receiver`` take ``message`` (owner, exclusive consumer, group)?"""
        if self._owners:
            owner = self._owners.get(queue.channel.name)
            if owner is not None and owner != receiver.id:
                return False
        if self._credits:
            credit = self._credits.get((queue.channel.name, receiver.id))
            if credit is not None and not credit.open:
                return False
        if self._from_seq:
            firsts = self._from_seq.get(queue.channel.name)
            first = firsts.get(receiver.id) if firsts is not None else None
            if first is not None and message.seq < first:
                return False
        if self._selectors:
            chosen = self._selectors.get(queue.channel.name)
            selects = chosen.get(receiver.id) if chosen is not None else None
            if selects is not None and not selects(message.headers):
                return False
        known = message.headers is self._last_headers  # (_facts_of without its call)
        group = (self._last_facts if known else self._facts_of(message.headers))[2]
        if not self._exclusive and not self._groups and group is None:
            return True  # the common case: nothing to decide
        eligible = self._candidates(queue)
        if receiver.id not in eligible:
            return False
        if group is None:
            return True
        entry = self._groups.get((queue.channel.name, group))
        if entry is not None and entry[0] in eligible:
            return bool(entry[0] == receiver.id)
        return rendezvous(group, eligible) == receiver.id

    def sent(self, queue: Queue, delivery: Delivery, receiver: Client) -> None:
        """A message went to ``receiver``: its group (if any) is in flight there."""
        if self._credits:
            channel = queue.channel.name
            credit = self._credits.get((channel, receiver.id))
            if credit is not None:
                size = len(delivery.message.payload)
                credit.count -= 1
                credit.size -= size
                key = (channel, receiver.id, delivery.message.message_id)
                if queue.options.request_acknowledge:
                    self._charged[key] = (credit, size)
                else:  # nothing will be acknowledged: given back at once
                    credit.count += 1
                    credit.size += size
        message = delivery.message
        known = message.headers is self._last_headers  # (_facts_of without its call)
        group = (self._last_facts if known else self._facts_of(message.headers))[2]
        if group is not None and queue.options.request_acknowledge:
            entry = self._groups.setdefault((queue.channel.name, group), [receiver.id, 0])
            entry[0] = receiver.id
            entry[1] += 1

    def settled(self, queue: Queue, delivery: Delivery) -> None:
        """A delivery was acknowledged, failed or timed out: no longer in flight."""
        if self._charged:
            self.return_credit(
                queue.channel.name, delivery.receiver.id, delivery.message.message_id
            )
        message = delivery.message
        known = message.headers is self._last_headers  # (_facts_of without its call)
        group = (self._last_facts if known else self._facts_of(message.headers))[2]
        if group is None:
            return
        key = (queue.channel.name, group)
        entry = self._groups.get(key)
        if entry is not None:
            entry[1] -= 1
            if entry[1] <= 0:
                del self._groups[key]

    def quiet(self, headers: HeaderBlock) -> bool:
        """Do the rules leave a message with this header block alone now?  True when no
        rule is in force (no owned channel, credit, first sequence, selector, exclusive
        consumer, group in flight, credit charged) and the block holds no ``expires`` and
        no ``message_group``: then :meth:`expired` is False, :meth:`eligible` True for
        every consumer of a queue, and :meth:`sent` and :meth:`settled` change nothing for
        it (``persistent`` does not matter here).  The per-message handler's
        ``quiet_test`` (``broker.engine.delivery``)."""
        if (
            self._owners
            or self._credits
            or self._charged
            or self._from_seq
            or self._selectors
            or self._exclusive
            or self._groups
        ):
            return False
        if headers is self._last_headers:  # (_facts_of without its call)
            found = self._last_facts
        elif not headers:
            return True
        else:
            found = self._facts_of(headers)
        return found[1] is None and found[2] is None

    def persistent(self, message: QueueMessage) -> bool:
        """Does the message ask to be saved (``persistent: true``)?"""
        known = message.headers is self._last_headers  # (_facts_of without its call)
        return (self._last_facts if known else self._facts_of(message.headers))[0]

    def expired(self, message: QueueMessage) -> bool:
        """Has the message's ``expires`` time come?  (Counted in ``expired_count``.)"""
        known = message.headers is self._last_headers  # (_facts_of without its call)
        deadline = (self._last_facts if known else self._facts_of(message.headers))[1]
        if deadline is not None and deadline <= self.wall_clock() * 1000:
            self.expired_count += 1
            return True
        return False
