"""Sending a queue's messages to the consumers of its channel.

:meth:`Dispatcher.drain` takes waiting messages in order (high priority first) and
sends each to the consumers the status chooses (all of them, the next in round-robin
order, or the first acquirer) among those with room in their window
(``broker.engine.flow``), as far as the delivery handler's hooks and the
WaitForAcknowledge option allow.  A delivery that needs a consumer acknowledge is tracked
until it is acknowledged or times out (``broker.engine.queue.acks``); every delivery is
settled when the transport reports it sent (:meth:`Dispatcher.settle_sent`) or its
consumer goes away first (:meth:`Dispatcher.settle_unsent`).

A drain's delivery to a consumer that acknowledges the channel by taking
(``Client.auto_acked``) leaves as an AUTO one (``broker.engine.flow.AUTO``: no
``pending`` entry, no ``Delivery``; settled by count) when nothing the tracked path does
for it could matter (:meth:`Dispatcher.taking_for`, the message's own test in
:meth:`Dispatcher.send_run` and :meth:`Dispatcher.send`); several in a row to a round-robin
queue's only consumer leave as one run (``flow.AUTO_RUN``) for a consumer whose transport
takes runs (``Client.auto_runs``).  Its transit keeps the queue message itself, so
whatever makes it tracked later (:meth:`Dispatcher.materialize`) tracks that one.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any

from broker.engine.delivery import ALLOW, PutBack
from broker.engine.flow import ACKED, AUTO, AUTO_RUN, BROADCAST, CACHE, COPY, PLAIN
from broker.engine.message import (
    FIRST_ACQUIRER_FLAG,
    INFLIGHT,
    QUEUED,
    TTL_SHIFT,
    Delivery,
    Headers,
    Life,
    Message,
    QueueMessage,
    derive,
)
from broker.engine.queue.messages import Aside
from broker.engine.queue.protocols import QueueCore
from broker.protocol import (
    AutoRun,
    DeliveredRun,
    Header,
    NackReason,
    Outgoing,
    QueueStatus,
    Tracked,
)

if TYPE_CHECKING:
    from broker import tmqp
    from broker.engine.channel import Client

_INF = float("inf")
#: Messages one drain passes over at most (no consumer with room may receive them, and
#: the delivery handler lets the messages behind them go first: ``looks_past``); past
#: that many the drain stops until the next one.  Also the most one drain sets aside
#: (those no consumer selects at all: see :meth:`Dispatcher.drain`), so a drain looks
#: at no more than twice this many messages it cannot send.
LOOK_PAST_LIMIT = 1000
#: Seconds after which a drain that set aside its bound goes on (the engine's tick then:
#: other work gets its turn in between, and one tick never loops over a whole backlog).
DRAIN_AGAIN_AFTER = 0.001
#: ``Tracked(client_id, frame)`` without the named tuple's Python-level __new__.
_tracked = tuple.__new__
_ROUND_ROBIN = QueueStatus.ROUND_ROBIN
_PUSH = QueueStatus.PUSH
#: ``Message(...)`` from a tuple of every field, the same way.
_new_message = tuple.__new__
#: ``DeliveredRun(...)`` the same way.
_new_run = tuple.__new__
#: Messages :meth:`Dispatcher.send_run` takes out of the queue after the first, then
#: twice as many each time while all qualify.
_FIRST_BATCH = 16
_DELIVERY_COUNT = Header.DELIVERY_COUNT.lower()
_REDELIVERY = (_DELIVERY_COUNT, Header.REDELIVERED.lower())


def redelivery_headers(headers: Headers, delivered: int) -> Headers:
    """``headers`` of a message sent ``delivered`` times before: ``Delivery-Count`` (this
    delivery's number) and ``Redelivered: true``, replacing any the producer set."""
    return (
        *((k, v) for k, v in headers if k.lower() not in _REDELIVERY),
        (Header.DELIVERY_COUNT, str(delivered + 1)),
        (Header.REDELIVERED, "true"),
    )


class Dispatcher:
    """Delivery to the consumers of one queue (see the module docstring)."""

    __slots__ = (
        "aside_key",
        "fresh",
        "fresh_message",
        "out_version",
        "passable",
        "pending",
        "q",
        "taking",
    )

    def __init__(self, queue: QueueCore) -> None:
        self.q = queue
        #: The queue's deliveries waiting for an acknowledge (its tracker's, one dict for
        #: the queue's life: read per message without the queue's property call).
        self.pending = queue.pending
        #: The message being accepted and the tuple it was made from (set by the queue's
        #: ``accept`` around its admission): sent at once, it is not rebuilt from its
        #: fields (:meth:`out_message`).
        self.fresh: QueueMessage | None = None
        self.fresh_message: Message | None = None
        #: Bumped when options change: the frames prepared for sending are made again.
        self.out_version = 0
        #: Set by :meth:`send`: the message it put back at the front may be passed over.
        self.passable = False
        #: What the messages set aside were looked past under (``HandlerHooks.selection``).
        self.aside_key: tuple[object, ...] = ()
        #: Set by :meth:`drain` while it runs when its deliveries may be AUTO ones
        #: (:meth:`taking_for`): :meth:`send` then makes one of a delivery that qualifies.
        self.taking = False

    # ------------------------------------------------------------------ returns

    def give_back(self, m: QueueMessage, out: list[Outgoing]) -> None:
        """A message that never reached its consumer goes back to the front of the queue."""
        q = self.q
        if not q.alive:
            return  # removed with its queue (and the queue's store)
        if not q.strategy.keeps_returns:
            q.drop(m, out, NackReason.CLEARED)
        else:
            q.messages.requeue(m, PutBack.START)

    # ------------------------------------------------------------------ sending

    def drain(self, now: float, out: list[Outgoing]) -> None:
        """Send waiting messages to consumers as far as the status and options allow.

        A message no consumer with room may take, when the handler ``looks_past``, is
        set aside (``MessageOrder``: "Set aside"), at most :data:`LOOK_PAST_LIMIT` per
        drain: marked *waiting* when some consumer of the queue selects it (the
        handler's ``selects``; it waits for room), not when nobody does.  The next drains
        start behind what was set aside, so a long run of such messages costs each drain
        nothing once set aside, and a message selected behind them is reached.  Before
        the fresh messages of a priority, the waiting ones of that priority are offered
        to each consumer with room, from that consumer's cursor ("Waiting for room"):
        what it does not select is passed once per consumer, not once per drain, so a
        drain's work is what it delivers plus, per consumer with room, at most one look
        at a message it selects but may not take (out of credit, group held elsewhere);
        such looks count against :data:`LOOK_PAST_LIMIT` with the messages passed over
        (put back in their place when the drain ends: in a paging queue past its window
        of set-aside messages), and past that many the drain stops until the next one.
        Everything set aside is looked at again when the consumers or what they select
        change (``aside_key``).  A drain that set aside its bound asks for another soon
        (``drain_again``: a tick :data:`DRAIN_AGAIN_AFTER` later), so a backlog is gone
        through a bounded step at a time, other work in between.

        AUTO deliveries (the module docstring): when the queue allows them
        (:meth:`taking_for`), a round-robin queue's only consumer gets the stretch of
        messages that qualify from the one taken on as one hand-over
        (:meth:`send_run`), and :meth:`send` makes an AUTO delivery of one that
        qualifies for the consumer it chose."""
        q = self.q
        messages = q.messages
        if messages.front:
            messages.flush_front()
        q.stalled = False
        if not q.strategy.delivers:
            return
        consumers = q.channel.consumer_list
        if not consumers or not (messages.n_priority or messages.n_regular):
            return
        hooks = q.hooks
        if (messages.aside_priority or messages.aside_regular) and (
            hooks.selection(consumers) != self.aside_key
        ):
            messages.restore_aside()
        wait = q.options.wait_for_acknowledge
        pending = q.pending
        passed: list[QueueMessage] = []
        passed_high = passed_regular = False  # a message of that priority was passed
        set_aside = 0
        more = False
        offered = 0  # the waiting ones offered: 1 high priority, 2 both
        looked = [0]  # looks at waiting messages a consumer with room selects, not taken
        taking = self.taking = self.taking_for(consumers)
        # (a round-robin queue's only consumer: the stretches that qualify go as runs)
        only = (
            consumers[0]
            if taking and len(consumers) == 1 and q.strategy.status is _ROUND_ROBIN
            else None
        )
        try:
            while True:
                if wait and (pending or q.auto_in_flight):  # (AUTO ones wait as pending)
                    return
                if not offered:
                    offered = 1
                    if messages.aside_priority and not self.offer_waiting(
                        True, consumers, now, out, looked
                    ):
                        return
                m = messages.next_fresh()
                if offered == 1 and (m is None or not m.high_priority):
                    offered = 2
                    if messages.aside_regular:
                        if m is not None:
                            messages.unpop(m)
                        if not self.offer_waiting(False, consumers, now, out, looked):
                            return
                        continue
                if m is None:
                    return
                if m.deadline and m.deadline <= now:
                    q.expire(m, out)
                    continue
                if only is not None and self.send_run(m, only, out):
                    continue
                if not self.send(m, consumers, now, out):
                    if not self.passable:
                        return
                    self.passable = False
                    high = m.high_priority
                    aside = (
                        set_aside < LOOK_PAST_LIMIT
                        and not (passed_high if high else passed_regular)
                        and messages.may_set_aside(m)
                    )
                    if not aside and set_aside >= LOOK_PAST_LIMIT:
                        more = True  # set aside its bound: the next tick goes on
                        return
                    if not aside and len(passed) + looked[0] >= LOOK_PAST_LIMIT:
                        return
                    # nobody with room may take it: the ones behind it go first
                    taken = messages.next_fresh()  # m, put back at the front by send
                    if taken is not m:  # (cannot happen: keep the queue as it was)
                        if taken is not None:
                            messages.unpop(taken)
                        return
                    if aside:
                        if not (messages.aside_priority or messages.aside_regular):
                            self.aside_key = hooks.selection(consumers)
                        messages.set_aside(m, not hooks.nobody_selects(m, consumers))
                        set_aside += 1
                        continue
                    passed.append(m)
                    if high:
                        passed_high = True
                    else:
                        passed_regular = True
        finally:
            self.passable = self.taking = False
            for m in reversed(passed):
                messages.unpop(m)
            if more:
                q.drain_again(now + DRAIN_AGAIN_AFTER)  # more may wait behind it

    def offer_waiting(
        self,
        high: bool,
        consumers: Sequence[Client[Any]],
        now: float,
        out: list[Outgoing],
        looked: list[int],
    ) -> bool:
        """Offer the messages of one priority set aside as waiting for room to each
        consumer with room, oldest first, from its cursor (see :meth:`drain`); False
        stops the drain (its bound of looks reached, a hook put a message back, or a
        WaitForAcknowledge queue has one in flight)."""
        q = self.q
        messages = q.messages
        aside = messages.aside_priority if high else messages.aside_regular
        if not isinstance(aside, Aside) or not aside.waiting:
            return True
        hooks = q.hooks
        req_ack = q.options.request_acknowledge
        wait = q.options.wait_for_acknowledge
        name = q.channel.name
        window = q.window
        used = q.used
        cursors = aside.cursors
        try:
            for c in consumers:
                limit = c.prefetch.get(name) or window
                if used.get(c.id, 0) >= limit:
                    continue
                pos = max(cursors.get(c.id, 0), aside.start)
                advancing = True  # everything before pos is not for c
                while pos < aside.end and aside.waiting and used.get(c.id, 0) < limit:
                    m, waits = aside.at(pos)
                    if m is None or not waits:
                        pass
                    elif m.state != QUEUED:  # timed out while it waited: gone for good
                        aside.take(pos)
                    elif not hooks.selected_by(m, c):
                        pass
                    elif m.deadline and m.deadline <= now:
                        messages.take_aside(aside, pos)
                        q.expire(m, out)
                    elif not self._eligible(m, c, req_ack):
                        advancing = False  # it may take it later: the cursor stays
                        looked[0] += 1
                        if looked[0] > LOOK_PAST_LIMIT:
                            return False
                    else:
                        messages.take_aside(aside, pos)
                        if not self.send(m, consumers, now, out):
                            if m.state == QUEUED and (self.passable or q.stalled):
                                messages.return_aside(aside, pos, m)  # (send put it back)
                                self.passable = False
                                advancing = False
                                looked[0] += 1
                                if q.stalled or looked[0] > LOOK_PAST_LIMIT:
                                    return False
                            else:
                                return False  # a hook put it back: as for a fresh one
                        elif wait and (q.pending or q.auto_in_flight):
                            pos += 1
                            if advancing:
                                cursors[c.id] = pos
                            return False
                    pos += 1
                    if advancing:
                        cursors[c.id] = pos
            return True
        finally:
            aside.trim()

    # ------------------------------------------------------------------ AUTO deliveries

    def taking_for(self, consumers: Sequence[Client[Any]]) -> bool:
        """May this drain's deliveries be AUTO ones (``broker.engine.flow.AUTO``)?  What
        ``Queue.accept_many`` checks for the run it takes, read once per drain: a Push
        or RoundRobin queue whose consumers acknowledge (``RequestAcknowledge``), no
        acknowledge or message timeout, no WaitForAcknowledge, no Retain, no browse
        index, a delivery handler with a quiet test and without ``end_send`` or
        ``message_dequeued`` hooks, some consumer acknowledging the channel by taking,
        and messages numbered in the queue's stretch of unique ids
        (``Queue.unique_from``).  Each message and consumer is then checked on its own
        (:meth:`send_run`, :meth:`send`)."""
        q = self.q
        status = q.strategy.status
        if not (status is _ROUND_ROBIN or status is _PUSH) or q.unique_from > q.unique_to:
            return False
        opts = q.options
        hooks = q.hooks
        name = q.channel.name
        return (
            opts.request_acknowledge
            and hooks.quiet is not None
            and q.index is None
            and not (
                opts.message_timeout
                or opts.wait_for_acknowledge
                or opts.acknowledge_timeout
                or opts.retain
            )
            and not (hooks.end_send or hooks.dequeued)
            and any(name in c.auto_acked for c in consumers)
        )

    def send_run(self, m: QueueMessage, c: Client[Any], out: list[Outgoing]) -> bool:
        """Send ``m`` (just taken by :meth:`drain`) and the messages behind it to ``c``,
        the round-robin queue's only consumer, as AUTO deliveries, while each
        qualifies (:meth:`taking_for` said yes for the drain): False (``m`` still in hand,
        nothing done) when ``m`` does not.

        What the tracked send of each would do, and nothing it would do could matter:
        ``c`` acknowledges the channel by taking and has room (the rest of its window
        bounds the stretch), and the message

        * was numbered in the queue's stretch of unique ids (``Queue.unique_from``: no
          other message shares its id, so no delivery in flight to ``c`` does; one in
          ``pending`` is still looked for, as ``choose_one`` does), which also means
          no receipt, no producer waiting, no CC: it came through ``accept_many``;
        * was never delivered (no ``Delivery-Count`` to carry; put back unwritten is
          fine), is not saved (the store's update and removal stay the tracked path's),
          has no deadline;
        * has a header block the handler's quiet test passes (asked once per block:
          no hook runs in between that could change the answer; one that raises is
          left to :meth:`send`, which counts it);
        * has the first one's priority (a drain offers the waiting regular messages
          before the first fresh regular one).

        The first message that does not qualify goes back to the front, for the drain
        to send as before (:meth:`send`).  The messages go out as :meth:`hand_auto`
        says."""
        q = self.q
        name = q.channel.name
        if name not in c.auto_acked:
            return False
        cid = c.id
        room = (c.prefetch.get(name) or q.window) - q.used.get(cid, 0)
        if room <= 0:
            return False
        first, last = q.unique_from, q.unique_to
        quiet = q.hooks.quiet
        assert quiet is not None  # (taking_for)
        pending = self.pending
        messages = q.messages
        high = m.high_priority
        # m, then those behind it of its priority taken out in growing batches up to
        # the room (so what goes back -- after the first that does not qualify -- is
        # never more than what went plus the first batch)
        taken = [m]
        batch = _FIRST_BATCH
        block: Headers | None = None  # the header block asked last, and its answer
        block_quiet = False
        k = 0  # (taken[:k] qualify)
        while True:
            for x in islice(taken, k, None):
                life = x.life  # (its fields read directly: none for most)
                if not first <= x.seq <= last or (
                    life is not None
                    and (life.delivered or life.saved or life.producer_waits or life.deadline)
                ):
                    break
                headers = x.headers
                if headers is not block:
                    block = headers
                    try:
                        block_quiet = bool(quiet(headers))
                    except Exception:
                        block_quiet = False  # (send asks again and counts the error)
                if not block_quiet or (pending and (cid, x.message_id) in pending):
                    break
                x.state = INFLIGHT
                k += 1
            if k < len(taken) or k >= room:
                break
            more = messages.take_fresh(high, min(batch, room - k))
            if not more:
                break
            taken += more
            batch += batch
        if not k:
            return False  # (m does not qualify: still in hand, nothing else taken)
        if k < len(taken):
            messages.unpop_many(taken[k:])  # (the first that does not: the drain's next)
            del taken[k:]
        q.rr = 0  # (where choose_one's turn moves with one consumer)
        self.hand_auto(c, taken, out)
        return True

    def hand_auto(self, c: Client[Any], taken: list[QueueMessage], out: list[Outgoing]) -> None:
        """The messages ``taken`` (in flight, in send order) go to ``c`` as AUTO
        deliveries, each the frame the tracked path sends (the acknowledge wished, no
        ``Delivery-Count``: never delivered), holding a slot of ``c``'s window and
        counted in ``auto_in_flight``.  For a consumer whose transport takes runs
        (``Client.auto_runs``) each stretch of two or more with one header block and
        one source is ONE :class:`~broker.protocol.AutoRun` item and ONE ``AUTO_RUN``
        entry; otherwise each is a :class:`~broker.protocol.Tracked` frame and an
        ``AUTO`` entry.  An entry holds the queue messages themselves (in the
        message's place): :meth:`materialize` tracks those."""
        q = self.q
        cid = c.id
        qid = q.id
        name = q.channel.name
        hide = q.options.hide_client_names
        unsent = c.unsent
        keep = unsent.append
        deliver = out.append
        new, message_type, tracked, tracked_type = _new_message, Message, _tracked, Tracked
        n = len(taken)
        i = 0
        while i < n:
            x = taken[i]
            headers = x.headers
            source = x.source
            j = i + 1
            if c.auto_runs:
                while j < n and taken[j].headers is headers and taken[j].source == source:
                    j += 1
            src = "" if hide else source
            if j - i == 1:
                frame = new(
                    message_type,
                    (
                        x.message_id,
                        src,
                        x.target,
                        qid,
                        x.high_priority,
                        x.first_acquirer,
                        True,
                        x.ttl,
                        headers,
                        x.payload,
                        None,
                    ),
                )
                deliver(tracked(tracked_type, (cid, frame)))
                keep((AUTO, q, None, x, x.seq))
                i = j
                continue
            group = taken[i:j]
            frames: list[Message] = []  # (the flags read once each: no property call)
            add = frames.append
            for y in group:
                f = y.flags
                add(
                    new(
                        message_type,
                        (
                            y.message_id,
                            src,
                            name,
                            qid,
                            y.high_priority,
                            (f & FIRST_ACQUIRER_FLAG) != 0,
                            True,
                            f >> TTL_SHIFT,
                            headers,
                            y.payload,
                            None,
                        ),
                    )
                )
            run = _new_run(DeliveredRun, (frames, src, name, qid, headers))
            deliver(tracked(AutoRun, (cid, run)))
            keep((AUTO_RUN, q, None, group, x.seq))
            c.unsent_extra += j - i - 1
            i = j
        used = q.used
        used[cid] = used.get(cid, 0) + n
        q.auto_in_flight += n

    def send(
        self,
        m: QueueMessage,
        consumers: Sequence[Client[Any]],
        now: float,
        out: list[Outgoing],
        keep: bool = True,
    ) -> bool:
        """Send a dequeued message; False stops the drain (message back at the front).

        With ``keep`` False (a broadcast message never enqueued) a message no consumer can
        take stays out of the queue, in state QUEUED, for the caller to drop.
        """
        q = self.q
        if (
            q.auto_in_flight
            and not q.unique_from <= m.seq <= q.unique_to
            and not (m.producer is not None and m.producer.own_ids)
            and m.message_id.startswith(q.host.door_prefixes)
        ):
            # m's id is not one its door made but begins as a door's do: it may be one
            # an AUTO delivery in flight has (a TMQP producer's forged id), which
            # ``pending`` does not list.  Made tracked first, those are looked for as
            # any other (``choose_one``, ``_eligible``): never two deliveries of one id
            # in flight to one consumer.  An AUTO delivery only ever carries an id a
            # door of this engine made (``accept_many``'s stretch), so any other id (a
            # TMQP producer's own, a message restored from an earlier process: another
            # nonce) cannot be one: the AUTO ones stay.  (A single STOMP SEND is
            # outside the stretch, its id unique.)
            q.track_in_flight(now)
        hooks = q.hooks
        quiet = False  # (the handler's hooks would change nothing for m: not called)
        test = hooks.quiet
        if test is not None:
            try:
                quiet = test(m.headers)
            except Exception as exc:
                quiet = hooks.quiet_failed(exc)
        if hooks.begin_send and not quiet:
            try:  # (hooks.call without its call: a hook per message)
                d = hooks.methods["begin_send"](q, m)
            except Exception as exc:
                d = hooks.failed(m, "begin_send", exc)
            if d is not ALLOW:
                q.side_effects(m, d, out)
                if not d.allow:
                    if d.put_back is not PutBack.NO:
                        q.put_back(m, d.put_back, now, out)
                        return False
                    q.drop(m, out, NackReason.UNACCEPTABLE)
                    return True
        opts = q.options
        req_ack = opts.request_acknowledge
        strategy = q.strategy
        targets: Sequence[Client[Any]]
        if strategy.status is _ROUND_ROBIN:  # (RoundRobin.targets without its call)
            targets = self.choose_one(m, consumers, True, req_ack, quiet)
        else:
            targets = strategy.targets(q, m, consumers, req_ack, keep)  # type: ignore[arg-type]
        if not targets:
            if keep:
                q.messages.unpop(m)
                if self._may_pass(consumers):
                    self.passable = True  # (not stalled: a push behind it may go)
                else:
                    q.stalled = True
            return False
        life = m.life
        if life is None:  # (``lived`` without its call: a message sent at once has none)
            life = m.life = Life()
        frame = life.out
        if frame is None or life.out_version != self.out_version:
            frame = self.out_message(m)
        life.transmitted = 0
        if req_ack:
            timeout = opts.acknowledge_timeout
            deadline = now + timeout / 1000.0 if timeout else _INF
            if len(targets) == 1:  # (round robin and first acquirer: one consumer)
                c = targets[0]
                # (hand without its call: the delivery out, in transit, a window slot)
                cid = c.id
                out.append(_tracked(Tracked, (cid, frame)))
                used = q.used
                used[cid] = used.get(cid, 0) + 1
                if (  # (a drain's: see send_run; ``frame`` is the tracked one, a
                    # redelivery's header included)
                    self.taking
                    and quiet
                    and q.channel.name in c.auto_acked
                    and q.unique_from <= m.seq <= q.unique_to
                    and not (life.saved or life.producer_waits or life.deadline)
                ):
                    c.unsent.append((AUTO, q, None, m, m.seq))  # (no pending entry)
                    q.auto_in_flight += 1
                    m.state = INFLIGHT
                    return True  # (taking_for: no end_send hook)
                c.unsent.append((ACKED, q, m, None, 0))
                dl = q.track(m, c, deadline)
                m.state = INFLIGHT
                if hooks.received and not quiet:
                    try:
                        d = hooks.methods["consumer_received"](q, dl, c)
                    except Exception as exc:
                        d = hooks.failed(m, "consumer_received", exc)
                    if d is not ALLOW:  # (ALLOW has no effects: no call)
                        q.side_effects(m, d, out)
            else:
                for c in targets:
                    self.hand(c, ACKED, m, frame, out)
                    q.track(m, c, deadline)
                m.state = INFLIGHT
                if hooks.received and not quiet:
                    for c in targets:
                        waiting = q.pending.get((c.id, m.message_id))
                        if waiting is not None:
                            d = hooks.call(m, "consumer_received", q, waiting, c)
                            q.side_effects(m, d, out)
        else:
            m.state = INFLIGHT
            kind = COPY if keep else BROADCAST
            life.unsent += len(targets)
            for c in targets:
                self.hand(c, kind, m, frame, out)
            if hooks.received and not quiet:
                for c in targets:
                    d = hooks.call(m, "consumer_received", q, Delivery(m, c, 0.0), c)
                    if d is not ALLOW:
                        q.side_effects(m, d, out)
                        if d.put_back is not PutBack.NO and m.state == INFLIGHT:
                            q.put_back(m, d.put_back, now, out)
        if hooks.end_send:
            d = hooks.call(m, "end_send", q, m)
            if d is not ALLOW:
                q.side_effects(m, d, out)
                if not req_ack and d.put_back is not PutBack.NO and m.state == INFLIGHT:
                    q.put_back(m, d.put_back, now, out)
        # A message without acknowledges is finished once the transport took a copy
        # (settle_sent), or goes back if none got there (settle_unsent).
        return m.state == INFLIGHT  # False: put back by a hook, stop this drain pass

    # ------------------------------------------------------------------ choosing consumers

    def with_room(
        self, m: QueueMessage, consumers: Sequence[Client[Any]], req_ack: bool, keep: bool
    ) -> list[Client[Any]]:
        """The consumers that may take ``m`` now; a broadcast copy for a consumer whose
        window is full is dropped and counted."""
        q = self.q
        check = req_ack or q.hooks.can_receive
        name = q.channel.name
        window = q.window
        used = q.used
        targets = []
        full = 0
        for c in consumers:
            if check and not self._eligible(m, c, req_ack):
                continue
            if used.get(c.id, 0) < (c.prefetch.get(name) or window):
                targets.append(c)
            else:
                full += 1
        if full and not keep:
            q.dropped += full
        return targets

    def _may_pass(self, consumers: Sequence[Client[Any]]) -> bool:
        """A message nobody took: may the drain pass over it?  Only when some consumer
        has room (the handler refused them all) and the handler says so."""
        q = self.q
        if not q.hooks.can_receive:
            return False
        name = q.channel.name
        window = q.window
        used = q.used
        if not any(used.get(c.id, 0) < (c.prefetch.get(name) or window) for c in consumers):
            return False
        return q.hooks.looks_past()

    def _eligible(self, m: QueueMessage, c: Client[Any], req_ack: bool) -> bool:
        q = self.q
        if req_ack and (c.id, m.message_id) in self.pending:
            return False  # same id still unacknowledged by this consumer
        if q.hooks.can_receive:
            return q.hooks.can_consumer_receive(m, c)
        return True

    def eligible(self, m: QueueMessage, c: Client[Any]) -> bool:
        """May consumer ``c`` receive ``m`` (the handler's can_consumer_receive)?"""
        return not self.q.hooks.can_receive or self._eligible(m, c, False)

    def choose_one(
        self,
        m: QueueMessage,
        consumers: Sequence[Client[Any]],
        rotate: bool,
        req_ack: bool,
        quiet: bool = False,
    ) -> tuple[Client[Any], ...]:
        """The first consumer with room that may take ``m`` (from the round-robin
        position, moved past it, when ``rotate``); low-priority consumers
        (``Consumer-Priority: low``) only when no other one can take it.  ``quiet``: the
        handler's quiet test said True for ``m`` (its filter is not asked)."""
        q = self.q
        n = len(consumers)
        start = q.rr % n if rotate else 0
        hooks = q.hooks
        filters = hooks.can_receive and not quiet
        # (hooks.can_consumer_receive without its call: the handler's filter, bound)
        accepts = hooks.methods["can_consumer_receive"] if filters else None
        pending = self.pending if req_ack else None  # (as _eligible, without its call)
        name = q.channel.name
        window = q.window
        used = q.used
        later = False  # a low-priority consumer was passed over (second round for it)
        for low in (False, True):
            for i in range(n):
                c = consumers[(start + i) % n]
                if c.low_priority is not low:
                    later = later or c.low_priority
                    continue
                if used.get(c.id, 0) >= (c.prefetch.get(name) or window):
                    continue  # its window is full: the next one
                if pending and (c.id, m.message_id) in pending:
                    continue  # same id still unacknowledged by this consumer
                if accepts is not None:
                    try:
                        if not accepts(q, m, c):
                            continue
                    except Exception as exc:
                        hooks.filter_failed(exc)
                        continue
                if rotate:
                    q.rr = (start + i + 1) % n
                return (c,)
            if not later:
                break
        return ()

    # ------------------------------------------------------------------ handing over

    def hand(
        self,
        c: Client[Any],
        kind: int,
        m: QueueMessage | None,
        frame: Message | tmqp.Frame,
        out: list[Outgoing],
    ) -> None:
        """Send ``frame`` to ``c`` as a tracked delivery holding a slot of its window."""
        out.append(_tracked(Tracked, (c.id, frame)))
        c.unsent.append((kind, self.q, m, None, 0))
        if kind != CACHE:
            used = self.q.used
            used[c.id] = used.get(c.id, 0) + 1

    def after_send(
        self, m: QueueMessage, c: Client[Any], req_ack: bool, deadline: float, out: list[Outgoing]
    ) -> None:
        """Bookkeeping after ``m`` was handed to ``c`` outside a drain (pull)."""
        q = self.q
        hooks = q.hooks
        if req_ack:
            q.track(m, c, deadline)
        if hooks.received:
            dl = q.pending.get((c.id, m.message_id)) if req_ack else None
            q.side_effects(
                m, hooks.call(m, "consumer_received", q, dl or Delivery(m, c, 0.0), c), out
            )
        if hooks.end_send:
            q.side_effects(m, hooks.call(m, "end_send", q, m), out)

    def out_message(self, m: QueueMessage) -> Message:
        """What consumers get of ``m`` under the queue's options (cached on ``m``)."""
        life = m.life or m.lived()
        f = self.fresh_message
        if m is not self.fresh or f is None or (f.wire is not None and life.wire is None):
            f = m.message  # (not the one being accepted, or parked since: no wire form)
        opts = self.q.options
        count = life.delivered
        if opts.request_acknowledge or (opts.hide_client_names and f.source) or count:
            source = "" if opts.hide_client_names else f.source
            headers = f.headers
            if count:
                headers = redelivery_headers(headers, count)
            elif opts.request_acknowledge and not f.wants_ack:
                # (derive without its call: the acknowledge wish differs, a new tuple;
                # the usual delivery of an acknowledged queue's message, per message)
                f = _new_message(
                    Message,
                    (
                        f.message_id,
                        source,
                        f.target,
                        self.q.id,
                        f.high_priority,
                        f.first_acquirer,
                        True,
                        f.ttl,
                        headers,
                        f.payload,
                        None,
                    ),
                )
                life.out = f
                life.out_version = self.out_version
                return f
            f = derive(
                f,
                opts.request_acknowledge,
                self.q.id,
                f.message_id,
                source,
                f.target,
                headers,
            )
        life.out = f
        life.out_version = self.out_version
        return f

    # ------------------------------------------------------------------ settling

    def settle_plain(self, client_id: str, count: int, now: float) -> None:
        """The transport took ``count`` fast-path pushes to one consumer: sent, done."""
        q = self.q
        q.deliveries += count
        q.sent += count
        q.last_sent = now
        used = q.used
        n = used.get(client_id, 0) - count
        if n > 0:
            used[client_id] = n
        else:
            used.pop(client_id, None)

    def settle_auto(self, client_id: str, count: int, now: float) -> None:
        """The transport took ``count`` :data:`~broker.engine.flow.AUTO` deliveries to one
        consumer that acknowledges by taking: sent and acknowledged, as the tracked path
        counts them (``settle_sent`` then ``AckTracker.ack_taken``)."""
        self.settle_plain(client_id, count, now)
        q = self.q
        q.acks += count
        q.auto_in_flight -= count

    def quiet(self, headers: Headers) -> bool:
        """Does the handler's quiet test pass ``headers`` now?  False without a test or
        when it raises (the tracked path it leads to asks again and counts the error)."""
        test = self.q.hooks.quiet
        if test is None:
            return False
        try:
            return bool(test(headers))
        except Exception:
            return False

    def materialize(
        self, c: Client[Any], message: Message | QueueMessage, seq: int, now: float
    ) -> QueueMessage | None:
        """An :data:`~broker.engine.flow.AUTO` delivery to ``c`` becomes the tracked one it
        stands for: its queue message (number ``seq``; ``message`` itself when it is one:
        a drain's AUTO delivery keeps the message it took from the queue), in flight,
        waiting in ``pending`` for ``c``'s acknowledge (no deadline: such deliveries are
        made only on a queue without an acknowledge timeout).  What happens to it next
        is the tracked path's.  None: the queue was removed (and took its messages with
        it)."""
        q = self.q
        q.auto_in_flight -= 1
        if not q.alive:
            return None
        if isinstance(message, QueueMessage):  # a drain's: the queue message it sent
            m = message
        else:
            m = QueueMessage(seq, message, None, False, now)
        if q.index is not None:
            q.index.add(m)
        m.state = INFLIGHT
        m.lived()
        q.track(m, c, _INF)
        return m

    def materialize_plain(self, message: Message, seq: int, now: float) -> QueueMessage:
        """A :data:`~broker.engine.flow.PLAIN` push in flight becomes the tracked delivery
        it stands for (``flow.make_tracked``): its queue message (number ``seq``), in
        flight as one copy the transport has not taken, as ``send`` leaves a message of a
        queue without acknowledges.  Settled or returned, it then takes the tracked path
        (``settle_sent`` / ``settle_unsent`` of a ``COPY``)."""
        q = self.q
        m = QueueMessage(seq, message, None, False, now)
        if q.index is not None:
            q.index.add(m)
        m.state = INFLIGHT
        m.lived().unsent = 1
        return m

    def in_send_order(self, client_id: str, message_id: str) -> None:
        """A tracked delivery not yet sent to a consumer that leaves: its ``pending`` entry
        moves to the end (``flow.abandon`` calls it in send order, so the consumer's
        entries, returned in their order, follow the order they were sent in)."""
        key = (client_id, message_id)
        pending = self.pending
        if key in pending:
            pending.move_to_end(key)

    def settle_sent(self, kind: int, client_id: str, m: QueueMessage | None, now: float) -> None:
        """The transport took a delivery (``broker.engine.flow.transmitted``): count it."""
        if kind == PLAIN:
            self.settle_plain(client_id, 1, now)
            return
        q = self.q
        q.deliveries += 1
        q.last_sent = now
        if m is None:  # CACHE
            q.sent += 1
            return
        life = m.life or m.lived()
        if not life.transmitted:
            q.sent += 1  # the first copy of this send
        life.transmitted += 1
        receipts = q.host.receipts
        if receipts.pending:  # (a receipt asked for: this consumer got a copy)
            if kind == ACKED:
                receipts.sent(q.key, m.seq, client_id)
            else:
                receipts.succeeded(q.key, m.seq, client_id)
        life.delivered += 1  # a put-back resets m.out: the next send carries Delivery-Count
        if life.saved:
            q.delivered(m, now)  # the store keeps the count for a restart
        if kind == ACKED:
            return  # the window slot is held until the acknowledge
        self.q.release(client_id)
        life.unsent -= 1
        if life.unsent <= 0 and m.state == INFLIGHT and q.alive:
            q.finish(m)  # (a removed queue took its messages and store with it)

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
        if kind == PLAIN:
            self.q.release(client_id)
            assert frame is not None
            back = QueueMessage(seq, frame, None, False, now)
            if self.q.index is not None:
                self.q.index.add(back)  # (before give_back: a drop finishes it)
            self.give_back(back, out)
            return
        if m is None or kind == ACKED:
            return  # CACHE: nothing left the queue; ACKED: the acknowledge tracker returns it
        self.q.release(client_id)
        m.unsent -= 1
        if kind == BROADCAST:
            self.q.dropped += 1
        if m.unsent > 0 or m.state != INFLIGHT or not self.q.alive:
            return
        if m.transmitted or kind == BROADCAST:
            self.q.finish(m)  # a copy went out: done, as if this consumer had not been there
        else:
            self.give_back(m, out)
