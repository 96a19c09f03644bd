"""Per-consumer flow control: a window of deliveries in flight, settled by the transport.

A queue hands a message to a consumer only while the consumer has room in its *window*
for that queue (:meth:`broker.engine.queue.queue.Queue.room`).  The window counts the consumer's
deliveries of the queue that are in flight: not yet acknowledged when the queue requests
acknowledges, otherwise not yet taken by the transport.  Its size is the ``Prefetch`` the
client sent when it joined the channel, else the queue's ``Prefetch`` option, else the
broker's ``BrokerConfig.prefetch`` (1000); never above ``BrokerConfig.max_prefetch``
(100,000).  A message leaves its queue only when a consumer can take it.

Every queue delivery leaves the engine as a :class:`~broker.protocol.Tracked` frame and
waits, in send order, in its client's ``unsent`` deque as a :data:`Transit` -- but for a
run of :data:`AUTO` deliveries to a queue's single consumer whose transport takes runs,
which leaves as ONE :class:`~broker.protocol.AutoRun` item and waits as ONE
:data:`AUTO_RUN` entry standing for its N deliveries (nothing made per delivery).  Runs
are the consumer's property, never a call's: ``Engine.acknowledge_taken(..., runs=True)``
sets ``Client.auto_runs`` (the STOMP door's ``ack:auto`` consumers); a consumer without
it (a TMQP peer: its server writes one frame per delivery) gets one item per AUTO
delivery, the same outcome.  AUTO deliveries come from two places: ``Queue.accept_many``
(a push sent at once, nothing waiting ahead: the entry holds the message as pushed; a
run's entry a slice of what was pushed -- of the STOMP door's run of plain SENDs, its
:class:`~broker.protocol.PlainSends`, ids and bodies and one header block, no message
made until something reads one: a delivery unwritten, made tracked or given back; a
split only slices it) and the queue's drain of a backlog (``Dispatcher.send_run`` /
``Dispatcher.send``: the entry holds the ``QueueMessage`` itself, which
``Queue.materialize`` then tracks; only messages of the queue's stretch of unique ids,
never delivered, not saved).  Counting stays in deliveries.  The server reports how
many tracked deliveries of each client the transport took (``Engine.transmitted``) and
:func:`transmitted` settles that many from the front (a run entry whole in one step, or
split where the count ends, the rest staying at the front in order; split around an
unwritten position, that delivery becoming its tracked one; made its AUTO deliveries
when it may no longer settle quietly; made them also when the client goes away,
:func:`abandon`): the delivery is counted as sent
(``SentMessages``/``Deliveries`` count what went out, nothing else), a queue without
acknowledges frees the window slot and finishes the message, and queues waiting for room
send more.  When a client goes away (:func:`abandon`) what never reached its socket goes
back: messages return to the front of their queue, in order, without counting as a put
back (the consumer never had them); a broadcast copy is counted in ``dropped``.  A client
that stops reading therefore stays connected and costs at most its windows; only its
session expiring (missed pings) ends it.  Unacknowledged deliveries of a client that goes
away return through the queue's acknowledgement tracker as before, and every delivery
sent again carries a ``Delivery-Count`` header.

A consumer whose window is full, status by status:

- Push: the message goes to the consumers with room; with none, it waits in the queue.
- Round robin and first acquirer: the next consumer with room; with none, it waits.
- Broadcast (keeps nothing): that consumer's copy is dropped and counted in the queue's
  ``DroppedDeliveries``; a slow consumer's backlog is its window plus its socket's
  high-water mark, never more.
- Pull: a request gets at most the room left, or ``No-Content: Limit-Exceeded`` with none.
- Cache: an answer leaves the message in the queue and needs no window; it is counted
  once sent.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from broker.engine.tmqp_door import message_of_octets

if TYPE_CHECKING:
    from broker.engine.channel import Client
    from broker.engine.message import Message, QueueMessage
    from broker.engine.queue_view import QueueView as Queue
    from broker.protocol import Outgoing

#: The queue type of the engine using this module (anything a ``QueueView`` describes).
QV = TypeVar("QV", bound="Queue")

# What a tracked delivery is (the first field of a Transit).
#: A push sent by the plain fast path: no QueueMessage, the message and sequence number
#: to rebuild one if it has to go back.
PLAIN = 0
#: A message of a queue without acknowledges (push, round robin, pull).
COPY = 1
#: A broadcast copy: never goes back to the queue.
BROADCAST = 2
#: A delivery waiting for the consumer's acknowledge (its window slot is freed then).
ACKED = 3
#: A cache queue's answer: the message stays in the queue.
CACHE = 4
#: A delivery of an acknowledged queue to a consumer that acknowledges by taking
#: (``Client.auto_acked``, STOMP ``ack:auto``), sent by ``Queue.accept_many`` without a
#: QueueMessage or a ``pending`` entry: the message (as pushed) and its sequence number;
#: or by the queue's drain (``Dispatcher.send_run``/``send``): the ``QueueMessage``
#: taken from the queue in the message's place (no ``pending`` entry either).
#: Settled taken, it is counted sent and acknowledged at once; anything else it meets
#: (its channel no longer acknowledged by taking, the handler's quiet test now False,
#: its consumer leaving) first makes it the tracked delivery it stands for
#: (``Queue.materialize``), which then takes the tracked path.
AUTO = 5
#: A run of AUTO deliveries of one queue to one consumer, made as one outgoing item
#: (``broker.protocol.AutoRun``, for a consumer whose transport takes runs:
#: ``Client.auto_runs``, the STOMP door's): the
#: messages (as pushed: a slice of a list or of the door's ``PlainSends``) in the
#: message's place and the first one's sequence
#: number (the others follow it, one apart); a drain's: its ``QueueMessage`` s (their own
#: numbers: the entry's is the first one's).  It stands for ``len(messages)`` AUTO
#: deliveries: counted, settled and reported taken as they would be, one entry for all.
#: (AUTO and AUTO_RUN are the last kinds: ``_taken`` tells them from the others by ``>=``.)
AUTO_RUN = 6

#: ``(kind, queue, queue message or None, message or None, sequence number)``: the entries of
#: ``Client.unsent`` (``broker.engine.channel.Transit``), with their types.  A ``PLAIN``
#: push delivered as the octets it came in (``broker.engine.octets_run``) holds them in
#: the message's place: a message is made of them only if it must go back; an
#: ``AUTO_RUN`` holds its messages there.
Transit = tuple[
    int,
    "Queue",
    "QueueMessage | None",
    "Message | QueueMessage | bytes | Sequence[Message] | Sequence[QueueMessage] | None",
    int,
]

#: An entry of ``Client.unsent`` as the client's type declares it (``channel.Transit``).
_Entry = tuple[int, Any, Any, Any, int]


def unsent_deliveries(client: Client[Any]) -> int:
    """How many deliveries the client's ``unsent`` entries stand for (an ``AUTO_RUN``
    entry: its messages; kept count of in ``Client.unsent_extra``, never walked)."""
    return len(client.unsent) + client.unsent_extra


def _auto_entries(transit: _Entry) -> list[_Entry]:
    """An ``AUTO_RUN`` entry as the ``AUTO`` entries it stands for, in send order."""
    _, queue, _, messages, seq = transit
    return [(AUTO, queue, None, m, seq + i) for i, m in enumerate(messages)]


def transmitted(
    client: Client[Any],
    count: int,
    now: float,
    ready: dict[QV, None],
    out: list[Outgoing],
    acked: dict[QV, None],
    unwritten: Collection[int] = (),
) -> int:
    """The transport is done with the client's next ``count`` tracked frames; returns how
    many were settled (fewer only if the server reports more than the engine sent).

    ``unwritten``: the positions among them (0 is the next) of deliveries that never
    reached the consumer's socket though the transport is done with them (the STOMP
    listener's deliveries to a subscription gone meanwhile, or held for one: its NACKs
    for them follow).  Such a delivery waiting for an acknowledge is not counted as sent
    and stays in flight for that NACK (an AUTO one becomes its tracked delivery): put
    back, it is not a redelivery.  Any other kind is settled as taken.  See
    :func:`_taken` for the rest.
    """
    if not unwritten:
        return _taken(client, count, now, ready, out, acked)
    done = 0
    unsent = client.unsent
    for position in sorted(set(unwritten)):
        if position >= count:
            break
        if position > done:
            done += _taken(client, position - done, now, ready, out, acked)
        if done < position or not unsent:
            return done  # (the server reported more than the engine sent)
        transit = unsent[0]
        kind = transit[0]
        if kind == AUTO_RUN:  # its first delivery is the unwritten one: split it off
            unsent.popleft()
            messages, seq = transit[3], transit[4]
            if len(messages) > 1:
                unsent.appendleft((AUTO_RUN, transit[1], None, messages[1:], seq + 1))
                client.unsent_extra -= 1
            transit[1].materialize(client, messages[0], seq, now)
            done += 1
        elif kind == AUTO:
            unsent.popleft()
            transit[1].materialize(client, transit[3], transit[4], now)
            done += 1
        elif kind == ACKED:
            unsent.popleft()  # (its pending entry waits for the NACK)
            done += 1
        else:
            done += _taken(client, 1, now, ready, out, acked)
    if count > done:
        done += _taken(client, count - done, now, ready, out, acked)
    return done


def _taken(
    client: Client[Any],
    count: int,
    now: float,
    ready: dict[QV, None],
    out: list[Outgoing],
    acked: dict[QV, None],
) -> int:
    """The transport took the client's next ``count`` tracked frames (:func:`transmitted`).

    Queues whose window slots were freed are added to ``ready`` (to be drained).  A
    delivery waiting for an acknowledge on a channel the client acknowledges by taking
    (``Client.auto_acked``) is acknowledged now (what that causes goes to ``out``); its
    queue is added to ``acked`` (to be drained even if it was not stalled).  An
    :data:`AUTO` delivery whose channel is still acknowledged by taking and whose header
    block the handler's quiet test still passes is settled with its run (counted sent
    and acknowledged); any other becomes its tracked delivery first and is settled as one.
    An :data:`AUTO_RUN` entry is settled whole, in one step, when it passes that test;
    when ``count`` ends inside it, the part taken is settled and the rest stays at the
    front as a shorter entry; when it does not pass, the part taken is turned into its
    AUTO deliveries, settled one by one as above.
    """
    unsent = client.unsent
    cid = client.id
    auto = client.auto_acked
    pop = unsent.popleft
    run: QV | None = None  # consecutive fast-path deliveries of one queue settle together
    run_kind = PLAIN
    run_length = 0
    plain_run: QV | None = None  # (run, when its kind is PLAIN; else None)
    auto_run: QV | None = None  # (run, when its kind is AUTO; else None)
    seen: QV | None = None  # (the last AUTO delivery's queue and header block, and
    seen_headers: Any = None  # whether it settled quietly: asked once per block)
    seen_quiet = False
    left = count  # deliveries still to settle
    # (one pass of the inner loop per stretch of single entries: a run entry, which
    # stands for several deliveries, ends it; the loop then goes on with what is left)
    while left and unsent:
        stretch = left if left < len(unsent) else len(unsent)
        for i in range(stretch):
            transit = pop()
            queue = transit[1]
            if transit[0] == PLAIN:  # (TMQP's fast path first, as before AUTO existed)
                if queue is plain_run:
                    run_length += 1
                    continue
                kind = PLAIN
                n = 1
            else:
                kind = transit[0]
                if kind >= AUTO:  # (AUTO or AUTO_RUN: the last kinds, one test)
                    n = 1
                    frame = transit[3]
                    if kind == AUTO_RUN:
                        messages = frame
                        frame = messages[0]
                        n = len(messages)
                        if n > left - i:  # (the count ends inside it: the rest stays)
                            client.unsent_extra -= left - i
                            n = left - i
                            unsent.appendleft(
                                (AUTO_RUN, queue, None, messages[n:], transit[4] + n)
                            )
                            transit = (AUTO_RUN, queue, None, messages[:n], transit[4])
                        else:
                            client.unsent_extra -= n - 1
                    # (a Message's headers, or a drained QueueMessage's: the attribute both have)
                    headers = frame.headers
                    if queue is not seen or headers is not seen_headers:
                        seen, seen_headers = queue, headers
                        seen_quiet = (
                            bool(auto) and queue.channel.name in auto and queue.quiet(headers)
                        )
                    if seen_quiet:
                        if queue is auto_run:
                            run_length += n
                            if n > 1:
                                left -= i + n
                                break
                            continue
                        kind = AUTO
                    elif kind == AUTO_RUN:  # (its AUTO deliveries, one by one, below)
                        unsent.extendleft(reversed(_auto_entries(transit)))
                        left -= i
                        break
                    else:
                        if run is not None:
                            _settle_run(run, run_kind, cid, run_length, now, ready, acked)
                            run = plain_run = auto_run = None
                        seen = None  # (the hooks called below may change the rules' answer)
                        m = queue.materialize(client, frame, transit[4], now)
                        if m is None:
                            continue  # (its queue was removed)
                        queue.settle_sent(ACKED, cid, m, now)
                        ready[queue] = None
                        if auto and queue.channel.name in auto:
                            queue.ack_taken(client, m.message_id, now, out)
                            acked[queue] = None
                        continue
                else:
                    m = transit[2]
                    queue.settle_sent(kind, cid, m, now)
                    ready[queue] = None
                    if kind == ACKED and auto and m is not None and queue.channel.name in auto:
                        queue.ack_taken(client, m.message_id, now, out)
                        acked[queue] = None
                        seen = None  # (as above)
                    continue
            if run is not None:  # (a fast-path delivery that starts a run)
                _settle_run(run, run_kind, cid, run_length, now, ready, acked)
            run = queue
            run_kind = kind
            run_length = n
            if kind == PLAIN:
                plain_run, auto_run = queue, None
            else:
                plain_run, auto_run = None, queue
                if n > 1:
                    left -= i + n
                    break
        else:
            left -= stretch
    if run is not None:
        _settle_run(run, run_kind, cid, run_length, now, ready, acked)
    return count - left


def _settle_run(
    queue: QV,
    kind: int,
    client_id: str,
    count: int,
    now: float,
    ready: dict[QV, None],
    acked: dict[QV, None],
) -> None:
    """``count`` consecutive fast-path deliveries of ``queue`` were taken."""
    if kind == AUTO:
        queue.settle_auto(client_id, count, now)
        acked[queue] = None
    else:
        queue.settle_plain(client_id, count, now)
    ready[queue] = None


def abandon(client: Client[Any], now: float, out: list[Outgoing], ready: dict[QV, None]) -> None:
    """The client is going away: what never reached its socket returns to its queues.

    Call it before the client leaves its channels; the queues to drain afterwards (for
    the other consumers) are added to ``ready``.  An :data:`AUTO` delivery becomes the
    tracked delivery it stands for (``Queue.materialize``): the client's leaving returns
    it with its queue's other unacknowledged deliveries (``consumer_gone``), counted and
    decided as they are; so that they come back in the order they were sent, the
    tracked ones still unsent of a queue that has AUTO ones move behind the client's
    other unacknowledged deliveries in that order (``Queue.in_send_order``).
    """
    unsent: Collection[_Entry] = client.unsent
    client.unsent = deque()
    client.unsent_extra = 0
    cid = client.id
    if any(t[0] == AUTO_RUN for t in unsent):
        unsent = [e for t in unsent for e in (_auto_entries(t) if t[0] == AUTO_RUN else (t,))]
    mixed = {t[1] for t in unsent if t[0] == AUTO}
    for kind, queue, m, frame, seq in unsent:
        if mixed and queue in mixed:
            if kind == AUTO:
                if queue.materialize(client, frame, seq, now) is not None:
                    ready[queue] = None
                continue
            if kind == ACKED and m is not None:
                queue.in_send_order(cid, m.message_id)
        if frame.__class__ is bytes:  # a push carried as its octets (``octets_run``)
            frame = message_of_octets(frame)
        queue.settle_unsent(kind, cid, m, frame, seq, now, out)
        ready[queue] = None


def make_tracked(
    queue: QV, clients: Iterable[Client[Any]], now: float, plain: bool = False
) -> list[tuple[str, list[tuple[str, bool]]]]:
    """Every delivery of ``queue`` waiting in ``clients``' ``unsent`` as a transit that
    stands for a tracked one becomes that tracked delivery, in its place: each
    :data:`AUTO` delivery (each of an :data:`AUTO_RUN` entry's) its :data:`ACKED` one
    (``Queue.materialize``: its queue message in flight, its ``pending`` entry), and
    with ``plain`` each :data:`PLAIN` push its :data:`COPY` (``Queue.materialize_plain``:
    its queue message in flight, no acknowledge awaited).  Settled, they count as before;
    what they meet from now on is the tracked path's.  For the operations that look at
    deliveries in flight (a browse, a purge of them, an options change), never per
    message: the queue's deliveries then behave exactly as tracked ones would.

    Returns, for each client that had AUTO deliveries of ``queue``, the message ids of its
    deliveries of ``queue`` still unsent that wait for an acknowledge, in send order, each
    with True when it was just made tracked (its ``pending`` entry was appended:
    ``AckTracker.place`` puts it in send order)."""
    orders: list[tuple[str, list[tuple[str, bool]]]] = []
    for client in clients:
        unsent = client.unsent
        if not any(t[1] is queue and (t[0] >= AUTO or (plain and t[0] == PLAIN)) for t in unsent):
            continue
        entries: list[_Entry] = []
        order: list[tuple[str, bool]] = []  # (message id, made tracked now)
        for transit in unsent:
            kind = transit[0]
            if transit[1] is not queue:
                entries.append(transit)
            elif kind >= AUTO:
                if kind == AUTO_RUN:
                    client.unsent_extra -= len(transit[3]) - 1
                for _, _, _, message, seq in (
                    _auto_entries(transit) if kind == AUTO_RUN else (transit,)
                ):
                    m = queue.materialize(client, message, seq, now)
                    if m is None:  # (its queue was removed: callers ask only of a live one)
                        continue
                    entries.append((ACKED, queue, m, None, 0))
                    order.append((m.message_id, True))
            elif plain and kind == PLAIN:
                frame = transit[3]
                if frame.__class__ is bytes:  # (a push carried as its octets: ``octets_run``)
                    frame = message_of_octets(frame)
                copy = queue.materialize_plain(frame, transit[4], now)
                entries.append((COPY, queue, copy, None, 0))
            else:
                entries.append(transit)
                if kind == ACKED and transit[2] is not None:
                    order.append((transit[2].message_id, False))
        unsent.clear()
        unsent.extend(entries)
        if any(new for _, new in order):
            orders.append((client.id, order))
    return orders


def unsent_copies(queue: QV, clients: Iterable[Client[Any]]) -> list[QueueMessage]:
    """The queue messages of ``queue``'s :data:`COPY` and :data:`BROADCAST` deliveries
    waiting in ``clients``' ``unsent`` (in flight, no acknowledge awaited: not held, but
    one may come back to the queue, or be retained once taken -- a browse index made
    now must know them)."""
    return [
        t[2]
        for client in clients
        for t in client.unsent
        if t[1] is queue and (t[0] == COPY or t[0] == BROADCAST) and t[2] is not None
    ]
