"""The engine thread's side of the STOMP backend (see ``broker.stomp.engine_backend`` for
the two threads and the whole mapping): :class:`EngineDoor` wraps the engine the server
drives, runs the operations the listener thread submits and posts deliveries back.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
import time
from collections import deque
from collections.abc import Callable, Collection, Container, Iterable, Sequence
from enum import IntEnum
from functools import partial
from typing import Any, TypeVar

from broker import tmqp
from broker.engine import dsubs
from broker.engine.auth import Action
from broker.engine.channels import Channel
from broker.engine.delivery import PerMessageDeliveryHandler
from broker.engine.engine import Engine
from broker.engine.errors import ClientRejected, OperationError
from broker.engine.options import ChannelOptions
from broker.engine.per_message import PER_MESSAGE, PerMessageRules
from broker.message import DEFAULT_TTL, Message
from broker.paging import json_size
from broker.protocol import (
    AutoRun,
    DeliveredRun,
    Header,
    MessageType,
    NackReason,
    Outgoing,
    PlainSends,
    ResultCode,
    Tracked,
    header,
)
from broker.protocol import (
    ConnectionInfo as EngineConnectionInfo,
)
from broker.stomp.backend import (
    STORE_FAILED,
    BatchAnswer,
    ConnectionInfo,
    PublishAnswer,
    Refusal,
)
from broker.stomp.destinations import Destination, DestinationKind, temp_owner
from broker.stomp.engine_browse import BrowsePage, Followers, read_page
from broker.stomp.engine_durable import existing_channel
from broker.stomp.engine_flow import SubExtras
from broker.stomp.engine_mapping import (
    QUEUE_ID,
    QUEUE_OPTIONS,
    SEQ_HEADER,
    TOPIC_CHANNEL_PREFIX,
    TOPIC_OPTIONS,
    channel_of,
    channel_rest,
    destination_of,
)
from broker.stomp.errors import BackendError
from broker.stomp.frames import Headers
from broker.stomp.subscription import PublishSpec, PublishStreak
from broker.stomp.vhosts import namespace_of
from broker.stomp.wildcards import Wild, Wildcards

log = logging.getLogger(__name__)

#: ``Tracked(client_id, frame)`` without the named tuple's Python-level __new__.
_tracked = tuple.__new__

T = TypeVar("T")

#: An operation run on the engine thread: ``now`` in, TMQP output out.
Op = Callable[[float], list[Outgoing]]
#: Runs a function on the listener's thread (``loop.call_soon_threadsafe``).
Post = Callable[[Callable[[], None]], Any]
#: ``after_durable(fn, failed)``: ``fn`` once the store's writes so far are durable,
#: ``failed`` instead if the store fails first (``OutputGate.call``).
AfterDurable = Callable[[Callable[[], None], "Callable[[], None] | None"], None]

#: The nonce of a door's message ids (:func:`new_id_prefix`): this many random bits,
#: written as ``_NONCE_DIGITS`` base-36 digits (36**6 > 2**31).
_NONCE_BITS = 31
_NONCE_DIGITS = 6
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def new_id_prefix() -> str:
    """``s<nonce>-``: how the message ids a door makes begin (``<conn>-<n>`` follow,
    the listener's connection number and the backend's count of SENDs, both counting
    from 1 in each process).  ``<nonce>``: ``_NONCE_BITS`` random bits as six base-36
    digits, new in each process, so that the ids made after a restart do not repeat
    those of messages the store kept (a restored persistent message and a new one
    sharing an id were two deliveries of one ``message-id``).  Short, as it is on every
    MESSAGE: two characters more than the ``stomp-`` the ids began with before."""
    n = secrets.randbits(_NONCE_BITS)
    digits = []
    for _ in range(_NONCE_DIGITS):
        n, d = divmod(n, 36)
        digits.append(_DIGITS[d])
    return f"s{''.join(reversed(digits))}-"


class EngineDoor:
    """The engine, as the server drives it, with STOMP connections beside TMQP peers.

    Everything but :meth:`submit` is called on the server's thread.
    """

    def __init__(
        self,
        engine: Engine,
        clock: Callable[[], float] = time.monotonic,
        id_prefix: str | None = None,
    ) -> None:
        self.engine = engine
        self.clock = clock
        #: How the message ids of this door's SENDs begin (:func:`new_id_prefix`, new in
        #: each process unless told): ``<id_prefix><conn>-<n>``.
        self.id_prefix = new_id_prefix() if id_prefix is None else id_prefix
        engine.services.add_door_prefix(self.id_prefix)  # (Dispatcher.send's test)
        if PER_MESSAGE not in engine.handlers:  # the CLI registers it before recovery
            engine.handlers[PER_MESSAGE] = PerMessageDeliveryHandler(engine.config.wall_clock)
        #: Runs a function once the store's writes so far are durable, or the second
        #: one instead if the store fails first (the server's ``OutputGate.call``;
        #: without a store: at once).  Receipts and deliveries wait.
        self.after_durable: AfterDurable = _at_once
        self._ops: deque[Op] = deque()
        self._woken = False  # a wake-up octet is on its way (see submit)
        self._rx, self._tx = socket.socketpair()
        self._rx.setblocking(False)
        self._tx.setblocking(False)
        self.post: Post | None = None  # set by EngineBackend.bind
        #: The listener's figures for the statistics (EngineBackend.bind): read from the
        #: engine thread, so a snapshot that never waits for the listener.
        self.listener_figures: Callable[[], dict[str, object]] | None = None
        #: The listener's side (``EngineBackend._on_deliveries``): the deliveries of one
        #: hand-over, by connection, in order.
        #: A run of AUTO deliveries comes as one ``DeliveredRun``.
        self.deliver: Callable[[dict[int, list[Message | DeliveredRun]]], None] | None = None
        #: Takes a browse page on the listener thread (EngineBackend.bind).
        self.browsed: Callable[[BrowsePage], None] | None = None
        #: Runs a batch of publish answers on the listener thread (EngineBackend.bind).
        self.answer: Callable[[list[tuple[PublishAnswer, Refusal | None]]], None] | None = None
        #: (answer, error) of this batch's publishes (a run's: ``partial(BatchAnswer,
        #: taken)``) and of ``op_applied``, answered once their writes are durable.
        self._answers: list[tuple[PublishAnswer, Refusal | None]] = []
        #: While run_ops runs: what it posts to the listener thread, posted as one call
        #: at its end (one loop wake-up per batch, not one per kind of output).
        self._posting: list[Callable[[], None]] | None = None
        #: Connections one of whose asynchronous SENDs was refused: their ERROR is on its
        #: way, so their later SENDs and SUBSCRIBEs take no effect (as if processed in turn).
        self.failed: set[int] = set()
        #: STOMP connections' engine client ids -> connection ids, and back.
        self.conn_of: dict[str, int] = {}
        self.client_of: dict[int, str] = {}
        #: Wildcard subscriptions by (connection, subscription id).
        self.wild = Wildcards()
        engine.count_patterns(self.wild.distinct)  # (one budget with TMQP's pattern joins)
        #: ``browser-end:false`` browsers at the end of their queue (engine_browse).
        self.followers = Followers()
        #: Per connection: the channels it consumes exclusively, its temporary channels.
        self.exclusive_of: dict[int, set[str]] = {}
        #: (connection, queue channel) of subscriptions with ``include-seq``, and of
        #: those with a selector or credit registered in the handler's rules.
        self.seq_wanted: set[tuple[int, str]] = set()
        self.ruled: set[tuple[int, str]] = set()
        self.temps_of: dict[int, set[str]] = {}
        #: Per connection of a virtual host other than the default: its namespace
        #: (``broker.stomp.vhosts``), which its temporary destinations live in.
        self.namespace_of: dict[int, str] = {}
        handler = engine.handlers[PER_MESSAGE]
        #: The rules of the ``per-message`` handler (groups, exclusive consumers, owners).
        self.handler: PerMessageRules | None = (
            handler.rules if isinstance(handler, PerMessageDeliveryHandler) else None
        )
        self._drop_stale_temporaries()
        #: A channel created by any door (a TMQP push, an admin create, a STOMP SEND)
        #: is joined by the wildcard subscriptions it matches as it is created.
        engine.channel_registry.on_created = self._created

    def _drop_stale_temporaries(self) -> None:
        """Temporary destinations recovered from the store belonged to connections of an
        earlier run: removed, so a new connection with the same id cannot inherit them."""
        registry = self.engine.channel_registry
        out: list[Outgoing] = []
        stale = [n for n in self.engine.channels if _temporary_queue(n)]
        for name in stale:
            with contextlib.suppress(OperationError):
                registry.remove_channel(self.engine.channels[name], out)
        self.closed = False

    # -- the engine, passed through (what the server calls) ------------------------------

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def connect(
        self,
        info: EngineConnectionInfo,
        now: float,
        *,
        replace: bool = False,
        federation: bool = False,
    ) -> Any:
        client_id, out = self.engine.connect(info, now, replace=replace, federation=federation)
        return client_id, self._split(out)

    def receive(self, client_id: str, frame: Any, now: float, data: bytes | None = None) -> Any:
        return self._split(self.engine.receive(client_id, frame, now, data))

    def receive_batch(
        self, client_id: str, items: Sequence[tuple[int, tmqp.Frame, bytes]], now: float
    ) -> tuple[list[Outgoing], list[tuple[int, str, str]], list[int]]:
        """``Engine.receive_batch`` (a TMQP batch): its deliveries to STOMP connections
        go to them, as those of every other engine call the server makes."""
        outs, refused, later = self.engine.receive_batch(client_id, items, now)
        return self._split(outs), refused, later

    def receive_pushes(
        self, client_id: str, messages: Sequence[Message], now: float
    ) -> list[Outgoing]:
        """``Engine.receive_pushes`` (a drain's run of one TMQP producer's pushes, plain
        or waiting for an acknowledge): its deliveries to STOMP connections go to them,
        as those of every other call."""
        return self._split(self.engine.receive_pushes(client_id, messages, now))

    def receive_push_octets(
        self, client_id: str, datas: Sequence[bytes], now: float, readers: Container[str]
    ) -> tuple[int, list[Outgoing]]:
        """``Engine.receive_push_octets`` (a TMQP producer's run delivered as its octets to
        a TMQP consumer, ``readers``: never to a STOMP connection), split as every call."""
        taken, outs = self.engine.receive_push_octets(client_id, datas, now, readers)
        return taken, self._split(outs)

    def disconnect(self, client_id: str, now: float) -> list[Outgoing]:
        return self._split(self.engine.disconnect(client_id, now))

    def transmitted(self, counts: Any, now: float) -> list[Outgoing]:
        return self._split(self.engine.transmitted(counts, now))

    def tick(self, now: float) -> list[Outgoing]:
        return self._split(self.engine.tick(now))

    def next_deadline(self) -> float | None:
        return self.engine.next_deadline()

    def stats(self) -> dict[str, object]:
        out = self.engine.stats()
        figures = self.listener_figures
        return out if figures is None else {**out, "stomp": figures()}

    def stats_page(self, after: str | None, budget: int) -> tuple[dict[str, object], str | None]:
        """The engine's page; the first one also holds the listener's figures (``stomp``)."""
        figures = self.listener_figures
        if figures is None or after is not None:
            return self.engine.stats_page(after, budget)
        stomp = figures()
        out, more = self.engine.stats_page(after, budget - json_size(stomp) - len(',"stomp":'))
        return {**out, "stomp": stomp}, more

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
                self.after_durable(
                    bound(self._post, bound(self.answer, answers)),
                    bound(self._post, bound(self._answer_unsaved, answers)),
                )
        finally:
            self._posting = None
        if len(posting) == 1:
            self._post(posting[0])
        elif posting:
            self._post(bound(_run_all, posting))
        return keep

    def close(self) -> None:
        self.closed = True
        self._rx.close()
        self._tx.close()

    def _split(self, out: list[Outgoing]) -> list[Outgoing]:
        """Output for TMQP peers; deliveries for STOMP connections go to their thread."""
        if self.followers.waiting:
            self._wake_followers()
        conn_of = self.conn_of
        if not conn_of or not out:
            return out
        keep: list[Outgoing] = []
        mine: dict[int, list[Message | DeliveredRun]] = {}  # (grouped: no pair per delivery)
        last_conn = -1
        into: list[Message | DeliveredRun] = []
        seq_wanted = self.seq_wanted
        # (the client id of the last delivery grouped, while no subscription wants its
        # queue sequence: a delivery to the same id object goes straight to its list)
        last_client: str | None = None
        for item in out:
            client_id = item[0]
            if client_id is last_client and (
                item.__class__ is Tracked or item.__class__ is AutoRun
            ):
                into.append(item[1])  # type: ignore[arg-type]  # a Message or DeliveredRun
                continue
            conn = conn_of.get(client_id)
            if conn is None:
                if item.__class__ is AutoRun:  # (not a STOMP consumer's: one by one)
                    run: DeliveredRun = item[1]  # type: ignore[assignment]
                    keep += [_tracked(Tracked, (client_id, f)) for f in run.frames()]
                else:
                    keep.append(item)
            elif item.__class__ is Tracked or item.__class__ is AutoRun:
                # (an AutoRun whole: its deliveries have no pending entry, no sequence)
                delivery = item[1]
                if item.__class__ is Tracked and seq_wanted:
                    message: Message = delivery  # type: ignore[assignment]  # Tracked
                    if (conn, message.target) in seq_wanted:
                        delivery = self._with_seq(client_id, message)
                if conn != last_conn:
                    found = mine.get(conn)
                    if found is None:
                        found = mine[conn] = []
                    into, last_conn = found, conn
                into.append(delivery)  # type: ignore[arg-type]  # a Message or DeliveredRun
                if not seq_wanted:
                    last_client = client_id
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

    def _answer_unsaved(self, answers: list[tuple[PublishAnswer, Refusal | None]]) -> None:
        """The store failed before ``answers``' writes were durable: what would have been
        a RECEIPT is refused (``STORE_FAILED``), a run's with none of it taken (which of its
        messages the disk holds is unknown); a refusal stays as it was."""
        assert self.answer is not None
        self.answer([_unsaved(answer, error) for answer, error in answers])

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
        namespace = namespace_of(info.virtual_host)
        if namespace:
            self.namespace_of[conn] = namespace
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
        self.engine.clients[client_id].own_ids = True  # (ids: ``id_prefix``)
        return out

    def op_disconnect(self, conn: int, now: float) -> list[Outgoing]:
        """The connection ended: its engine client, wildcard subscriptions, exclusive
        marks and temporary destinations (channels ``temp.<broker>.<conn>.*``) go."""
        self.failed.discard(conn)
        self.followers.drop(conn)
        self.namespace_of.pop(conn, None)
        client_id = self.client_of.pop(conn, None)
        if client_id is None:
            return []
        out = self.engine.disconnect(client_id, now)
        self.conn_of.pop(client_id, None)  # after: what it returns is for the others
        self.wild.drop_connection(conn)
        self._forget_rules(conn, client_id, None)
        for channel in self.exclusive_of.pop(conn, ()):
            if self.handler is not None:
                self.handler.set_exclusive(channel, client_id, False)
        registry = self.engine.channel_registry
        for name in self.temps_of.pop(conn, ()):
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
        channel = self.engine.channels.get(name)
        if channel is not None and QUEUE_ID in channel.queues:
            return name  # (every SEND but the first to a destination)
        owner = temp_owner(destination.name)
        if owner is not None and name not in self.engine.channels:
            owner_client = self.client_of.get(owner[1])
            elsewhere = self.namespace_of.get(owner[1], "") != destination.namespace
            if owner_client is None or elsewhere:  # gone, or of another virtual host
                raise BackendError(f"{destination.stomp}: no such temporary destination")
            temps = self.temps_of.setdefault(owner[1], set())
            limit = self.engine.config.limits.max_temp_destinations
            if name not in temps and len(temps) >= limit:
                raise BackendError(
                    f"{destination.stomp}: too many temporary destinations"
                    f" (max_temp_destinations={limit})"
                )
            temps.add(name)
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
                engine.create_channel(
                    name, ChannelOptions(queue=options, **channel_rest(base)), out, client_id
                )
            elif QUEUE_ID not in channel.queues:
                engine.create_queue(name, QUEUE_ID, options, out, client_id)
        except OperationError as exc:
            raise BackendError(f"cannot use {destination.stomp}: {exc.reason}") from None
        return name

    def _created(self, channel: Channel, out: list[Outgoing]) -> None:
        """The engine created a channel (``ChannelRegistry.on_created``)."""
        if self.wild:
            self._join_wildcards(channel.name, out)

    def _join_wildcards(self, name: str, out: list[Outgoing]) -> None:
        """A new channel: the wildcard subscriptions it matches start consuming it (one
        whose connection may not join it, or is at a limit: skipped)."""
        for wild in self.wild.matching(name):
            if wild.conn in self.client_of:
                with contextlib.suppress(OperationError):
                    self._join(
                        wild.conn, name, wild.prefetch, wild.exclusive, out, wild,
                        extras=wild.extras,
                    )  # fmt: skip

    def _join(
        self,
        conn: int,
        name: str,
        prefetch: int | None,
        exclusive: bool,
        out: list[Outgoing],
        wild: Wild | None = None,
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
        retained = self.engine.channel_registry.retained.get(name)  # (broker.engine.retain)
        if retained is not None:
            self._post_deliveries({conn: [retained]})
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

    def _post_deliveries(self, items: dict[int, list[Message | DeliveredRun]]) -> None:
        if self.post is not None and self.deliver is not None:
            posted = bound(self._post, bound(self.deliver, items))
            self.after_durable(posted, posted)  # a failed store: as TMQP deliveries go

    def _allows(self, client_id: str, action: Action, channel: str) -> bool:
        client = self.engine.clients.get(client_id)
        return client is not None and self.engine.authorizer.allows(client, action, channel)

    def op_publish(
        self, conn: int, spec: PublishSpec, message_id: str, now: float, stamp: Headers = ()
    ) -> list[Outgoing]:
        """Publish ``spec`` to each of its destinations; ``stamp``: headers the broker
        adds after the user's (EngineBackend._stamp)."""
        client_id = self._client(conn)
        out: list[Outgoing] = []
        headers = spec.headers + stamp if stamp else spec.headers
        for destination in spec.destinations:
            if destination.kind is DestinationKind.DSUB:
                channel = existing_channel(self.engine, destination)
            elif destination.kind not in (DestinationKind.QUEUE, DestinationKind.TOPIC):
                raise BackendError(f"cannot send to {destination.stomp}")
            else:
                channel = self._ensure(client_id, destination, out)
            message = Message(
                message_id,
                client_id,
                channel,
                QUEUE_ID,
                headers=headers,
                payload=spec.body,
            )
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
                    raise Refused(f"{destination.stomp}: {reason}", out + sent)
            out.extend(sent)
        return out

    def op_publish_answered(
        self,
        conn: int,
        spec: PublishSpec,
        message_id: str,
        answer: PublishAnswer,
        now: float,
        stamp: Headers = (),
    ) -> list[Outgoing]:
        """:meth:`op_publish` whose outcome goes to ``answer`` (on the listener thread,
        with the batch of :meth:`run_ops`) instead of a waiting caller."""
        try:
            out = self.op_publish(conn, spec, message_id, now, stamp)
        except Refused as exc:
            self.failed.add(conn)
            self._answers.append((answer, Refusal(exc.reason)))
            return exc.out
        except BackendError as exc:
            self.failed.add(conn)
            self._answers.append((answer, Refusal(str(exc))))
            return []
        except Exception as exc:
            self._answers.append((answer, Refusal(f"broker error: {exc}")))
            raise
        self._answers.append((answer, None))
        return out

    def op_applied(self, answer: PublishAnswer) -> list[Outgoing]:
        """Every operation submitted before this one ran: ``answer`` goes with the batch's
        publish answers, once their writes are durable (``EngineBackend.after_applied``)
        -- the removals of the messages acknowledged so far too: a RECEIPT promises them
        (a store does not make an acknowledge's removal wait otherwise)."""
        self.engine.store.removals_answered()
        self._answers.append((answer, None))
        return []

    def op_publish_batch(
        self,
        conn: int,
        streaks: Sequence[PublishStreak],
        first_id: int,
        answer: BatchAnswer,
        now: float,
        stamp: Headers = (),
    ) -> list[Outgoing]:
        """A run of SENDs of one connection (``EngineBackend.publish_batch``), as streaks
        of SENDs alike but their bodies: each SEND as :meth:`op_publish` (message ids
        ``<id_prefix><conn>-<first_id + i>``, ``i`` counting SENDs), in order, up to the
        first refused; one answer for the run, ``answer(taken, error)``."""
        prefix = f"{self.id_prefix}{conn}-"
        plain = _plain_run(streaks)
        if plain is not _Run.MIXED:
            return self._publish_plain(
                conn, streaks, prefix, first_id, answer, now, stamp, plain is _Run.ONE
            )
        out: list[Outgoing] = []
        publish = self.op_publish
        specs = [spec for streak in streaks for spec in streak.specs()]
        for i, spec in enumerate(specs):
            try:
                out += publish(conn, spec, f"{prefix}{first_id + i}", now, stamp)
            except Refused as exc:
                self.failed.add(conn)
                self._answers.append((partial(answer, i), Refusal(exc.reason)))
                return out + exc.out
            except BackendError as exc:
                self.failed.add(conn)
                self._answers.append((partial(answer, i), Refusal(str(exc))))
                return out
            except Exception as exc:  # what was taken before it is delivered
                log.exception("STOMP SEND failed on the engine")
                self._answers.append((partial(answer, i), Refusal(f"broker error: {exc}")))
                return out
        self._answers.append((partial(answer, len(specs)), None))
        return out

    def _publish_plain(
        self,
        conn: int,
        streaks: Sequence[PublishStreak],
        prefix: str,
        first_id: int,
        answer: BatchAnswer,
        now: float,
        stamp: Headers,
        one: bool = False,
    ) -> list[Outgoing]:
        """:meth:`op_publish_batch` of SENDs to one queue or topic each, nothing retained:
        the messages go to the engine in one call (``Engine.publish_many``).  ``one``:
        every streak names the same destinations tuple (the usual run: its channel is
        found once), its messages made only when the engine reads them if they share
        one header block (:func:`_run_sends`).  Else messages are made per streak
        (:func:`_run_messages`), their header blocks once per run
        (:func:`_header_blocks`)."""
        try:
            client_id = self._client(conn)
        except BackendError as exc:
            self.failed.add(conn)
            self._answers.append((partial(answer, 0), Refusal(str(exc))))
            return []
        out: list[Outgoing] = []
        messages: Sequence[Message] = []
        error: str | None = None
        blocks = _header_blocks(streaks, stamp)
        if one:
            try:
                channel = self._ensure(client_id, streaks[0][0][0], out)
            except BackendError as exc:  # none of them goes
                error = str(exc)
            else:
                messages = _run_sends(streaks, blocks, prefix, first_id, client_id, channel)
        else:
            made: list[Message] = []
            error = self._plain_messages(client_id, streaks, blocks, prefix, first_id, made, out)
            messages = made
        taken = 0
        if messages:
            sent, taken, refused = self.engine.publish_many(
                client_id, messages, now, unique_ids=True
            )
            out += sent
            if refused is not None:
                error = f"{_streak_of(streaks, taken).destinations[0].stomp}: {refused}"
        if error is not None:
            self.failed.add(conn)
            self._answers.append((partial(answer, taken), Refusal(error)))
        else:
            self._answers.append((partial(answer, len(messages)), None))
        return out

    def _plain_messages(
        self,
        client_id: str,
        streaks: Sequence[PublishStreak],
        blocks: Sequence[Headers],
        prefix: str,
        first_id: int,
        messages: list[Message],
        out: list[Outgoing],
    ) -> str | None:
        """:meth:`_publish_plain`'s messages of a run whose streaks name several
        destinations, appended to ``messages``: each stretch of streaks naming one
        destination object finds its channel once (:func:`_run_messages`).  The error
        of the first SEND whose channel cannot be had (None: every one made; those
        before it are made)."""
        channels: dict[Destination, str] = {}
        n = len(streaks)
        start = 0
        while start < n:
            destination = streaks[start][0][0]
            end = start + 1
            while end < n and streaks[end][0][0] is destination:
                end += 1
            channel = channels.get(destination)
            if channel is None:
                try:
                    channel = self._ensure(client_id, destination, out)
                except BackendError as exc:  # those before it go; it and the rest not
                    return str(exc)
                channels[destination] = channel
            messages += _run_messages(
                streaks[start:end],
                blocks[start:end],
                prefix,
                first_id + len(messages),
                client_id,
                channel,
            )
            start = end
        return None

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
        auto_ack: bool = False,
    ) -> list[Outgoing]:
        """Consume the destinations' channels (created as needed); a wildcard one
        consumes every matching channel now and each one created later.  ``extras``:
        the queue subscription's selector, credit and include-seq (see :class:`SubExtras`);
        ``auto_ack``: the engine acknowledges the deliveries of the channels named (not
        those a wildcard joins) once the listener reports them taken
        (``Engine.acknowledge_taken``)."""
        client_id = self._client(conn)
        out: list[Outgoing] = []
        patterns = [d for d in destinations if d.wildcard]
        wild = None
        if patterns:
            wild = Wild(conn, tuple(patterns), prefetch, exclusive, extras=extras)
            limit = self.engine.config.limits.max_patterns
            new = self.wild.new_patterns(wild)
            if new and self.engine.patterns_held() + new > limit:  # (both doors)
                raise Refused(f"too many distinct wildcard patterns (max_patterns={limit})", out)
        for destination in destinations:
            if destination.wildcard:
                continue
            if destination.kind is DestinationKind.DSUB:
                try:
                    channel = existing_channel(self.engine, destination)
                except BackendError as exc:
                    raise Refused(str(exc), out) from None
            else:
                channel = self._ensure(client_id, destination, out)
            try:
                self._join(conn, channel, prefetch, exclusive, out, extras=extras)
            except OperationError as exc:
                raise Refused(f"{destination.stomp}: {exc.reason}", out) from None
            if auto_ack:
                self.engine.acknowledge_taken(client_id, channel, runs=True)
        if wild is not None:
            self.wild.add((conn, sub_id), wild)
            for name in list(self.engine.channels):
                if wild.matches(name):
                    with contextlib.suppress(OperationError):  # not authorized: skipped
                        self._join(conn, name, prefetch, exclusive, out, wild, extras=extras)
        return out

    def op_acknowledge_taken(
        self, conn: int, channels: Sequence[str], on: bool, now: float
    ) -> list[Outgoing]:
        """Whether the engine acknowledges the deliveries of the connection's
        ``channels`` once reported taken (off: the listener acknowledges them itself)."""
        client_id = self.client_of.get(conn)
        if client_id is not None:
            for channel in channels:
                self.engine.acknowledge_taken(client_id, channel, on, runs=True)
        return []

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
                raise Refused(f"durable subscription {sub_id!r}: not authorized", out)
            try:
                durable.create(sub_id, channels, out, self.engine.clients.get(client_id))
            except OperationError as exc:
                raise Refused(f"durable subscription {sub_id!r}: {exc.reason}", out) from None
        elif durable.get(sub_id) is None:
            raise Refused(f"no durable subscription {sub_id!r}", out)
        try:
            self._join(conn, name, prefetch, False, out)
        except OperationError as exc:
            raise Refused(f"/dsub/{sub_id}: {exc.reason}", out) from None
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
        """The next page of messages the channel's queue holds from sequence ``from_seq``
        on (``engine_browse.read_page``: nothing is consumed), posted to the listener as
        one page; fewer than a page: the browse is at its end."""
        client_id = self._client(conn)
        if not self._allows(client_id, Action.BROWSE, channel):
            raise BackendError(f"not authorized to browse {channel!r}")
        page = read_page(self.engine, conn, sub_id, channel, from_seq)
        if self.post is not None and self.browsed is not None:
            posted = bound(self._post, bound(self.browsed, page))
            self.after_durable(posted, posted)
        return []

    def op_follow(
        self, conn: int, sub_id: str, channel: str, from_seq: int, now: float
    ) -> list[Outgoing]:
        """A ``browser-end:false`` browser read its queue to the end: its next page is
        read (and posted) once the queue numbers a message at ``from_seq`` or past it."""
        if conn not in self.client_of:
            return []
        self.followers.add(channel, conn, sub_id, from_seq)
        self._wake_followers()
        return []

    def op_unfollow(self, conn: int, sub_id: str, now: float) -> list[Outgoing]:
        """A browsing subscription ended: it waits for nothing more."""
        self.followers.drop(conn, sub_id)
        return []

    def _wake_followers(self) -> None:
        """Post the next page to every follower whose queue got a message for it."""
        if self.post is None or self.browsed is None:
            return
        for channel, conn, sub_id, start in self.followers.due(self.engine):
            page = read_page(self.engine, conn, sub_id, channel, start)
            posted = bound(self._post, bound(self.browsed, page))
            self.after_durable(posted, posted)

    def op_drop_wildcard(self, conn: int, sub_id: str, now: float) -> list[Outgoing]:
        """A wildcard subscription ended: stop consuming what it joined."""
        wild = self.wild.pop((conn, sub_id))
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
        leaving: Sequence[str] = (),
        unwritten: Collection[int] = (),
    ) -> list[Outgoing]:
        """Report ``counts`` deliveries taken, then acknowledge (True) or nack each.
        ``leaving``: channels no longer acknowledged by taking (``ack:auto`` ended).
        ``unwritten``: the positions among the ``counts`` (0: the first) of deliveries
        that never reached the socket (held for a subscription that went, or arrived
        after it went), nacked in ``settles``: back to their queue, not counted sent,
        not redeliveries (``flow.transmitted``)."""
        client_id = self.client_of.get(conn)
        out: list[Outgoing] = []
        if client_id is None:
            return out
        engine = self.engine
        for channel in leaving:
            engine.acknowledge_taken(client_id, channel, on=False)
        if counts:
            left = {client_id: unwritten} if unwritten else None
            out.extend(engine.transmitted({client_id: counts}, now, left))
        if settles:
            nack = NackReason.NONE
            acks = [(ch, qid, mid, None if ok else nack) for ch, qid, mid, ok in settles]
            out.extend(engine.acknowledge_many(client_id, acks, now))
        return out


class Refused(Exception):
    """An operation refused by the engine, with the output it caused before that."""

    def __init__(self, reason: str, out: list[Outgoing]) -> None:
        super().__init__(reason)
        self.reason = reason
        self.out = out


def bound(fn: Callable[[T], None], arg: T) -> Callable[[], None]:
    return lambda: fn(arg)


def _run_all(fns: list[Callable[[], None]]) -> None:
    for fn in fns:
        try:
            fn()
        except Exception:  # as the loop would for separate callbacks: logged, go on
            log.exception("STOMP listener callback failed")


def _at_once(fn: Callable[[], None], failed: Callable[[], None] | None = None) -> None:
    fn()


def _unsaved(answer: PublishAnswer, error: Refusal | None) -> tuple[PublishAnswer, Refusal | None]:
    """``(answer, error)`` as it goes when the store failed before it (``_answer_unsaved``)."""
    if isinstance(answer, partial):  # a run's (BatchAnswer, taken): none of it confirmed
        taken = answer.args[0]
        if error is None or taken > 0:
            return partial(answer.func, 0), STORE_FAILED
        return answer, error
    return answer, STORE_FAILED if error is None else error


#: ``Message(...)`` from a tuple of every field, without the named tuple's Python-level
#: ``__new__`` (one per SEND of a run).
_new_message = tuple.__new__


class _Run(IntEnum):
    """What :meth:`EngineDoor.op_publish_batch` makes of a run of SENDs."""

    MIXED = 0  # one by one (a SEND retains, or names several or another kind)
    MANY = 1  # plain (``EngineDoor._publish_plain``), to several destinations
    ONE = 2  # plain, every SEND naming the same destinations tuple


def _plain_run(streaks: Sequence[PublishStreak]) -> _Run:
    """Is every SEND of a run one to one queue or topic that retains nothing
    (``EngineDoor._publish_plain``), and do they all name one destinations tuple?  One
    loop over the run's streaks, no call per streak: the destinations a streak shares
    with the one before it (the session's run reader hands a run to one destination the
    same tuple) are not looked at again."""
    last: tuple[Destination, ...] | None = None
    changes = 0
    for streak in streaks:
        if streak.retain is not None:
            return _Run.MIXED
        destinations = streak.destinations
        if destinations is last:
            continue
        if len(destinations) != 1 or destinations[0].kind not in _PLAIN_KINDS:
            return _Run.MIXED
        last = destinations
        changes += 1
    return _Run.ONE if changes == 1 else _Run.MANY


def _header_blocks(streaks: Sequence[PublishStreak], stamp: Headers) -> list[Headers]:
    """Each streak's messages' headers: its own, then ``stamp``; one object for streaks
    whose headers are equal (and ``stamp`` itself for none: ``() + stamp``), so every
    message of a run whose SENDs carry the same headers holds the same header block (the
    engine reads a block once per run of it)."""
    blocks: list[Headers] = []
    carried: Headers | None = None
    headers = stamp
    for streak in streaks:
        if streak[1] != carried:
            carried = streak[1]
            headers = carried + stamp
        blocks.append(headers)
    return blocks


def _run_sends(
    streaks: Sequence[PublishStreak],
    blocks: Sequence[Headers],
    prefix: str,
    first_id: int,
    client_id: str,
    channel: str,
) -> Sequence[Message]:
    """The engine's messages of a run of SENDs to one channel (``_publish_plain``'s
    ``one``): a :class:`~broker.protocol.PlainSends` -- no message made per SEND until
    the engine reads one -- when every streak has the same header block (the usual run:
    the SENDs carry the same headers), else :func:`_run_messages`."""
    block = blocks[0]
    if any(b is not block for b in blocks):
        return _run_messages(streaks, blocks, prefix, first_id, client_id, channel)
    if len(streaks) == 1:
        bodies = streaks[0][2][:]  # (its own list: the engine may keep slices of it)
    else:
        bodies = [body for streak in streaks for body in streak[2]]
    return PlainSends(prefix, first_id, client_id, channel, QUEUE_ID, block, bodies)


def _run_messages(
    streaks: Sequence[PublishStreak],
    blocks: Sequence[Headers],
    prefix: str,
    first_id: int,
    client_id: str,
    channel: str,
) -> list[Message]:
    """The engine's messages of streaks of SENDs to one channel
    (``EngineDoor._publish_plain``): ids ``<prefix><first_id + i>``, headers the streak's
    block (:func:`_header_blocks`), each SEND's body; one comprehension per streak, no
    call per SEND."""
    messages: list[Message] = []
    i = first_id
    for streak, headers in zip(streaks, blocks, strict=True):
        bodies = streak[2]
        messages += [
            _new_message(
                Message,
                (
                    f"{prefix}{j}",
                    client_id,
                    channel,
                    QUEUE_ID,
                    False,
                    False,
                    False,
                    DEFAULT_TTL,
                    headers,
                    body,
                    None,
                ),
            )
            for j, body in enumerate(bodies, i)
        ]
        i += len(bodies)
    return messages


def _streak_of(streaks: Sequence[PublishStreak], index: int) -> PublishStreak:
    """The streak holding the run's SEND ``index`` (counted from 0)."""
    for streak in streaks:
        if index < len(streak[2]):
            return streak
        index -= len(streak[2])
    raise IndexError(index)


#: The destination kinds a plain SEND goes to.
_PLAIN_KINDS = (DestinationKind.QUEUE, DestinationKind.TOPIC)


def _temporary_queue(channel: str) -> bool:
    """Is ``channel`` a temporary queue's (of any virtual host)?"""
    destination = destination_of(channel)
    return destination.kind is DestinationKind.QUEUE and temp_owner(destination.name) is not None
