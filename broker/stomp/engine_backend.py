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

Mapping (see README "STOMP on the engine"):

* ``/queue/NAME`` -> channel ``NAME``, queue 0, created on first use in RoundRobin status
  with ``RequestAcknowledge`` on and no acknowledge timeout (each message to one
  consumer, kept until acknowledged); deliveries from the channel's other queues reach a
  ``/queue/NAME`` subscriber too (a channel is what a consumer joins);
* ``/topic/NAME`` -> channel ``/topic/NAME``, queue 0, Broadcast status (every consumer
  online gets a copy; nothing is kept);
* ``/dsub/ID`` -> channel ``/dsub/ID``, queue 0: durable subscription ``ID``
  (``broker.engine.dsubs``), made by ``SUBSCRIBE persistent:true`` with ``id:ID`` on
  ``/topic/`` destinations, destroyed by ``UNSUBSCRIBE persistent:true``;
* ack ``auto``: the delivery is acknowledged to the engine as soon as the connection
  takes it; ``client``/``client-individual``: on ACK; NACK is a negative acknowledge (the
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

Beyond these (README "STOMP on the engine" has the whole table): CONNECT is admitted by
the engine's authorizer (``passcode`` = client token) before CONNECTED; SENDs are
published without waiting (``publish_async``: answers, hence RECEIPTs, once durable for
``persistent:true``); the ``per-message`` delivery handler (``broker.engine.per_message``)
serves ``persistent``, ``expires``, ``message_group``, exclusive consumers and the
owner-only temporary destinations; this module keeps retained topic messages, wildcard
subscriptions (joined to matching channels as they appear) and each connection's
temporary channels (removed with it).

Limits: an operation waits at most ``answer_timeout`` (10 s) for the engine (the SEND or
SUBSCRIBE is then refused); a connection holds at most its window of deliveries.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import socket
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from broker import tmqp
from broker.engine import dsubs, tmqp_door
from broker.engine.auth import Action
from broker.engine.delivery import PerMessageDeliveryHandler
from broker.engine.engine import Engine
from broker.engine.errors import ClientRejected, OperationError
from broker.engine.options import ChannelOptions, ChannelQueueOptions
from broker.engine.per_message import PER_MESSAGE, Credit, PerMessageRules
from broker.engine.queue import reading
from broker.message import Headers, Message
from broker.protocol import (
    ConnectionInfo as EngineConnectionInfo,
)
from broker.protocol import (
    Header,
    MessageType,
    NackReason,
    Outgoing,
    QueueStatus,
    ResultCode,
    Tracked,
    header,
)
from broker.sequence import FROM_FIRST
from broker.stomp.backend import ConnectionInfo, Delivery, DeliverySink, PublishAnswer
from broker.stomp.destinations import Destination, DestinationKind, temp_owner
from broker.stomp.errors import BackendError
from broker.stomp.session import Credentials
from broker.stomp.subscription import (
    DEFAULT_CREDIT_COUNT,
    AckMode,
    PublishSpec,
    RetainAction,
    SubscriptionSpec,
)
from broker.stomp.subscription import (
    Credit as CreditSpec,
)
from zproto.errors import EncodeError

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Queue id of every channel a STOMP destination maps to.
QUEUE_ID = 0
#: Messages one browse step reads from a queue (the next step starts once they are taken).
BROWSE_PAGE = 500
#: Seconds a SEND or SUBSCRIBE waits for the engine thread before it is refused.
ANSWER_TIMEOUT = 10.0
#: Options of a queue created for ``/queue/NAME``: one consumer per message, acknowledged.
#: Its delivery handler reads ``persistent``/``expires`` per message (``per_message``).
QUEUE_OPTIONS = ChannelQueueOptions(
    status=QueueStatus.ROUND_ROBIN,
    request_acknowledge=True,
    acknowledge_timeout=0,
    message_delivery_handler=PER_MESSAGE,
)
#: Options of a queue created for ``/topic/NAME``: a copy to every consumer online.
TOPIC_OPTIONS = ChannelQueueOptions(status=QueueStatus.BROADCAST)
#: Headers a STOMP SEND gets on the engine: its sender's user id and when the broker
#: received it (ms since the epoch), for ``add_user_header``/``add_timestamp_header``.
USER_HEADER = "Stomp-User"
TIMESTAMP_HEADER = "Stomp-Timestamp"
#: Header the engine thread adds to a queue delivery for an ``include-seq`` subscription:
#: the message's sequence in its queue (read into ``Delivery.sequence``, never shown).
SEQ_HEADER = "Stomp-Seq"
_USER = USER_HEADER.lower()
_SEQ = SEQ_HEADER.lower()
#: Engine headers a STOMP consumer does not see as user headers (read into the delivery).
_HIDDEN = frozenset({"delivery-count", _USER, TIMESTAMP_HEADER.lower(), _SEQ})
#: The user id of a connection without ``login``.
ANONYMOUS = "anonymous"
#: Headers a STOMP SEND may not carry: the engine acts on them, or the broker sets them.
_RESERVED = frozenset({"cc", "delivery-count", _USER, TIMESTAMP_HEADER.lower(), _SEQ})

#: An operation run on the engine thread: ``now`` in, TMQP output out.
Op = Callable[[float], list[Outgoing]]
#: Runs a function on the listener's thread (``loop.call_soon_threadsafe``).
Post = Callable[[Callable[[], None]], Any]


def check_headers(headers: Headers) -> None:
    """Refuse (BackendError) SEND headers a TMQP client could not receive (a name holding
    ``:`` or a value holding a line break, after STOMP unescaping; more than a TMQP
    header block holds) or that the engine would act on (``CC``, ``Delivery-Count``)."""
    if not headers:
        return  # nothing to refuse (the common SEND: only control headers)
    for key, _value in headers:
        if key.lower() in _RESERVED:
            raise BackendError(f"header {key!r} is reserved by the broker")
    try:
        tmqp_door.encode(Message("m", "s", "c", headers=headers))
    except EncodeError as exc:
        raise BackendError(f"headers cannot be carried to every client: {exc}") from None


#: Topic channels are named after their STOMP destination (queue channels: the bare name).
TOPIC_CHANNEL_PREFIX = "/topic/"


def channel_of(destination: Destination) -> str:
    """The engine channel a (non-wildcard) STOMP destination maps to."""
    if destination.kind is DestinationKind.TOPIC:
        return TOPIC_CHANNEL_PREFIX + destination.name
    if destination.kind is DestinationKind.DSUB:
        return dsubs.channel_name(destination.name)
    return destination.name


class EngineDoor:
    """The engine, as the server drives it, with STOMP connections beside TMQP peers.

    Everything but :meth:`submit` is called on the server's thread.
    """

    def __init__(self, engine: Engine, clock: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self.clock = clock
        if PER_MESSAGE not in engine.handlers:  # the CLI registers it before recovery
            engine.handlers[PER_MESSAGE] = PerMessageDeliveryHandler(engine.config.wall_clock)
        #: Runs a function once the store's writes so far are durable (the server's
        #: ``OutputGate.call``; without a store: at once).  Receipts and deliveries wait.
        self.after_durable: Callable[[Callable[[], None]], None] = _at_once
        self._ops: deque[Op] = deque()
        self._woken = False  # a wake-up octet is on its way (see submit)
        self._rx, self._tx = socket.socketpair()
        self._rx.setblocking(False)
        self._tx.setblocking(False)
        self.post: Post | None = None  # set by EngineBackend.bind
        self.deliver: Callable[[list[tuple[int, Message]]], None] | None = None
        #: Takes a browse page on the listener thread (EngineBackend.bind).
        self.browsed: Callable[[_BrowsePage], None] | None = None
        #: Runs a batch of publish answers on the listener thread (EngineBackend.bind).
        self.answer: Callable[[list[tuple[PublishAnswer, str | None]]], None] | None = None
        self._answers: list[tuple[PublishAnswer, str | None]] = []
        #: While run_ops runs: what it posts to the listener thread, posted as one call
        #: at its end (one loop wake-up per batch, not one per kind of output).
        self._posting: list[Callable[[], None]] | None = None
        #: Connections one of whose asynchronous SENDs was refused: their ERROR is on its
        #: way, so their later SENDs and SUBSCRIBEs take no effect (as if processed in turn).
        self.failed: set[int] = set()
        #: STOMP connections' engine client ids -> connection ids, and back.
        self.conn_of: dict[str, int] = {}
        self.client_of: dict[int, str] = {}
        #: The last ``retain:set`` message of each topic channel (memory only).
        self.retained: dict[str, Message] = {}
        #: Wildcard subscriptions by (connection, subscription id).
        self.wild: dict[tuple[int, str], _Wild] = {}
        #: Per connection: the channels it consumes exclusively, its temporary channels.
        self.exclusive_of: dict[int, set[str]] = {}
        #: (connection, queue channel) of subscriptions with ``include-seq``, and of
        #: those with a selector or credit registered in the handler's rules.
        self.seq_wanted: set[tuple[int, str]] = set()
        self.ruled: set[tuple[int, str]] = set()
        self.temps_of: dict[int, set[str]] = {}
        handler = engine.handlers[PER_MESSAGE]
        #: The rules of the ``per-message`` handler (groups, exclusive consumers, owners).
        self.handler: PerMessageRules | None = (
            handler.rules if isinstance(handler, PerMessageDeliveryHandler) else None
        )
        self._drop_stale_temporaries()

    def _drop_stale_temporaries(self) -> None:
        """Temporary destinations recovered from the store belonged to connections of an
        earlier run: removed, so a new connection with the same id cannot inherit them."""
        registry = self.engine.channel_registry
        out: list[Outgoing] = []
        for name in [n for n in self.engine.channels if temp_owner(n) is not None]:
            with contextlib.suppress(OperationError):
                registry.remove_channel(self.engine.channels[name], out)
        self.closed = False

    # -- the engine, passed through (what the server calls) ------------------------------

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def connect(self, info: EngineConnectionInfo, now: float, *, replace: bool = False) -> Any:
        client_id, out = self.engine.connect(info, now, replace=replace)
        return client_id, self._split(out)

    def receive(self, client_id: str, frame: Any, now: float, data: bytes | None = None) -> Any:
        return self._split(self.engine.receive(client_id, frame, now, data))

    def disconnect(self, client_id: str, now: float) -> list[Outgoing]:
        return self._split(self.engine.disconnect(client_id, now))

    def transmitted(self, counts: Any, now: float) -> list[Outgoing]:
        return self._split(self.engine.transmitted(counts, now))

    def tick(self, now: float) -> list[Outgoing]:
        return self._split(self.engine.tick(now))

    def next_deadline(self) -> float | None:
        return self.engine.next_deadline()

    def stats(self) -> dict[str, object]:
        return self.engine.stats()

    def stats_page(self, after: str | None, budget: int) -> tuple[dict[str, object], str | None]:
        return self.engine.stats_page(after, budget)

    # -- the meeting point ----------------------------------------------------------------

    def fileno(self) -> int:
        """The descriptor the server polls: readable when operations wait."""
        return self._rx.fileno()

    def submit(self, op: Op) -> None:
        """Queue ``op`` for the engine thread and wake it (any thread).

        One wake-up octet per batch: none is sent while one is on its way (``_woken``,
        cleared by :meth:`run_ops` before it takes the operations, so an operation
        queued after that clearing sends a new one)."""
        self.submit_many((op,))

    def submit_many(self, ops: Iterable[Op]) -> None:
        """Queue ``ops`` in order with one wake-up (any thread)."""
        self._ops.extend(ops)
        if self._woken:
            return
        self._woken = True
        try:
            self._tx.send(b"\0")
        except (BlockingIOError, InterruptedError):
            pass  # the pair is full of wake-ups already: the server will run the ops
        except OSError:
            pass  # closed: the door is shutting down

    @property
    def pending_ops(self) -> int:
        """Operations submitted and not run yet."""
        return len(self._ops)

    def run_ops(self, now: float) -> list[Outgoing]:
        """Run every submitted operation (server thread); returns TMQP-bound output."""
        try:
            while self._rx.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        self._woken = False
        out: list[Outgoing] = []
        ops = self._ops
        posting: list[Callable[[], None]] = []
        self._posting = posting
        try:
            while ops:
                op = ops.popleft()
                try:
                    out.extend(op(now))
                except Exception:
                    log.exception("STOMP operation failed on the engine")
            keep = self._split(out)
            if self._answers and self.answer is not None:
                answers, self._answers = self._answers, []
                # after the deliveries (posted by _split), once the messages are durable
                self.after_durable(_bind(self._post, _bind(self.answer, answers)))
        finally:
            self._posting = None
        if len(posting) == 1:
            self._post(posting[0])
        elif posting:
            self._post(_bind(_run_all, posting))
        return keep

    def close(self) -> None:
        self.closed = True
        self._rx.close()
        self._tx.close()

    def _split(self, out: list[Outgoing]) -> list[Outgoing]:
        """Output for TMQP peers; deliveries for STOMP connections go to their thread."""
        conn_of = self.conn_of
        if not conn_of or not out:
            return out
        keep: list[Outgoing] = []
        mine: list[tuple[int, Message]] = []
        for item in out:
            conn = conn_of.get(item[0])
            if conn is None:
                keep.append(item)
            elif item.__class__ is Tracked:
                message: Message = item[1]  # type: ignore[assignment]  # Tracked: a Message
                if self.seq_wanted and (conn, message.target) in self.seq_wanted:
                    message = self._with_seq(item[0], message)
                mine.append((conn, message))
            # else: a TMQP reply to a STOMP connection (its answer is read by the operation)
        if mine:
            self._post_deliveries(mine)
        return keep

    def _with_seq(self, client_id: str, message: Message) -> Message:
        """``message`` (a queue delivery to ``client_id``) with its queue sequence."""
        channel = self.engine.channels.get(message.target)
        queue = channel.queues.get(message.content_type) if channel is not None else None
        delivery = queue.pending.get((client_id, message.message_id)) if queue else None
        if delivery is None:
            return message  # no acknowledge tracked (not a queue delivery): no sequence
        return message.replace(headers=(*message.headers, (SEQ_HEADER, str(delivery.message.seq))))

    def _post(self, fn: Callable[[], None]) -> None:
        if self._posting is not None:
            self._posting.append(fn)
            return
        assert self.post is not None
        try:
            self.post(fn)
        except RuntimeError:  # the listener's loop is closed: the connections are gone
            log.debug("STOMP listener stopped; deliveries left unsent")

    # -- operations (server thread) -------------------------------------------------------

    def op_connect(self, conn: int, info: ConnectionInfo, now: float) -> list[Outgoing]:
        """Register a connection whose CONNECT needs no engine check (see op_login)."""
        try:
            return self.op_login(conn, info.user or None, None, now)
        except BackendError as exc:
            log.warning("engine refused STOMP connection %d: %s", conn, exc)
            return []

    def op_login(
        self, conn: int, login: str | None, passcode: str | None, now: float
    ) -> list[Outgoing]:
        """Register a connection as an engine client: ``login`` is its name, ``passcode``
        its ``Client-Token``, checked by the engine's authorizer (BackendError if refused)."""
        if conn in self.client_of:
            return []
        engine_info = EngineConnectionInfo(name=login or None, type="stomp", token=passcode)
        try:
            client_id, out = self.engine.connect(engine_info, now)
        except ClientRejected as exc:
            raise BackendError(f"authentication failed: {exc.reason}") from None
        self.conn_of[client_id] = conn
        self.client_of[conn] = client_id
        return out

    def op_disconnect(self, conn: int, now: float) -> list[Outgoing]:
        """The connection ended: its engine client, wildcard subscriptions, exclusive
        marks and temporary destinations (channels ``temp.<broker>.<conn>.*``) go."""
        self.failed.discard(conn)
        client_id = self.client_of.pop(conn, None)
        if client_id is None:
            return []
        out = self.engine.disconnect(client_id, now)
        self.conn_of.pop(client_id, None)  # after: what it returns is for the others
        for key in [k for k in self.wild if k[0] == conn]:
            del self.wild[key]
        self._forget_rules(conn, client_id, None)
        for channel in self.exclusive_of.pop(conn, ()):
            if self.handler is not None:
                self.handler.set_exclusive(channel, client_id, False)
        registry = self.engine.channel_registry
        for name in self.temps_of.pop(conn, ()):
            self.retained.pop(name, None)
            if self.handler is not None:
                self.handler.set_owner(name, None)
            temp = self.engine.channels.get(name)
            if temp is not None:
                try:
                    registry.remove_channel(temp, out)
                except OperationError as exc:
                    log.warning("temporary destination %s not removed: %s", name, exc.reason)
        return out

    def _client(self, conn: int) -> str:
        client_id = self.client_of.get(conn)
        if client_id is None:
            raise BackendError("not connected to the broker engine")
        if conn in self.failed:
            raise BackendError("an earlier SEND of this connection was refused")
        return client_id

    def _ensure(self, client_id: str, destination: Destination, out: list[Outgoing]) -> str:
        """The destination's channel and queue, created as the mapping says if missing
        (when the engine's authorizer lets this client create channels/queues).  A
        temporary destination exists only while the connection that made it does."""
        name = channel_of(destination)
        owner = temp_owner(destination.name)
        if owner is not None and name not in self.engine.channels:
            owner_client = self.client_of.get(owner[1])
            if owner_client is None:
                raise BackendError(f"{destination.stomp}: no such temporary destination")
            self.temps_of.setdefault(owner[1], set()).add(name)
            if self.handler is not None:  # TMQP clients that join it get nothing either
                self.handler.set_owner(name, owner_client)
        options = TOPIC_OPTIONS if destination.kind is DestinationKind.TOPIC else QUEUE_OPTIONS
        engine = self.engine
        channel = engine.channels.get(name)
        missing = Action.CHANNEL_CREATE if channel is None else Action.QUEUE_CREATE
        if (channel is None or QUEUE_ID not in channel.queues) and not self._allows(
            client_id, missing, name
        ):
            raise BackendError(f"cannot use {destination.stomp}: not authorized to create it")
        try:
            if channel is None:
                base = engine.config.channel_defaults
                engine.create_channel(name, ChannelOptions(queue=options, **_rest(base)), out)
            elif QUEUE_ID not in channel.queues:
                engine.create_queue(name, QUEUE_ID, options, out)
        except OperationError as exc:
            raise BackendError(f"cannot use {destination.stomp}: {exc.reason}") from None
        if channel is None:
            self._join_wildcards(name, out)
        return name

    def _join_wildcards(self, name: str, out: list[Outgoing]) -> None:
        """A new channel: the wildcard subscriptions it matches start consuming it."""
        for wild in self.wild.values():
            if wild.matches(name):
                self._join(
                    wild.conn, name, wild.prefetch, wild.exclusive, out, wild, extras=wild.extras
                )

    def _join(
        self,
        conn: int,
        name: str,
        prefetch: int | None,
        exclusive: bool,
        out: list[Outgoing],
        wild: _Wild | None = None,
        *,
        extras: SubExtras | None = None,
    ) -> None:
        """Make connection ``conn`` a consumer of channel ``name``; a retained message
        of the channel is delivered to it first.  OperationError if refused."""
        client_id = self.client_of[conn]
        channel = self.engine.channels.get(name)
        if channel is not None and client_id in channel.consumers:
            if wild is not None:
                return  # another subscription of this connection has it: first one wins
            raise OperationError(ResultCode.ALREADY_CREATED, "already subscribed")
        if exclusive and self.handler is not None:
            self.handler.set_exclusive(name, client_id, True)
            self.exclusive_of.setdefault(conn, set()).add(name)
        if extras is not None and not name.startswith(TOPIC_CHANNEL_PREFIX):
            prefetch = self._rule(conn, client_id, name, extras, prefetch)
        retained = self.retained.get(name)
        if retained is not None:
            self._post_deliveries([(conn, retained)])
        try:
            out.extend(self.engine.subscribe(client_id, name, self.clock(), prefetch=prefetch))
        except OperationError:
            self._forget_exclusive(conn, name)
            self._forget_rules(conn, client_id, [name])
            raise
        if wild is not None:
            wild.channels.add(name)

    def _rule(
        self, conn: int, client_id: str, name: str, extras: SubExtras, prefetch: int | None
    ) -> int | None:
        """Register a queue subscription's selector, credit and include-seq; returns the
        engine window to join with (with credit: its count, at least the broker's
        ``prefetch``, so the credit windows decide and the engine window bounds memory)."""
        if extras.include_seq:
            self.seq_wanted.add((conn, name))
        handler = self.handler
        if handler is None or (
            extras.selects is None and extras.credit is None and not extras.from_seq
        ):
            return prefetch
        self.ruled.add((conn, name))
        if extras.selects is not None:
            handler.set_selector(name, client_id, extras.selects)
        if extras.from_seq:  # (0: from the head, as without it)
            first = extras.from_seq
            if first == -1:  # the tail: only messages that come after this
                channel = self.engine.channels.get(name)
                queue = channel.queues.get(QUEUE_ID) if channel is not None else None
                first = queue.sequence + 1 if queue is not None else 1
            handler.set_from_seq(name, client_id, first)
        if extras.credit is None:
            return prefetch
        handler.set_credit(name, client_id, extras.credit)
        return max(1, extras.credit.count, self.engine.config.prefetch)

    def _forget_rules(self, conn: int, client_id: str, names: Sequence[str] | None) -> None:
        """Drop the selector/credit/include-seq of ``conn`` on ``names`` (None: all)."""
        if names is None:
            names = [n for c, n in self.seq_wanted | self.ruled if c == conn]
        for name in names:
            self.seq_wanted.discard((conn, name))
            if (conn, name) in self.ruled:
                self.ruled.discard((conn, name))
                if self.handler is not None:
                    self.handler.set_selector(name, client_id, None)
                    self.handler.set_from_seq(name, client_id, None)
                    self.handler.set_credit(name, client_id, None)

    def _forget_exclusive(self, conn: int, name: str) -> None:
        names = self.exclusive_of.get(conn)
        if names is not None and name in names:
            names.discard(name)
            client_id = self.client_of.get(conn)
            if self.handler is not None and client_id is not None:
                self.handler.set_exclusive(name, client_id, False)

    def _post_deliveries(self, items: list[tuple[int, Message]]) -> None:
        if self.post is not None and self.deliver is not None:
            self.after_durable(_bind(self._post, _bind(self.deliver, items)))

    def _allows(self, client_id: str, action: Action, channel: str) -> bool:
        client = self.engine.clients.get(client_id)
        return client is not None and self.engine.authorizer.allows(client, action, channel)

    def op_publish(
        self, conn: int, spec: PublishSpec, message_id: str, now: float
    ) -> list[Outgoing]:
        client_id = self._client(conn)
        out: list[Outgoing] = []
        for destination in spec.destinations:
            if destination.kind is DestinationKind.DSUB:
                channel = self._durable(destination)
            elif destination.kind not in (DestinationKind.QUEUE, DestinationKind.TOPIC):
                raise BackendError(f"cannot send to {destination.stomp}")
            else:
                channel = self._ensure(client_id, destination, out)
            message = Message(
                message_id,
                client_id,
                channel,
                QUEUE_ID,
                headers=spec.headers,
                payload=spec.body,
            )
            if destination.kind is DestinationKind.TOPIC and spec.retain is not None:
                if spec.retain is RetainAction.SET:
                    self.retained[channel] = message
                else:
                    self.retained.pop(channel, None)
            sent = self.engine.publish(client_id, message, now, wants_response=True)
            for item in sent:
                frame = item[1]
                if (
                    item[0] == client_id
                    and item.__class__ is not Tracked
                    and isinstance(frame, tmqp.Frame)
                    and frame.message_type == MessageType.RESPONSE
                    and frame.message_id == message_id
                ):
                    reason = header(frame, Header.REASON) or f"code {frame.content_type}"
                    raise _Refused(f"{destination.stomp}: {reason}", out + sent)
            out.extend(sent)
        return out

    def op_publish_answered(
        self, conn: int, spec: PublishSpec, message_id: str, answer: PublishAnswer, now: float
    ) -> list[Outgoing]:
        """:meth:`op_publish` whose outcome goes to ``answer`` (on the listener thread,
        with the batch of :meth:`run_ops`) instead of a waiting caller."""
        try:
            out = self.op_publish(conn, spec, message_id, now)
        except _Refused as exc:
            self.failed.add(conn)
            self._answers.append((answer, exc.reason))
            return exc.out
        except BackendError as exc:
            self.failed.add(conn)
            self._answers.append((answer, str(exc)))
            return []
        except Exception as exc:
            self._answers.append((answer, f"broker error: {exc}"))
            raise
        self._answers.append((answer, None))
        return out

    def op_subscribe(
        self,
        conn: int,
        sub_id: str,
        destinations: Sequence[Destination],
        prefetch: int | None,
        exclusive: bool,
        now: float,
        *,
        extras: SubExtras | None = None,
    ) -> list[Outgoing]:
        """Consume the destinations' channels (created as needed); a wildcard one
        consumes every matching channel now and each one created later.  ``extras``:
        the queue subscription's selector, credit and include-seq (see :class:`SubExtras`)."""
        client_id = self._client(conn)
        out: list[Outgoing] = []
        patterns = [d for d in destinations if d.wildcard]
        wild = None
        if patterns:
            wild = _Wild(conn, tuple(patterns), prefetch, exclusive, extras=extras)
        for destination in destinations:
            if destination.wildcard:
                continue
            if destination.kind is DestinationKind.DSUB:
                try:
                    channel = self._durable(destination)
                except BackendError as exc:
                    raise _Refused(str(exc), out) from None
            else:
                channel = self._ensure(client_id, destination, out)
            try:
                self._join(conn, channel, prefetch, exclusive, out, extras=extras)
            except OperationError as exc:
                raise _Refused(f"{destination.stomp}: {exc.reason}", out) from None
        if wild is not None:
            self.wild[(conn, sub_id)] = wild
            for name in list(self.engine.channels):
                if wild.matches(name):
                    with contextlib.suppress(OperationError):  # not authorized: skipped
                        self._join(conn, name, prefetch, exclusive, out, wild, extras=extras)
        return out

    def op_return_credit(
        self, conn: int, deliveries: Sequence[tuple[str, int, str]], now: float
    ) -> list[Outgoing]:
        """A transactional ACK: the deliveries' credit comes back now (they stay
        unacknowledged); their queues then send what the credit allows."""
        client_id = self.client_of.get(conn)
        out: list[Outgoing] = []
        if client_id is None or self.handler is None:
            return out
        queues = []
        for channel, queue_id, message_id in deliveries:
            if self.handler.return_credit(channel, client_id, message_id):
                found = self.engine.channels.get(channel)
                queue = found.queues.get(queue_id) if found is not None else None
                if queue is not None and queue not in queues:
                    queues.append(queue)
        for queue in queues:
            queue.drain(now, out)
        return out

    def _durable(self, destination: Destination) -> str:
        """The channel of an existing durable subscription (BackendError if none)."""
        if self.engine.durable.get(destination.name) is None:
            raise BackendError(f"no durable subscription {destination.name!r}")
        return channel_of(destination)

    def op_subscribe_durable(
        self,
        conn: int,
        sub_id: str,
        topics: Sequence[Destination],
        prefetch: int | None,
        now: float,
    ) -> list[Outgoing]:
        """``persistent:true``: create durable subscription ``sub_id`` on the topics'
        channels (or update an existing one's; none given: it must exist), then consume
        its channel (``/dsub/<id>``, ``broker.engine.dsubs``)."""
        client_id = self._client(conn)
        out: list[Outgoing] = []
        durable = self.engine.durable
        name = dsubs.channel_name(sub_id)
        if topics:
            channels = [self._ensure(client_id, d, out) for d in topics]
            if durable.get(sub_id) is None and not self._allows(
                client_id, Action.CHANNEL_CREATE, name
            ):
                raise _Refused(f"durable subscription {sub_id!r}: not authorized", out)
            try:
                durable.create(sub_id, channels, out)
            except OperationError as exc:
                raise _Refused(f"durable subscription {sub_id!r}: {exc.reason}", out) from None
        elif durable.get(sub_id) is None:
            raise _Refused(f"no durable subscription {sub_id!r}", out)
        try:
            self._join(conn, name, prefetch, False, out)
        except OperationError as exc:
            raise _Refused(f"/dsub/{sub_id}: {exc.reason}", out) from None
        return out

    def op_destroy_durable(self, conn: int, sub_id: str, now: float) -> list[Outgoing]:
        """``UNSUBSCRIBE`` with ``persistent:true``: remove the durable subscription and
        what it holds (BackendError if there is none or the client may not)."""
        client_id = self._client(conn)
        if not self._allows(client_id, Action.CHANNEL_REMOVE, dsubs.channel_name(sub_id)):
            raise BackendError(f"durable subscription {sub_id!r}: not authorized to destroy it")
        out: list[Outgoing] = []
        try:
            self.engine.durable.destroy(sub_id, out)
        except OperationError as exc:
            raise BackendError(exc.reason) from None
        return out

    def op_browse_page(
        self, conn: int, sub_id: str, channel: str, from_seq: int, now: float
    ) -> list[Outgoing]:
        """The next :data:`BROWSE_PAGE` messages the channel's queue holds from sequence
        ``from_seq`` on (``broker.engine.queue.reading``: nothing is consumed), posted to
        the listener as one page; fewer than a page: the browse is at its end."""
        client_id = self._client(conn)
        if not self._allows(client_id, Action.BROWSE, channel):
            raise BackendError(f"not authorized to browse {channel!r}")
        found = self.engine.channels.get(channel)
        queue = found.queues.get(QUEUE_ID) if found is not None else None
        entries = reading.browse(queue, from_seq, BROWSE_PAGE) if queue is not None else []
        page = _BrowsePage(conn, sub_id, entries, len(entries) < BROWSE_PAGE)
        if self.post is not None and self.browsed is not None:
            self.after_durable(_bind(self._post, _bind(self.browsed, page)))
        return []

    def op_drop_wildcard(self, conn: int, sub_id: str, now: float) -> list[Outgoing]:
        """A wildcard subscription ended: stop consuming what it joined."""
        wild = self.wild.pop((conn, sub_id), None)
        if wild is None:
            return []
        return self.op_unsubscribe(conn, sorted(wild.channels), now)

    def op_unsubscribe(self, conn: int, channels: Sequence[str], now: float) -> list[Outgoing]:
        client_id = self.client_of.get(conn)
        out: list[Outgoing] = []
        if client_id is None:
            return out
        for channel in channels:
            self._forget_exclusive(conn, channel)
            with contextlib.suppress(OperationError):  # already gone (channel removed)
                out.extend(self.engine.unsubscribe(client_id, channel, now))
        self._forget_rules(conn, client_id, channels)
        return out

    def op_settle(
        self,
        conn: int,
        settles: Sequence[tuple[str, int, str, bool]],
        counts: int,
        now: float,
    ) -> list[Outgoing]:
        """Report ``counts`` deliveries taken, then acknowledge (True) or nack each."""
        client_id = self.client_of.get(conn)
        out: list[Outgoing] = []
        if client_id is None:
            return out
        engine = self.engine
        if counts:
            out.extend(engine.transmitted({client_id: counts}, now))
        for channel, queue_id, message_id, ok in settles:
            reason = None if ok else NackReason.NONE
            out.extend(
                engine.acknowledge(
                    client_id, channel, queue_id, message_id, now, nack_reason=reason
                )
            )
        return out


@dataclass(frozen=True, slots=True)
class _BrowsePage:
    """Messages a browse read, for one subscription (``done``: nothing after them)."""

    conn: int
    sub_id: str
    entries: list[tuple[int, Message]]
    done: bool


@dataclass(frozen=True, slots=True)
class SubExtras:
    """What a queue subscription asks of the engine beyond joining (engine thread):
    ``selects`` -- its selector, applied by the queue (``PerMessageRules.set_selector``:
    a message nobody selects stays queued without holding up the others); ``credit`` --
    its credit windows, one object shared by its channels (``PerMessageRules.set_credit``;
    None: no ``credit`` header, the engine window alone); ``include_seq`` -- deliveries
    carry their queue sequence; ``from_seq`` -- only messages numbered that or more
    (``PerMessageRules.set_from_seq``; -1: those that come after it joined)."""

    selects: Callable[[Sequence[tuple[str, str]]], bool] | None = None
    credit: Credit | None = None
    include_seq: bool = False
    from_seq: int | None = None  # ``from-seq`` (-1: the tail, 0: the head)


@dataclass(slots=True)
class _Wild:
    """A wildcard subscription, as the engine thread keeps it."""

    conn: int
    patterns: tuple[Destination, ...]
    prefetch: int | None
    exclusive: bool
    channels: set[str] = field(default_factory=set)  # the channels it joined
    extras: SubExtras | None = None

    def matches(self, channel: str) -> bool:
        return any(_matches(d, channel, self.conn) for d in self.patterns)


def destination_of(channel: str) -> Destination:
    """The STOMP destination of an engine channel (the inverse of :func:`channel_of`)."""
    if channel.startswith(TOPIC_CHANNEL_PREFIX):
        return Destination(DestinationKind.TOPIC, channel[len(TOPIC_CHANNEL_PREFIX) :])
    if channel.startswith(dsubs.CHANNEL_PREFIX):
        return Destination(DestinationKind.DSUB, channel[len(dsubs.CHANNEL_PREFIX) :])
    return Destination(DestinationKind.QUEUE, channel)


def _matches(pattern: Destination, channel: str, conn: int) -> bool:
    """Does wildcard ``pattern`` (of connection ``conn``) match an engine channel?  Never
    another connection's temporary destination."""
    destination = destination_of(channel)
    owner = temp_owner(destination.name)
    if owner is not None and owner[1] != conn:
        return False
    return pattern.matches(destination.kind, destination.name)


class _Refused(Exception):
    """An operation refused by the engine, with the output it caused before that."""

    def __init__(self, reason: str, out: list[Outgoing]) -> None:
        super().__init__(reason)
        self.reason = reason
        self.out = out


def _bind(fn: Callable[[T], None], arg: T) -> Callable[[], None]:
    return lambda: fn(arg)


def _resolve(done: concurrent.futures.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


def _run_all(fns: list[Callable[[], None]]) -> None:
    for fn in fns:
        try:
            fn()
        except Exception:  # as the loop would for separate callbacks: logged, go on
            log.exception("STOMP listener callback failed")


def _at_once(fn: Callable[[], None]) -> None:
    fn()


def _rest(base: ChannelOptions) -> dict[str, Any]:
    """A channel's options other than its queue defaults (to build a STOMP channel)."""
    return {
        "allow_multiple_queues": base.allow_multiple_queues,
        "allowed_queues": base.allowed_queues,
        "event_handler": base.event_handler,
        "authenticator": base.authenticator,
        "client_limit": base.client_limit,
        "queue_limit": base.queue_limit,
        "destroy_when_empty": base.destroy_when_empty,
    }


# ---------------------------------------------------------------------- listener side


@dataclass(slots=True)
class _Sub:
    spec: SubscriptionSpec
    channels: dict[str, Destination]  # engine channel -> its STOMP destination
    patterns: tuple[Destination, ...] = ()  # its wildcard destinations
    #: A browser: the page not yet taken by the connection, and whether it is the last.
    browsing: deque[tuple[int, Message]] | None = None
    browse_done: bool = False
    browse_next: int = FROM_FIRST

    def claim(self, channel: str, conn: int) -> bool:
        """A delivery from ``channel`` matches a wildcard of this subscription: the
        channel is now one of its own."""
        if not any(_matches(p, channel, conn) for p in self.patterns):
            return False
        self.channels[channel] = destination_of(channel)
        return True


@dataclass(slots=True)
class _Conn:
    info: ConnectionInfo
    sink: DeliverySink
    subs: dict[str, _Sub] = field(default_factory=dict)
    by_channel: dict[str, _Sub] = field(default_factory=dict)
    #: tag -> (channel, queue id, message id) of deliveries waiting for ACK/NACK
    pending: dict[int, tuple[str, int, str]] = field(default_factory=dict)
    held: deque[Message] = field(default_factory=deque)  # not taken by the connection yet
    next_tag: int = 1


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
        self.wall_clock_ms = wall_clock_ms
        self.answer_timeout = answer_timeout
        self.conns: dict[int, _Conn] = {}
        self.after_deliveries: Callable[[], None] = lambda: None
        self._ids = 0
        #: Operations of this loop iteration, handed to the door together (one wake-up
        #: of the engine thread per batch, not one per SEND or ACK); see :meth:`bind`.
        self._batch: list[Op] = []
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

    def _submit(self, op: Op) -> None:
        """Queue ``op`` for the engine thread, in order with every other operation."""
        if self._soon is None:
            self.door.submit(op)
            return
        batch = self._batch
        batch.append(op)
        if len(batch) == 1:
            self._soon(self._flush_ops)

    def _flush_ops(self) -> None:
        """Hand the batched operations to the door (one wake-up)."""
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
            except _Refused as exc:
                done.set_exception(BackendError(exc.reason))
                return exc.out
            except BackendError as exc:
                done.set_exception(exc)
                return []
            except BaseException as exc:
                done.set_exception(BackendError(f"broker error: {exc}"))
                raise
            # the answer (a RECEIPT) only once what the operation wrote is durable
            self.door.after_durable(_bind(_resolve, done))
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
        self.conns[connection.id] = _Conn(connection, sink)
        door, conn = self.door, connection.id
        self._submit(lambda now: door.op_connect(conn, connection, now))  # none if logged in

    def detach(self, connection_id: int) -> None:
        if self.conns.pop(connection_id, None) is None:
            return
        door = self.door
        self._flush_ops()
        door.submit(lambda now: door.op_disconnect(connection_id, now))

    def _stamped(self, connection_id: int, spec: PublishSpec) -> PublishSpec:
        check_headers(spec.headers)
        conn = self.conns.get(connection_id)
        user = conn.info.user if conn is not None else ANONYMOUS
        stamp = ((USER_HEADER, user), (TIMESTAMP_HEADER, str(self.wall_clock_ms())))
        # (the constructor, not dataclasses.replace: this runs for every SEND)
        return PublishSpec(
            spec.destinations,
            spec.headers + stamp,
            spec.body,
            spec.persistent,
            spec.retain,
            spec.expires,
            spec.message_group,
        )

    def publish_async(self, connection_id: int, spec: PublishSpec, answer: PublishAnswer) -> None:
        """Submit the SEND without waiting (:class:`~broker.stomp.backend.AsyncPublisher`):
        the engine thread runs it in order with this connection's other operations."""
        spec = self._stamped(connection_id, spec)
        self._ids += 1
        message_id = f"stomp-{connection_id}-{self._ids}"
        door = self.door
        self._submit(
            lambda now: door.op_publish_answered(connection_id, spec, message_id, answer, now)
        )

    def _on_answers(self, answers: list[tuple[PublishAnswer, str | None]]) -> None:
        for answer, error in answers:
            answer(error)
        self.after_deliveries()

    def publish(self, connection_id: int, spec: PublishSpec) -> None:
        spec = self._stamped(connection_id, spec)
        self._ids += 1
        message_id = f"stomp-{connection_id}-{self._ids}"
        door = self.door
        self._call(lambda now: door.op_publish(connection_id, spec, message_id, now))

    def subscribe(self, connection_id: int, spec: SubscriptionSpec) -> None:
        conn = self.conns[connection_id]
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
        for destination in spec.destinations:
            if destination.wildcard:
                continue
            name = channel_of(destination)
            if name in conn.by_channel or name in channels:
                raise BackendError(f"{destination.stomp} is already subscribed on this connection")
            channels[name] = destination
        sub = _Sub(spec, channels, tuple(d for d in spec.destinations if d.wildcard))
        door, wanted = self.door, list(spec.destinations)
        # no credit header (the STOMP default): the engine's window (BrokerConfig.prefetch)
        count = spec.credit.count
        prefetch = None if count == DEFAULT_CREDIT_COUNT else max(1, count)
        sub_id, exclusive = spec.id, spec.exclusive
        extras = _extras(spec)
        self._call(
            lambda now: door.op_subscribe(
                connection_id, sub_id, wanted, prefetch, exclusive, now, extras=extras
            )
        )
        conn.subs[spec.id] = sub
        for name in channels:
            conn.by_channel[name] = sub

    def _subscribe_durable(self, connection_id: int, conn: _Conn, spec: SubscriptionSpec) -> None:
        """``persistent:true`` with ``id``: the durable subscription ``id`` on the /topic/
        destinations (or an existing one, addressed by ``/dsub/<id>``), consumed here."""
        topics = [d for d in spec.destinations if d.kind is DestinationKind.TOPIC]
        others = [d for d in spec.destinations if d.kind is not DestinationKind.TOPIC]
        if any(d.wildcard for d in spec.destinations):
            raise BackendError("a durable subscription takes no wildcard destinations (engine)")
        if spec.selector is not None:
            raise BackendError("a durable subscription takes no selector (engine)")
        if others and (topics or others != [Destination(DestinationKind.DSUB, spec.id)]):
            raise BackendError("a durable subscription needs /topic/ destinations")
        name = dsubs.channel_name(spec.id)
        if name in conn.by_channel:
            raise BackendError(f"/dsub/{spec.id} is already subscribed on this connection")
        # deliveries name the topic they were sent to when there is one, else /dsub/ID
        shown = topics[0] if len(topics) == 1 else Destination(DestinationKind.DSUB, spec.id)
        count = spec.credit.count
        prefetch = None if count == DEFAULT_CREDIT_COUNT else max(1, count)
        door, sub_id = self.door, spec.id
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
        consuming them, then the ``browser:end`` marker."""
        if len(channels) != 1 or len(spec.destinations) != 1:
            raise BackendError("browser:true takes one queue or topic destination")
        if not spec.browser_end:
            raise BackendError("browser-end:false is not supported on the engine yet")
        (channel,) = channels
        start = FROM_FIRST if spec.from_seq is None else spec.from_seq
        sub = _Sub(spec, channels, browsing=deque(), browse_next=start)
        door, sub_id = self.door, spec.id
        self._call(lambda now: door.op_browse_page(connection_id, sub_id, channel, start, now))
        conn.subs[spec.id] = sub  # (not in by_channel: no engine delivery is for it)

    def _on_browse_page(self, page: _BrowsePage) -> None:
        conn = self.conns.get(page.conn)
        sub = conn.subs.get(page.sub_id) if conn is not None else None
        if conn is None or sub is None or sub.browsing is None:
            return  # unsubscribed meanwhile
        sub.browsing.extend(page.entries)
        sub.browse_done = page.done
        if page.entries:
            sub.browse_next = page.entries[-1][0] + 1
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
            if selector is not None and not selector.matches(_first_wins(message.headers)):
                pending.popleft()  # a browser sees only what it selects
                continue
            delivery = replace(_delivery(sub, message, conn.next_tag), sequence=seq)
            if not conn.sink(delivery):
                return  # resume() goes on
            conn.next_tag += 1
            pending.popleft()
        if not sub.browse_done:
            door, sub_id, start = self.door, sub.spec.id, sub.browse_next
            (channel,) = sub.channels
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
            self._call(lambda now: door.op_destroy_durable(connection_id, subscription_id, now))

    def _drop(self, connection_id: int, conn: _Conn, subscription_id: str, sub: _Sub) -> None:
        for name in sub.channels:
            conn.by_channel.pop(name, None)
        # its unacknowledged deliveries go back
        settles = [
            (*conn.pending.pop(tag), False)
            for tag, (channel, _q, _m) in list(conn.pending.items())
            if channel in sub.channels
        ]
        door, names = self.door, list(sub.channels)
        self._submit(lambda now: door.op_settle(connection_id, settles, 0, now))
        self._submit(lambda now: door.op_unsubscribe(connection_id, names, now))
        if sub.patterns:
            self._submit(lambda now: door.op_drop_wildcard(connection_id, subscription_id, now))

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
        settles = [(*conn.pending.pop(t), ok) for t in tags if t in conn.pending]
        if settles:
            door = self.door
            self._submit(lambda now: door.op_settle(connection_id, settles, 0, now))

    # -- deliveries --------------------------------------------------------------------------

    def _wildcard_sub(self, conn_id: int, conn: _Conn, channel: str) -> _Sub | None:
        for sub in conn.subs.values():
            if sub.patterns and sub.claim(channel, conn_id):
                conn.by_channel[channel] = sub
                return sub
        return None

    def _on_deliveries(self, items: list[tuple[int, Message]]) -> None:
        by_conn: dict[int, list[Message]] = {}
        for conn_id, message in items:
            by_conn.setdefault(conn_id, []).append(message)
        for conn_id, messages in by_conn.items():
            conn = self.conns.get(conn_id)
            if conn is None:
                continue  # detached: the engine returns them when it hears of it
            if conn.held:
                conn.held.extend(messages)
            else:
                self._deliver_to(conn_id, conn, messages)
        self.after_deliveries()

    def _deliver_to(self, conn_id: int, conn: _Conn, messages: Iterable[Message]) -> None:
        taken = 0
        settles: list[tuple[str, int, str, bool]] = []
        pending = iter(messages)
        for message in pending:
            sub = conn.by_channel.get(message.target)
            if sub is None:
                sub = self._wildcard_sub(conn_id, conn, message.target)
            if sub is None:  # unsubscribed meanwhile: back to the queue
                taken += 1
                if message.wants_ack:
                    settles.append(
                        (message.target, message.content_type, message.message_id, False)
                    )
                continue
            selector = sub.spec.selector
            if (
                selector is not None
                and not message.wants_ack  # (a queue applies the selector itself)
                and not selector.matches(_first_wins(message.headers))
            ):
                taken += 1  # a topic copy this subscription does not select: dropped
                continue
            tag = conn.next_tag
            delivery = _delivery(sub, message, tag)
            if not conn.sink(delivery):
                conn.held.append(message)
                conn.held.extend(pending)
                break
            conn.next_tag += 1
            taken += 1
            if not message.wants_ack:
                continue
            key = (message.target, message.content_type, message.message_id)
            if sub.spec.ack is AckMode.AUTO:
                settles.append((*key, True))
            else:
                conn.pending[tag] = key
        if taken or settles:
            door = self.door
            self._submit(lambda now: door.op_settle(conn_id, settles, taken, now))


def _extras(spec: SubscriptionSpec) -> SubExtras | None:
    """What the engine applies for a queue subscription (None: nothing to apply)."""
    selector = spec.selector
    selects = None
    if selector is not None:

        def selects(headers: Sequence[tuple[str, str]]) -> bool:
            return selector.matches(_first_wins(headers))

    credit = None
    if spec.credit != CreditSpec():
        credit = Credit(spec.credit.count, spec.credit.size)
    if selects is None and credit is None and not spec.include_seq and spec.from_seq is None:
        return None
    return SubExtras(selects, credit, bool(spec.include_seq), spec.from_seq)


def _first_wins(headers: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Headers as a selector reads them (a repeated name: its first value)."""
    env: dict[str, str] = {}
    for name, value in headers:
        env.setdefault(name, value)
    return env


def _delivery(sub: _Sub, message: Message, tag: int) -> Delivery:
    redeliveries = 0
    sequence: int | None = None
    sender = message.source or None
    timestamp: int | None = None
    headers: list[tuple[str, str]] = []
    for key, value in message.headers:
        lower = key.lower()
        if lower in _HIDDEN:
            if lower == "delivery-count":
                with contextlib.suppress(ValueError):
                    redeliveries = max(0, int(value) - 1)
            elif lower == _USER:
                sender = value
            elif lower == _SEQ:
                with contextlib.suppress(ValueError):
                    sequence = int(value)
            elif value.isdigit():
                timestamp = int(value)
            continue
        headers.append((key, value))
    destination = sub.channels[message.target]
    return Delivery(
        subscription=sub.spec.id,
        tag=tag,
        message_id=message.message_id or f"tag-{tag}",
        destination=destination.stomp,
        headers=tuple(headers),
        body=bytes(message.payload),
        redeliveries=redeliveries,
        sequence=sequence,
        sender=sender,
        timestamp_ms=timestamp,
    )


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
    backend.bind(
        lambda fn: listener.loop.call_soon_threadsafe(fn),
        listener.flush_all,
        lambda fn: listener.loop.call_soon(fn),
    )
    add_reader(door.fileno(), door.run_ops)
    return listener
