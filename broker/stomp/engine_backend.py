"""The STOMP backend on the broker engine: STOMP and TMQP clients share the same queues.

Two threads meet here.  The engine is driven by one thread only, the TMQP server's loop
(``broker.server``); the STOMP listener (``broker.stomp.server``) runs its asyncio loop
in a thread of its own.  Two objects, one per thread:

* :class:`EngineDoor` (server thread) wraps the engine.  The server drives it as its
  engine (``receive``/``tick``/``transmitted``... are passed through) and it takes from
  every output the items addressed to STOMP connections' client ids: deliveries go to
  the STOMP thread, the rest (engine replies a STOMP client has no use for) is dropped.
  The STOMP side submits typed operations (:meth:`EngineDoor.submit_many`: a deque and
  one octet on a socket pair per batch; the listener hands over one loop iteration's
  operations together); the server polls the pair's reading end
  (:meth:`EngineDoor.fileno`, ``Server.add_reader``) and calls :meth:`EngineDoor.run_ops`,
  whose TMQP output (a STOMP SEND delivered to a TMQP consumer) it sends.
* :class:`EngineBackend` (listener thread) is the :class:`~broker.stomp.backend.Backend`
  the sessions call.  SEND and SUBSCRIBE wait for the engine's answer (a refusal is an
  ERROR frame; a RECEIPT means the engine took the message); ACK/NACK/UNSUBSCRIBE/
  disconnects are submitted without waiting.  Deliveries arrive through
  ``post`` (the listener loop's ``call_soon_threadsafe``) as the engine's queue messages,
  which this side turns into :class:`~broker.stomp.backend.Delivery` values.

The server thread never waits for the listener thread, so the two cannot deadlock.

Mapping (see docs/stomp.md "STOMP on the engine"):

* ``/queue/NAME`` -> channel ``NAME``, queue 0, created on first use in RoundRobin status
  with ``RequestAcknowledge`` on and no acknowledge timeout (each message to one
  consumer, kept until acknowledged); deliveries from the channel's other queues reach a
  ``/queue/NAME`` subscriber too (a channel is what a consumer joins);
* ``/topic/NAME`` -> channel ``/topic/NAME``, queue 0, Broadcast status (every consumer
  online gets a copy; nothing is kept);
* ``/dsub/ID`` -> channel ``/dsub/ID``, queue 0: durable subscription ``ID``
  (``broker.engine.dsubs``), made by ``SUBSCRIBE persistent:true`` with ``id:ID`` on
  ``/topic/`` destinations, destroyed by ``UNSUBSCRIBE persistent:true``;
* those are the virtual host ``default``'s; on virtual host ``V`` each name or id gets
  the prefix ``V/`` (channels ``V/NAME``, ``/topic/V/NAME``, ``/dsub/V/ID``): a
  connection's destinations are named in its virtual host's namespace here
  (``_Conn.in_namespace``; ``broker.stomp.engine_mapping``, ``broker.stomp.vhosts``);
* ack ``auto``: the delivery is acknowledged as soon as the connection takes it -- by
  the engine itself when this side reports it taken (``Engine.acknowledge_taken``, no
  acknowledge per delivery), or from here on a channel two subscriptions of the
  connection share or a wildcard or durable subscription joined;
  ``client``/``client-individual``: on ACK; NACK is a negative acknowledge (the
  message goes back to its queue for the next consumer, ``Delivery-Count`` grows);
  a connection that ends returns what it had not acknowledged;
* ``credit:count,size`` on a queue -> the ``per-message`` handler's credit windows for
  the subscription (``PerMessageRules.set_credit``: a message goes while either window is
  above zero; ACK/NACK give the credit back, a transactional ACK at once through
  :meth:`EngineDoor.op_return_credit`), with the engine window ``max(count,
  BrokerConfig.prefetch)``; on a topic, ``count`` is the engine window (``prefetch``);
  no ``credit`` header: the broker's default window, ``BrokerConfig.prefetch``, 1000;
* ``selector``, ``from-seq`` on a queue -> the handler's per-consumer rules (a message
  nobody with room may take is looked past, not a block); on a topic the listener
  filters each subscriber's copies; ``include-seq`` -> the engine thread adds the
  delivery's queue sequence (``SEQ_HEADER``, hidden) for the listener;
* a connection whose outbound buffer is full keeps further deliveries in order on this
  side without reporting them sent: the engine's window stops the rest.

Beyond these (docs/stomp.md "STOMP on the engine" has the whole table): CONNECT is admitted by
the engine's authorizer (``passcode`` = client token) before CONNECTED; SENDs are
published without waiting (``publish_async``: answers, hence RECEIPTs, once durable for
``persistent:true``); the ``per-message`` delivery handler (``broker.engine.per_message``)
serves ``persistent``, ``expires``, ``message_group``, exclusive consumers and the
owner-only temporary destinations; the engine keeps retained messages (``retain`` on a
``/topic/`` SEND is its ``Retain`` header, ``broker.engine.retain``: one store with TMQP
pushes; refused on a ``/queue/``), a subscriber gets its channel's first; this module
keeps wildcard subscriptions (joined to matching channels as they appear) and each
connection's temporary channels (removed with it).

Limits: an operation waits at most ``answer_timeout`` (10 s) for the engine (the SEND or
SUBSCRIBE is then refused); a connection holds at most its window of deliveries.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from broker.engine import dsubs
from broker.message import Message
from broker.protocol import DeliveredRun, Outgoing
from broker.sequence import FROM_FIRST
from broker.stomp.backend import (
    BatchAnswer,
    ConnectionInfo,
    Delivery,
    DeliverySink,
    PlainRunSink,
    PublishAnswer,
    Refusal,
    RunSink,
)
from broker.stomp.destinations import Destination, DestinationKind
from broker.stomp.engine_browse import BrowsePage
from broker.stomp.engine_door import EngineDoor, Op, Post, Refused, bound
from broker.stomp.engine_durable import durable_plan
from broker.stomp.engine_flow import (
    SubExtras,
    TopicCredit,
    extras_of,
    topic_credit_of,
)
from broker.stomp.engine_mapping import (
    ANONYMOUS,
    HIDDEN_HEADERS,
    SEQ_KEY,
    TIMESTAMP_HEADER,
    USER_HEADER,
    USER_KEY,
    channel_of,
    check_headers,
    destination_of,
    engine_name,
    in_namespace,
    wildcard_matches,
)
from broker.stomp.errors import BackendError
from broker.stomp.frames import Headers
from broker.stomp.handoff import Handoff
from broker.stomp.session import Credentials
from broker.stomp.subscription import (
    DEFAULT_CREDIT_COUNT,
    AckMode,
    PublishSpec,
    PublishStreak,
    SubscriptionSpec,
)
from broker.stomp.vhosts import namespace_of
from broker.store.base import NOT_SAVED

__all__ = ["ANSWER_TIMEOUT", "EngineBackend", "EngineDoor", "SubExtras", "listen"]

log = logging.getLogger(__name__)

#: Seconds a SEND or SUBSCRIBE waits for the engine thread before it is refused.
ANSWER_TIMEOUT = 10.0
#: Connections the statistics name with their held deliveries (the ones holding most).
HELD_SHOWN = 20
#: ``PublishSpec(...)`` from a tuple of every field (``destinations`` first), without the
#: named tuple's ``_replace`` (a SEND on a virtual host other than the default is
#: renamed per message).
_new_spec = tuple.__new__
#: Destination headers kept per connection on a virtual host other than the default,
#: named in its namespace (as the session keeps them parsed: ``DESTINATION_CACHE``).
NAMED_KEPT = 1024


def _resolve(done: concurrent.futures.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


def _not_saved(done: concurrent.futures.Future[None]) -> None:
    """The store failed before the writes ``done`` waited for were durable."""
    if not done.done():
        done.set_exception(BackendError(NOT_SAVED))


@dataclass(slots=True)
class _Sub:
    spec: SubscriptionSpec
    channels: dict[str, Destination]  # engine channel -> its STOMP destination
    patterns: tuple[Destination, ...] = ()  # its wildcard destinations
    #: A browser: the page not yet taken by the connection, and whether it is the last.
    browsing: deque[tuple[int, Message]] | None = None
    browse_done: bool = False
    browse_next: int = FROM_FIRST
    #: A page (or, following, the next message) is asked for and not arrived yet.
    browse_asked: bool = False
    #: The credit windows of its topic deliveries (``engine_flow.TopicCredit``).
    topic_credit: TopicCredit | None = None

    def claim(self, channel: str, conn: int) -> bool:
        """A delivery from ``channel`` matches a wildcard of this subscription: the
        channel is now one of its own."""
        if not any(wildcard_matches(p, channel, conn) for p in self.patterns):
            return False
        self.channels[channel] = destination_of(channel)
        return True


@dataclass(slots=True)
class _Conn:
    info: ConnectionInfo
    sink: DeliverySink
    subs: dict[str, _Sub] = field(default_factory=dict)
    by_channel: dict[str, _Sub] = field(default_factory=dict)
    #: Queue channels two or more subscriptions of this connection consume (one engine
    #: consumer): their subscriptions, taking turns for each delivery.
    shared: dict[str, list[_Sub]] = field(default_factory=dict)
    #: tag -> subscription of deliveries from a shared channel (whose NACK an UNSUBSCRIBE
    #: of the other subscription must not touch).
    tag_sub: dict[int, _Sub] = field(default_factory=dict)
    #: tag -> (windows, octets) of topic deliveries counted against a TopicCredit.
    topic_taken: dict[int, tuple[TopicCredit, int]] = field(default_factory=dict)
    #: tag -> (channel, queue id, message id) of deliveries waiting for ACK/NACK
    pending: dict[int, tuple[str, int, str]] = field(default_factory=dict)
    #: Channels of ``ack:auto`` subscriptions whose deliveries the engine acknowledges
    #: once reported taken (``EngineDoor.op_subscribe`` with ``auto_ack``): no settle
    #: per delivery from here.  Not a channel two subscriptions share, nor one a
    #: wildcard or a durable subscription joined (those are acknowledged from here).
    engine_acked: set[str] = field(default_factory=set)
    held: deque[Message] = field(default_factory=deque)  # not taken by the connection yet
    next_tag: int = 1
    #: The connection's run sink (``attach_runs``): a hand-over's deliveries in one call.
    run_sink: RunSink | None = None
    #: Its plain run sink (``attach_runs``): plain ``ack:auto`` MESSAGEs of one
    #: subscription from their ids and bodies (``_plain_prefix``).
    plain_sink: PlainRunSink | None = None
    #: Its virtual host's namespace (``broker.stomp.vhosts``; "" the default one's), and
    #: the destinations it named, parsed (the session's cache) -> named in it.
    namespace: str = ""
    named: dict[tuple[Destination, ...], tuple[Destination, ...]] = field(default_factory=dict)

    def in_namespace(self, destinations: tuple[Destination, ...]) -> tuple[Destination, ...]:
        """``destinations`` (as the session parsed them) named in this connection's
        virtual host."""
        if not self.namespace:
            return destinations
        found = self.named.get(destinations)
        if found is None:
            if len(self.named) >= NAMED_KEPT:
                self.named.clear()
            found = self.named[destinations] = in_namespace(destinations, self.namespace)
        return found


class EngineBackend:
    """The :class:`~broker.stomp.backend.Backend` on an :class:`EngineDoor` (listener thread)."""

    def __init__(
        self,
        door: EngineDoor,
        *,
        answer_timeout: float = ANSWER_TIMEOUT,
        wall_clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.door = door
        self._facts = _LastFacts()  # the header block delivered last, read
        self.wall_clock_ms = wall_clock_ms
        self.answer_timeout = answer_timeout
        self.conns: dict[int, _Conn] = {}
        self.after_deliveries: Callable[[], None] = lambda: None
        self._ids = 0
        #: Operations of this loop iteration, handed to the door together (one wake-up
        #: of the engine thread per batch, not one per SEND or ACK); see :meth:`bind`.
        self._batch: list[Op] = []
        #: When the batch's last operation settles deliveries of one connection (an
        #: ACK's): that connection and the list it settles, which the connection's next
        #: ACK/NACK joins (a read's ACKs: one engine call).  Any other operation and the
        #: hand-over end it (the list is the engine thread's from then on).
        self._settling: tuple[int, list[tuple[str, int, str, bool]]] | None = None
        self._soon: Post | None = None

    def bind(
        self, post: Post, after_deliveries: Callable[[], None], soon: Post | None = None
    ) -> None:
        """Deliveries reach this thread through ``post``; ``after_deliveries`` then writes
        what the sessions produced (the listener's ``flush_all``).  ``soon`` (the
        listener loop's ``call_soon``) batches the operations of one loop iteration;
        without it each operation is submitted at once."""
        self.after_deliveries = after_deliveries
        self._soon = soon
        self.door.deliver = self._on_deliveries
        self.door.answer = self._on_answers
        self.door.browsed = self._on_browse_page
        self.door.post = post
        self.door.listener_figures = self.figures

    def figures(self) -> dict[str, object]:
        """What the statistics show of this side (any thread: a snapshot of lengths): the
        connections, and the deliveries handed over by the engine that their connection
        has not taken yet (``held``, waiting for room: each still in flight on the
        engine), in all and for the connections holding the most (at most
        ``HELD_SHOWN``, by id)."""
        held = [(len(c.held), cid) for cid, c in list(self.conns.items()) if c.held]
        held.sort(reverse=True)
        return {
            "connections": len(self.conns),
            "held_deliveries": sum(n for n, _ in held),
            "held_by_connection": {str(cid): n for n, cid in held[:HELD_SHOWN]},
        }

    def _submit(self, op: Op) -> None:
        """Queue ``op`` for the engine thread, in order with every other operation."""
        self._settling = None
        if self._soon is None:
            self.door.submit(op)
            return
        batch = self._batch
        batch.append(op)
        if len(batch) == 1:
            self._soon(self._flush_ops)

    def _flush_ops(self) -> None:
        """Hand the batched operations to the door (one wake-up)."""
        self._settling = None
        if self._batch:
            batch, self._batch = self._batch, []
            self.door.submit_many(batch)

    # -- waiting for the engine ------------------------------------------------------------

    def _call(self, op: Callable[[float], list[Outgoing]]) -> None:
        """Run ``op`` on the engine thread and wait for it; a refusal is a BackendError."""
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def run(now: float) -> list[Outgoing]:
            try:
                out = op(now)
            except Refused as exc:
                done.set_exception(BackendError(exc.reason))
                return exc.out
            except BackendError as exc:
                done.set_exception(exc)
                return []
            except BaseException as exc:
                done.set_exception(BackendError(f"broker error: {exc}"))
                raise
            # the answer (a RECEIPT) only once what the operation wrote is durable, and
            # the removals of the messages acknowledged before it too: a RECEIPT promises
            # them (the store does not make an ACK's removal wait; see op_applied)
            self.door.engine.store.removals_answered()
            self.door.after_durable(bound(_resolve, done), bound(_not_saved, done))
            return out

        self._flush_ops()
        self.door.submit(run)
        try:
            done.result(self.answer_timeout)
        except concurrent.futures.TimeoutError:
            raise BackendError("the broker engine did not answer in time") from None

    # -- Backend ---------------------------------------------------------------------------

    def authenticate(self, credentials: Credentials) -> str | None:
        """The session's authenticator: the engine admits the connection (its authorizer
        checks ``passcode`` as the client token) before CONNECTED is sent; None if refused."""
        door, conn = self.door, credentials.connection_id
        login, passcode = credentials.login, credentials.passcode
        try:
            self._call(lambda now: door.op_login(conn, login, passcode, now))
        except BackendError as exc:
            # a late answer may still register it: the disconnect runs after (FIFO)
            self._flush_ops()
            door.submit(lambda now: door.op_disconnect(conn, now))
            if str(exc).startswith("authentication failed"):
                log.info("STOMP connection %d refused by the engine: %s", conn, exc)
                return None
            raise
        return login or ANONYMOUS

    def attach(self, connection: ConnectionInfo, sink: DeliverySink) -> None:
        self.conns[connection.id] = _Conn(
            connection, sink, namespace=namespace_of(connection.virtual_host)
        )
        door, conn = self.door, connection.id
        self._submit(lambda now: door.op_connect(conn, connection, now))  # none if logged in

    def attach_runs(
        self, connection_id: int, sink: RunSink, plain: PlainRunSink | None = None
    ) -> None:
        """:class:`~broker.stomp.backend.RunReceiver`: the deliveries of one hand-over
        from the engine thread go to the connection in one call (``_deliver_to``), the
        plain ``ack:auto`` ones through ``plain`` (``_plain_prefix``)."""
        conn = self.conns.get(connection_id)
        if conn is not None:
            conn.run_sink = sink
            conn.plain_sink = plain

    def detach(self, connection_id: int) -> None:
        if self.conns.pop(connection_id, None) is None:
            return
        door = self.door
        self._flush_ops()
        door.submit(lambda now: door.op_disconnect(connection_id, now))

    def _stamp(self, connection_id: int, spec: PublishSpec) -> tuple[Headers, PublishSpec]:
        """The headers the broker adds to a SEND (its user, its time), after checking the
        user's; the engine thread appends them (no second PublishSpec per SEND).  And the
        SEND named in the connection's virtual host."""
        check_headers(spec.headers)
        conn = self.conns.get(connection_id)
        user = conn.info.user if conn is not None else ANONYMOUS
        if conn is not None and conn.namespace:
            spec = _new_spec(PublishSpec, (conn.in_namespace(spec[0]), *spec[1:]))
        return ((USER_HEADER, user), (TIMESTAMP_HEADER, str(self.wall_clock_ms()))), spec

    def publish_async(self, connection_id: int, spec: PublishSpec, answer: PublishAnswer) -> None:
        """Submit the SEND without waiting (:class:`~broker.stomp.backend.AsyncPublisher`):
        the engine thread runs it in order with this connection's other operations."""
        stamp, spec = self._stamp(connection_id, spec)
        self._ids += 1
        message_id = f"{self.door.id_prefix}{connection_id}-{self._ids}"
        door = self.door
        self._submit(
            lambda now: door.op_publish_answered(
                connection_id, spec, message_id, answer, now, stamp
            )
        )

    def publish_batch(
        self, connection_id: int, streaks: Sequence[PublishStreak], answer: BatchAnswer
    ) -> None:
        """A run of SENDs in one operation (:class:`~broker.stomp.backend.BatchPublisher`):
        the engine thread publishes them in order and stops at the first it refuses.
        Per streak (SENDs alike but their bodies), not per SEND: the headers checked, the
        destinations renamed on a virtual host (once per destinations tuple)."""
        count = 0
        for streak in streaks:
            if streak[1]:  # its headers (none: nothing to refuse, the usual SEND; no call)
                check_headers(streak[1])  # BackendError: nothing handed over
            count += len(streak[2])
        conn = self.conns.get(connection_id)
        user = conn.info.user if conn is not None else ANONYMOUS
        stamp = ((USER_HEADER, user), (TIMESTAMP_HEADER, str(self.wall_clock_ms())))
        if conn is not None and conn.namespace:  # (a streak naming the destinations tuple
            named = conn.in_namespace  # of the one before it takes its renaming)
            last: tuple[Destination, ...] | None = None
            renamed: tuple[Destination, ...] = ()
            in_host = []
            for streak in streaks:
                if streak[0] is not last:
                    last = streak[0]
                    renamed = named(last)
                in_host.append(_new_spec(PublishStreak, (renamed, *streak[1:])))
            streaks = in_host
        first = self._ids + 1
        self._ids += count
        door = self.door
        self._submit(
            lambda now: door.op_publish_batch(connection_id, streaks, first, answer, now, stamp)
        )

    def after_applied(self, connection_id: int, answer: PublishAnswer) -> None:
        """:class:`~broker.stomp.backend.AfterApplied`: ``answer`` once the engine thread
        ran every operation submitted before this one (and its writes are durable)."""
        door = self.door
        self._submit(lambda now: door.op_applied(answer))

    def _on_answers(self, answers: list[tuple[PublishAnswer, Refusal | None]]) -> None:
        for answer, error in answers:
            answer(error)
        self.after_deliveries()

    def publish(self, connection_id: int, spec: PublishSpec) -> None:
        stamp, spec = self._stamp(connection_id, spec)
        self._ids += 1
        message_id = f"{self.door.id_prefix}{connection_id}-{self._ids}"
        door = self.door
        self._call(lambda now: door.op_publish(connection_id, spec, message_id, now, stamp))

    def subscribe(self, connection_id: int, spec: SubscriptionSpec) -> None:
        conn = self.conns[connection_id]
        if conn.namespace:
            spec = dataclasses.replace(spec, destinations=conn.in_namespace(spec.destinations))
        channels: dict[str, Destination] = {}
        if spec.browser:
            for destination in spec.destinations:
                if not destination.wildcard:
                    channels[channel_of(destination)] = destination
            self._browse(connection_id, conn, spec, channels)
            return
        if spec.persistent:
            self._subscribe_durable(connection_id, conn, spec)
            return
        joined: set[str] = set()  # queue channels another subscription here consumes
        for destination in spec.destinations:
            if destination.wildcard:
                continue
            name = channel_of(destination)
            if name in channels:
                raise BackendError(f"{destination.stomp} is named twice")
            if name in conn.by_channel:
                _check_shareable(conn, name, destination, spec)
                joined.add(name)
            channels[name] = destination
        sub = _Sub(spec, channels, tuple(d for d in spec.destinations if d.wildcard))
        sub.topic_credit = topic_credit_of(spec)
        door = self.door
        wanted = [d for d in spec.destinations if d.wildcard or channel_of(d) not in joined]
        # no credit header (the STOMP default): the engine's window (BrokerConfig.prefetch)
        count = spec.credit.count
        prefetch = None if count == DEFAULT_CREDIT_COUNT else max(1, count)
        if sub.topic_credit is not None:  # this side keeps the windows: the engine's own
            prefetch = None
        sub_id, exclusive = spec.id, spec.exclusive
        extras = extras_of(spec)
        # (include-seq: the engine thread reads each delivery's sequence from its
        # ``pending`` entry, which an AUTO delivery has none of: acknowledged from here)
        auto = spec.ack is AckMode.AUTO and not spec.include_seq
        if wanted:
            self._call(
                lambda now: door.op_subscribe(
                    connection_id,
                    sub_id,
                    wanted,
                    prefetch,
                    exclusive,
                    now,
                    extras=extras,
                    auto_ack=auto,
                )
            )
        else:  # nothing to ask the engine: wait for what came before (the RECEIPT's promise)
            self._call(_applied)
        conn.subs[spec.id] = sub
        engine_acked = conn.engine_acked
        for name in channels:
            if name in joined:  # the engine consumer is shared: deliveries take turns
                conn.shared.setdefault(name, [conn.by_channel[name]]).append(sub)
            else:
                conn.by_channel[name] = sub
                if auto:
                    engine_acked.add(name)
        shared = [name for name in joined if name in engine_acked]
        if shared:  # deliveries that take turns are acknowledged from here, by mode
            engine_acked.difference_update(shared)
            self._submit(lambda now: door.op_acknowledge_taken(connection_id, shared, False, now))

    def _subscribe_durable(self, connection_id: int, conn: _Conn, spec: SubscriptionSpec) -> None:
        """``persistent:true`` with ``id``: the durable subscription ``id`` on the /topic/
        destinations (or an existing one, addressed by ``/dsub/<id>``), consumed here."""
        topics, shown = durable_plan(spec, conn.namespace)
        sub_id = engine_name(conn.namespace, spec.id)  # ids are per virtual host
        name = dsubs.channel_name(sub_id)
        if name in conn.by_channel:
            raise BackendError(f"/dsub/{spec.id} is already subscribed on this connection")
        count = spec.credit.count
        prefetch = None if count == DEFAULT_CREDIT_COUNT else max(1, count)
        door = self.door
        self._call(
            lambda now: door.op_subscribe_durable(connection_id, sub_id, topics, prefetch, now)
        )
        sub = _Sub(spec, {name: shown})
        conn.subs[spec.id] = sub
        conn.by_channel[name] = sub

    def _browse(
        self,
        connection_id: int,
        conn: _Conn,
        spec: SubscriptionSpec,
        channels: dict[str, Destination],
    ) -> None:
        """``browser:true``: the messages the queue holds (from ``from-seq``), without
        consuming them, then the ``browser:end`` marker -- or, with ``browser-end:false``,
        no marker: the browser goes on seeing each message the queue takes after that."""
        if len(channels) != 1 or len(spec.destinations) != 1:
            raise BackendError("browser:true takes one queue or topic destination")
        (channel,) = channels
        start = FROM_FIRST if spec.from_seq is None else spec.from_seq
        sub = _Sub(spec, channels, browsing=deque(), browse_next=start, browse_asked=True)
        door, sub_id = self.door, spec.id
        self._call(lambda now: door.op_browse_page(connection_id, sub_id, channel, start, now))
        conn.subs[spec.id] = sub  # (not in by_channel: no engine delivery is for it)

    def _on_browse_page(self, page: BrowsePage) -> None:
        conn = self.conns.get(page.conn)
        sub = conn.subs.get(page.sub_id) if conn is not None else None
        if conn is None or sub is None or sub.browsing is None:
            return  # unsubscribed meanwhile
        sub.browsing.extend(page.entries)
        sub.browse_done = page.done
        sub.browse_asked = False
        if page.entries:
            sub.browse_next = page.entries[-1][0] + 1
        if page.done:  # every message up to page.high it still holds was in the page
            sub.browse_next = max(sub.browse_next, page.high + 1)
        self._pump_browse(page.conn, conn, sub)
        self.after_deliveries()

    def _pump_browse(self, conn_id: int, conn: _Conn, sub: _Sub) -> None:
        """Offer the page to the connection; at its end ask for the next (or end)."""
        pending = sub.browsing
        if pending is None:
            return
        selector = sub.spec.selector
        while pending:
            seq, message = pending[0]
            if selector is not None and not selector.selects(message.headers):
                pending.popleft()  # a browser sees only what it selects
                continue
            delivery = _delivery(sub, message, conn.next_tag, self._facts)._replace(sequence=seq)
            if not conn.sink(delivery):
                return  # resume() goes on
            conn.next_tag += 1
            pending.popleft()
        if sub.browse_asked:
            return  # the next page is on its way
        if not sub.browse_done or not sub.spec.browser_end:
            door, sub_id, start = self.door, sub.spec.id, sub.browse_next
            (channel,) = sub.channels
            sub.browse_asked = True
            if sub.browse_done:  # browser-end:false at the end: wait for the next message
                self._submit(lambda now: door.op_follow(conn_id, sub_id, channel, start, now))
            else:
                self._submit(lambda now: door.op_browse_page(conn_id, sub_id, channel, start, now))
            return
        end = Delivery(sub.spec.id, conn.next_tag, "", "", (), b"", browse_end=True)
        if conn.sink(end):
            conn.next_tag += 1
            sub.browsing = None  # over

    def unsubscribe(self, connection_id: int, subscription_id: str, *, destroy: bool) -> None:
        conn = self.conns.get(connection_id)
        sub = conn.subs.pop(subscription_id, None) if conn is not None else None
        if conn is not None and sub is not None:
            self._drop(connection_id, conn, subscription_id, sub)
        if destroy:  # persistent:true: the durable subscription goes (BackendError if none)
            door = self.door
            sub_id = engine_name(conn.namespace if conn is not None else "", subscription_id)
            self._call(lambda now: door.op_destroy_durable(connection_id, sub_id, now))

    def _drop(self, connection_id: int, conn: _Conn, subscription_id: str, sub: _Sub) -> None:
        if sub.browsing is not None:
            door = self.door
            self._submit(lambda now: door.op_unfollow(connection_id, subscription_id, now))
        names = []  # the channels no other subscription here consumes: left
        for name in sub.channels:
            others = conn.shared.get(name)
            if others is None:
                conn.by_channel.pop(name, None)
                conn.engine_acked.discard(name)
                names.append(name)
                continue
            others.remove(sub)
            conn.by_channel[name] = others[0]
            if len(others) == 1:
                del conn.shared[name]
        # its unacknowledged deliveries go back (not those of a subscription it shared with)
        tag_sub = conn.tag_sub
        settles = [
            (*conn.pending.pop(tag), False)
            for tag, (channel, _q, _m) in list(conn.pending.items())
            if channel in sub.channels and tag_sub.get(tag, sub) is sub
        ]
        for tag in [t for t, owner in tag_sub.items() if owner is sub]:
            del tag_sub[tag]
        if sub.topic_credit is not None:
            credit, taken = sub.topic_credit, conn.topic_taken
            for tag in [t for t, (c, _n) in taken.items() if c is credit]:
                del taken[tag]
        returned = self._return_held(connection_id, conn, settles)
        door = self.door
        leaving = names if returned else []
        unwritten = range(returned)  # (none of them reached the socket)
        self._submit(
            lambda now: door.op_settle(connection_id, settles, returned, now, leaving, unwritten)
        )
        self._submit(lambda now: door.op_unsubscribe(connection_id, names, now))
        if sub.patterns:
            self._submit(lambda now: door.op_drop_wildcard(connection_id, subscription_id, now))

    def _return_held(
        self, connection_id: int, conn: _Conn, settles: list[tuple[str, int, str, bool]]
    ) -> int:
        """A subscription went: the deliveries at the front of ``held`` that no
        subscription of the connection takes now leave it, reported done with (never
        written: not counted sent, not redeliveries) and nacked (appended to
        ``settles``, after the unacknowledged ones): back to the queue now,
        in delivery order, in one settle -- not when the connection has room again (never,
        if its reader stopped), each put back ahead of the ones returned before it (the
        queue's order reversed).  Only the front: the engine counts taken deliveries in
        the order it handed them over, so one behind a delivery still held for another
        subscription waits for it (``_deliver_to`` returns it then).  Returns how many."""
        held = conn.held
        returned = 0
        while held:
            message = held[0]
            if message.target in conn.by_channel or self._wildcard_sub(
                connection_id, conn, message.target
            ):
                break
            held.popleft()
            returned += 1
            if message.wants_ack:
                settles.append((message.target, message.content_type, message.message_id, False))
        return returned

    def ack(self, connection_id: int, tags: Sequence[int]) -> None:
        self._settle(connection_id, tags, True)

    def nack(self, connection_id: int, tags: Sequence[int]) -> None:
        self._settle(connection_id, tags, False)

    def credit(self, connection_id: int, tags: Sequence[int]) -> None:
        """A transactional ACK: the deliveries' subscription credit comes back now (the
        engine's rules, ``op_return_credit``); they stay unacknowledged until the COMMIT
        settles them (no more credit then) -- after an ABORT, until a later ACK, a NACK
        or the connection's end (then they are redelivered)."""
        conn = self.conns.get(connection_id)
        if conn is None:
            return
        self._give_topic_credit(conn, tags)
        keys = [conn.pending[t] for t in tags if t in conn.pending]
        if keys:
            door = self.door
            self._submit(lambda now: door.op_return_credit(connection_id, keys, now))

    def resume(self, connection_id: int) -> None:
        conn = self.conns.get(connection_id)
        if conn is not None and conn.held:
            held = list(conn.held)
            conn.held.clear()
            self._deliver_to(connection_id, conn, held)
        if conn is not None:
            for sub in list(conn.subs.values()):
                if sub.browsing is not None and not conn.held:
                    self._pump_browse(connection_id, conn, sub)

    def _settle(self, connection_id: int, tags: Sequence[int], ok: bool) -> None:
        conn = self.conns.get(connection_id)
        if conn is None:
            return
        self._give_topic_credit(conn, tags)
        settles = [(*conn.pending.pop(t), ok) for t in tags if t in conn.pending]
        if conn.tag_sub:
            for t in tags:
                conn.tag_sub.pop(t, None)
        if settles:
            self._submit_settles(connection_id, settles)

    def _submit_settles(
        self, connection_id: int, settles: list[tuple[str, int, str, bool]]
    ) -> None:
        """Settle ``settles`` on the engine thread, in order with every other operation:
        joined to the batch's last operation when that one settles this connection's
        deliveries too (``_settling``: consecutive ACKs, one ``acknowledge_many``)."""
        joined = self._settling
        if joined is not None and joined[0] == connection_id:
            joined[1].extend(settles)
            return
        door = self.door
        self._submit(lambda now: door.op_settle(connection_id, settles, 0, now))
        if self._soon is not None:  # (else it was handed over at once)
            self._settling = (connection_id, settles)

    def _give_topic_credit(self, conn: _Conn, tags: Sequence[int]) -> None:
        """Topic deliveries acknowledged (or transactionally): their credit comes back
        once (a later ACK of the same tag gives nothing)."""
        taken = conn.topic_taken
        if taken:
            for t in tags:
                entry = taken.pop(t, None)
                if entry is not None:
                    entry[0].give(entry[1])

    # -- deliveries --------------------------------------------------------------------------

    def _wildcard_sub(self, conn_id: int, conn: _Conn, channel: str) -> _Sub | None:
        for sub in conn.subs.values():
            if sub.patterns and sub.claim(channel, conn_id):
                conn.by_channel[channel] = sub
                return sub
        return None

    def _on_deliveries(self, by_conn: dict[int, list[Message | DeliveredRun]]) -> None:
        for conn_id, items in by_conn.items():
            conn = self.conns.get(conn_id)
            if conn is None:
                continue  # detached: the engine returns them when it hears of it
            if conn.held:
                conn.held.extend(_frames(items))
            else:
                self._deliver_to(conn_id, conn, items)
        self.after_deliveries()

    def _deliver_to(
        self, conn_id: int, conn: _Conn, items: Sequence[Message | DeliveredRun]
    ) -> None:
        """Offer the deliveries ``items`` stand for to the connection in order; what it
        cannot take now waits in ``held`` (until ``resume``); what it took (or a topic
        copy its subscription does not select) is reported taken, and settled when it is
        acknowledged by taking.  Deliveries go out in runs through the connection's run
        sink (one call, its room read once), one by one where a topic credit decides per
        delivery; the leading runs of plain ``ack:auto`` deliveries through the plain
        sink: a run the engine made as one (``DeliveredRun``) whole (:meth:`_plain_run`),
        single messages in stretches (:meth:`_plain_prefix`).  A run it cannot take
        that way becomes its messages (``DeliveredRun.frames``), held or offered as
        those."""
        taken = 0
        unwritten: list[int] = []  # (positions among the taken that never reached it)
        start = 0  # (the leading runs handed whole)
        if conn.plain_sink is not None:
            n = len(items)
            while start < n:
                item = items[start]
                if item.__class__ is not DeliveredRun:
                    break
                whole: DeliveredRun = item
                took = self._plain_run(conn, whole)
                if took <= 0:
                    break
                taken += took
                start += 1
                if took < len(whole.messages):  # the connection is full: the rest waits
                    conn.held.extend(whole.frames()[took:])
                    conn.held.extend(_frames(items[start:]))
                    start = n
                    break
        messages = _frames(items[start:] if start else items)
        if conn.plain_sink is not None:
            n = len(messages)
            i = 0
            while i < n:
                took = self._plain_prefix(conn, messages, i)
                if took < 0:  # the connection is full: the rest waits
                    i -= took
                    conn.held.extend(messages[i:])
                    messages = []
                    break
                if took == 0:
                    break
                i += took
            taken += i
            if i and messages:
                messages = messages[i:]
        facts = self._facts
        settles: list[tuple[str, int, str, bool]] = []
        run: list[tuple[Delivery, Message, _Sub, list[_Sub] | None]] = []
        pending = iter(messages)
        stopped = False
        for message in pending:
            sub = conn.by_channel.get(message.target)
            shared = conn.shared.get(message.target) if conn.shared else None
            if shared is not None:  # subscriptions sharing the queue take turns
                sub = shared.pop(0)
                shared.append(sub)
            if sub is None:
                sub = self._wildcard_sub(conn_id, conn, message.target)
            if sub is None:  # unsubscribed meanwhile: back to the queue
                if run:  # (those before it first: its position among the taken is known)
                    took, stopped = self._hand_before(conn, run, settles, message, pending)
                    taken += took
                    if stopped:
                        break
                    run = []
                if message.wants_ack:  # (nacked: not counted sent, not a redelivery)
                    unwritten.append(taken)
                    settles.append(
                        (message.target, message.content_type, message.message_id, False)
                    )
                taken += 1
                continue
            selector = sub.spec.selector
            if (
                selector is not None
                and not message.wants_ack  # (a queue applies the selector itself)
                and not selector.selects(message.headers)
            ):
                taken += 1  # a topic copy this subscription does not select: dropped
                continue
            credit = sub.topic_credit
            if conn.run_sink is not None and (credit is None or message.wants_ack):
                run.append(
                    (
                        _delivery(sub, message, conn.next_tag + len(run), facts),
                        message,
                        sub,
                        shared,
                    )
                )
                continue
            if run:  # (those before it first: a credit decision needs them settled)
                took, stopped = self._hand_before(conn, run, settles, message, pending)
                taken += took
                if stopped:
                    break
                run = []
            if credit is not None and not message.wants_ack and not credit.open():
                taken += 1  # a topic copy beyond the subscription's credit: dropped
                continue
            tag = conn.next_tag
            if not conn.sink(_delivery(sub, message, tag, facts)):
                conn.held.append(message)
                conn.held.extend(pending)
                stopped = True
                break
            conn.next_tag += 1
            taken += 1
            if credit is not None and not message.wants_ack:
                size = len(message.payload)
                credit.take(size)
                conn.topic_taken[tag] = (credit, size)
                continue
            self._taken(conn, tag, message, sub, shared, settles)
        if run and not stopped:
            took = self._hand_run(conn, run, settles)
            taken += took
            conn.held.extend(m for _, m, _, _ in run[took:])
        if taken or settles:
            door = self.door
            self._submit(lambda now: door.op_settle(conn_id, settles, taken, now, (), unwritten))

    def _plain_sub(self, conn: _Conn, target: str, headers: Headers) -> _Sub | None:
        """The subscription plain ``ack:auto`` deliveries from ``target`` with the
        header block ``headers`` go to through the plain sink: the one subscription of
        the connection that consumes the channel alone (not shared, no selector or
        credit), the block with nothing to carry (no user header, redelivery or
        sequence).  None: they take the usual path."""
        sub = conn.by_channel.get(target)
        if (
            sub is None
            or sub.topic_credit is not None
            or sub.spec.selector is not None
            or sub.spec.ack is not AckMode.AUTO
            or (conn.shared and target in conn.shared)
        ):
            return None
        if headers:
            facts = self._facts(headers)
            if facts[0] or facts[1] or facts[3] is not None:
                return None
        return sub

    def _plain_run(self, conn: _Conn, run: DeliveredRun) -> int:
        """A run of AUTO deliveries the engine made as one, handed to the connection's
        plain sink in one call when its subscription takes them plainly
        (:meth:`_plain_sub`; the engine acknowledges them by taking): uniform by
        construction (one target, one header block, ids), nothing to check per delivery.
        Returns how many the sink took (their tags are the connection's next ones): 0
        when none (not plain here or on the session's side, or the connection is full:
        the usual path decides)."""
        target = run.target
        if target not in conn.engine_acked:
            return 0
        sub = self._plain_sub(conn, target, run.headers)
        if sub is None:
            return 0
        assert conn.plain_sink is not None
        took = conn.plain_sink(sub.spec.id, sub.channels[target].stomp, run.ids(), run.bodies())
        if took <= 0:
            return 0
        conn.next_tag += took
        return took

    def _plain_prefix(self, conn: _Conn, messages: list[Message], start: int) -> int:
        """The run of ``messages`` from ``start`` on that are plain ``ack:auto``
        deliveries, handed to the connection's plain sink in one call: one channel
        whose subscription takes them plainly (:meth:`_plain_sub`), nothing to settle
        per delivery (the engine acknowledges by taking, or the message wants no
        acknowledge), one header block, an id STOMP carries (no NUL).  The sink writes
        what the run sink would for their deliveries (and checks its side: ack mode,
        version, headers to add; else it takes none and the usual path follows).

        Returns how many it took (their tags are the connection's next ones), negated
        when it took fewer than the run (the connection is full: the caller holds the
        rest), 0 when ``messages[start]`` is not such a delivery or none was taken."""
        first = messages[start]
        target = first.target
        headers = first.headers
        sub = self._plain_sub(conn, target, headers)
        if sub is None:
            return 0
        acked = target in conn.engine_acked  # (else only messages wanting no acknowledge)
        end = start
        for message in itertools.islice(messages, start, None):
            if (
                message.target != target
                or message.headers is not headers
                or (message.wants_ack and not acked)
                or not message.message_id
                or "\0" in message.message_id  # (STOMP cannot carry it: _delivery's id)
            ):
                break
            end += 1
        if end == start:
            return 0
        run = messages[start:end] if start or end < len(messages) else messages
        assert conn.plain_sink is not None
        took = conn.plain_sink(
            sub.spec.id,
            sub.channels[target].stomp,
            [m.message_id for m in run],
            [m.payload for m in run],
        )
        if took <= 0:  # (-1: not plain on the session's side; 0: full, the usual path holds)
            return 0
        conn.next_tag += took
        return took if took == len(run) else -took

    def _hand_before(
        self,
        conn: _Conn,
        run: list[tuple[Delivery, Message, _Sub, list[_Sub] | None]],
        settles: list[tuple[str, int, str, bool]],
        message: Message,
        pending: Iterator[Message],
    ) -> tuple[int, bool]:
        """The run waiting before ``message`` handed over first (``_hand_run``): how
        many the connection took, and whether it stopped -- it took only part of the
        run, so the rest, ``message`` and what follows it (``pending``) wait in
        ``held``, in order."""
        took = self._hand_run(conn, run, settles)
        if took == len(run):
            return took, False
        conn.held.extend(m for _, m, _, _ in run[took:])
        conn.held.append(message)
        conn.held.extend(pending)
        return took, True

    def _hand_run(
        self,
        conn: _Conn,
        run: list[tuple[Delivery, Message, _Sub, list[_Sub] | None]],
        settles: list[tuple[str, int, str, bool]],
    ) -> int:
        """The run's deliveries (tags from ``conn.next_tag`` on) to the run sink; the
        ones it took are the connection's (``_taken``); returns how many."""
        assert conn.run_sink is not None
        took = conn.run_sink([d for d, _, _, _ in run])
        engine_acked = conn.engine_acked
        auto = AckMode.AUTO
        for delivery, message, sub, shared in run[:took]:
            if not message.wants_ack or (sub.spec.ack is auto and message.target in engine_acked):
                continue  # (what _taken does for it: nothing; without its call)
            self._taken(conn, delivery.tag, message, sub, shared, settles)
        conn.next_tag += took
        return took

    @staticmethod
    def _taken(
        conn: _Conn,
        tag: int,
        message: Message,
        sub: _Sub,
        shared: list[_Sub] | None,
        settles: list[tuple[str, int, str, bool]],
    ) -> None:
        """A delivery the connection took: settled now (``ack:auto``, unless the engine
        does it) or pending its ACK."""
        if not message.wants_ack:
            return
        if sub.spec.ack is AckMode.AUTO:
            if message.target not in conn.engine_acked:
                settles.append((message.target, message.content_type, message.message_id, True))
            return
        conn.pending[tag] = (message.target, message.content_type, message.message_id)
        if shared is not None:
            conn.tag_sub[tag] = sub


def _applied(now: float) -> list[Outgoing]:
    """An operation that does nothing: run through :meth:`EngineBackend._call`, it returns
    once every operation submitted before it took effect and its writes (the removals of
    acknowledged messages included) are durable (a SUBSCRIBE the engine need not hear of
    still answers its RECEIPT only then)."""
    return []


def _check_shareable(
    conn: _Conn, name: str, destination: Destination, spec: SubscriptionSpec
) -> None:
    """A second subscription of one connection to a queue shares its engine consumer (and
    its window): only plain ones may (BackendError otherwise): a ``/queue/`` destination,
    no selector, ``credit``, ``from-seq``, ``include-seq`` or ``exclusive`` on any of them
    (the engine applies those per consumer), no wildcard."""
    subs = conn.shared.get(name) or [conn.by_channel[name]]
    plain = destination.kind is DestinationKind.QUEUE and all(
        extras_of(s.spec) is None and not s.spec.exclusive and not s.patterns
        for s in (*subs, _Sub(spec, {}, tuple(d for d in spec.destinations if d.wildcard)))
    )
    if not plain:
        raise BackendError(
            f"{destination.stomp} is already subscribed on this connection (a second "
            "subscription to a queue takes no selector, credit, from-seq, include-seq "
            "or exclusive, and neither may the first)"
        )


#: ``Delivery(...)`` from a tuple of every field, without the named tuple's Python-level
#: ``__new__`` (one per message delivered).
_new_delivery = tuple.__new__


def _delivery(sub: _Sub, message: Message, tag: int, last: _LastFacts) -> Delivery:
    headers = message.headers
    if headers:
        facts = last.facts if headers is last.headers else last(headers)  # (no call if kept)
        sender = facts[2] if facts[2] is not None else message.source or None
    else:
        facts = _NO_FACTS
        sender = message.source or None
    message_id = message.message_id
    if not message_id or "\0" in message_id:  # (none, or one STOMP cannot carry: ours)
        message_id = f"tag-{tag}"
    return _new_delivery(
        Delivery,
        (
            sub.spec.id,
            tag,
            message_id,
            sub.channels[message.target].stomp,
            facts[0],
            bytes(message.payload),
            facts[1],
            facts[3],
            facts[4],
            sender,
            False,
        ),
    )


#: What :func:`_header_facts` reads of a header block: the user headers, redeliveries,
#: the sender (None: the message's source), the queue sequence, the timestamp (ms).
_Facts = tuple[tuple[tuple[str, str], ...], int, str | None, int | None, int | None]
_NO_FACTS: _Facts = ((), 0, None, None, None)


def _header_facts(headers: tuple[tuple[str, str], ...]) -> _Facts:
    redeliveries = 0
    sequence: int | None = None
    sender: str | None = None
    timestamp: int | None = None
    carried: list[tuple[str, str]] = []
    for key, value in headers:
        lower = key.lower()
        if lower in HIDDEN_HEADERS:
            if lower == "delivery-count":
                with contextlib.suppress(ValueError):
                    redeliveries = max(0, int(value) - 1)
            elif lower == USER_KEY:
                sender = value
            elif lower == SEQ_KEY:
                with contextlib.suppress(ValueError):
                    sequence = int(value)
            elif value.isdigit():
                timestamp = int(value)
            continue
        if "\0" in key or "\0" in value:  # (a TMQP header STOMP cannot carry: left out)
            continue
        carried.append((key, value))
    return tuple(carried), redeliveries, sender, sequence, timestamp


class _LastFacts:
    """:func:`_header_facts` of the header block asked last, kept: the deliveries of a
    run of SENDs share one block (the door's user and time stamp), one object."""

    __slots__ = ("facts", "headers")

    def __init__(self) -> None:
        self.headers: tuple[tuple[str, str], ...] = ()
        self.facts = _NO_FACTS

    def __call__(self, headers: tuple[tuple[str, str], ...]) -> _Facts:
        if headers is not self.headers:
            self.facts = _header_facts(headers)
            self.headers = headers
        return self.facts


def _written_by_handoff() -> None:
    """``EngineBackend.after_deliveries`` under :func:`listen`: nothing to do, the
    handoff's batch ends with the listener's ``flush_all``."""


def listen(
    door: EngineDoor,
    add_reader: Callable[[Any, Callable[[float], list[Any]]], None],
    options: Any,
    *,
    gate: Any = None,
) -> Any:
    """A :class:`~broker.stomp.server.StompListener` (not started) on ``door``, whose
    operations the server loop runs (``add_reader`` is ``Server.add_reader``); ``gate``:
    the server's ``OutputGate`` when the engine has a durable store (``Server.gate``)."""
    from broker.stomp.server import StompListener

    if gate is not None:
        door.after_durable = gate.call

    backend = EngineBackend(door)
    listener = StompListener(backend, options, authenticator=backend.authenticate)
    # what the engine thread hands over is written once per batch (Handoff's ``after``),
    # not after each call of it
    handoff = Handoff(lambda fn: listener.loop.call_soon_threadsafe(fn), listener.flush_all)
    backend.bind(
        handoff.post,
        _written_by_handoff,
        lambda fn: listener.loop.call_soon(fn),
    )
    add_reader(door.fileno(), door.run_ops)
    return listener


def _frames(items: Sequence[Message | DeliveredRun]) -> list[Message]:
    """``items`` as the messages they stand for (a run: its deliveries' frames); the
    list itself when it holds no run."""
    for item in items:
        if item.__class__ is DeliveredRun:
            break
    else:
        return items  # type: ignore[return-value]  # (messages only)
    messages: list[Message] = []
    for item in items:
        if item.__class__ is DeliveredRun:
            messages += item.frames()
        else:
            messages.append(item)  # type: ignore[arg-type]
    return messages
