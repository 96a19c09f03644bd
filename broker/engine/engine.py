"""The sans-IO broker engine: messages and frames in, output out, time passed in.

Two ways in, one engine behind them.  The TMQP door (``broker.server``) decodes frames
and calls :meth:`Engine.receive` with the client id, the frame, a monotonic ``now`` and
(optionally) the octets it decoded; queue frames become :class:`~broker.message.Message`
values there (``broker.engine.tmqp_door``) and everything below works with messages.
Any other front door (STOMP, a federation link) calls the typed operations instead,
without building a TMQP frame:

- :meth:`Engine.connect` / :meth:`Engine.disconnect` -- a client comes and goes;
- :meth:`Engine.publish` -- push a :class:`Message` into queue ``content_type`` of
  channel ``target`` (``wants_ack``: the producer waits for an acknowledge);
- :meth:`Engine.subscribe` / :meth:`Engine.unsubscribe` -- become (stop being) a
  consumer of a channel, with an optional window (``prefetch``);
- :meth:`Engine.acknowledge` -- settle a delivery (negatively with a ``nack_reason``);
- :meth:`Engine.pull` -- pull messages from a Pull (or Cache) queue;
- :meth:`Engine.transmitted` and :meth:`Engine.tick` -- the transport took deliveries,
  time passed.

Each returns the :class:`Outgoing` items to send: a queue delivery is a ``Tracked``
item carrying a :class:`Message` (the door encodes it: the TMQP door as a QUEUE frame,
sending the received octets of a message passed through unchanged); replies, acknowledges
to producers, pull markers, events and direct messages are still TMQP frames
(``broker.engine.frames``; ``broker.protocol`` names their types and headers), which a
door other than TMQP translates.  ``subscribe``/``unsubscribe`` raise
:class:`OperationError` when refused; the others answer refusals in their output, as on
TMQP.  The engine never reads a clock, never raises out of ``receive``/``tick``/
``disconnect``, and answers a malformed request with an acknowledge or response carrying
the result code when the sender waits for one.

Replies (zerohub's reading of the document where it is loose):

- Server operations (0x10) are always answered, with an ACK (create/update/delete/join/
  leave) or a RESPONSE (lists, information); a request that set only ``pending_response``
  gets a RESPONSE either way.  Both carry the request's message id and the result code
  as content type; a failure adds ``Nack-Reason`` (a token, see
  ``protocol.CODE_FOR_NACK_REASON``) and a human ``Reason`` header.  RESPONSE payloads
  are JSON.
- A push (0x11) the server rejects is answered, if the producer waits for an ack, by a
  negative ACK (content type = queue id, target = channel) with a ``Nack-Reason`` token;
  if it waits for a response, by a RESPONSE with the result code.
- Pull requests (0x15) are answered as the document says: queue messages with
  ``Request-Id``/``Index``/``Count``, always ended by a ``No-Content: End`` marker;
  problems come as one ``No-Content`` marker (Empty, Unauthorized, ...) before the End.
  A queue in Cache status answers with one RESPONSE (0 and the cached message, or 404).
- Direct messages (0x12) and responses (0x14) are forwarded with ``source`` set to the
  sender; a receiver that disconnects before answering a request makes the server
  answer the requester with a 581 (SendError) response.

:class:`Engine` is one class that has its parts (``broker.engine.parts``), one module
each, every import pointing down:

- ``host`` -- the queues' services (``QueueHost``): handlers, timers, store, errors;
- ``channels`` -- the channel registry: channels and queues, creation, removal, join, leave;
- ``clients`` -- the client registry: connections, direct messages and responses;
- ``router`` -- the router table; ``routing`` -- publishing through a router;
- ``events`` -- the event hub; ``operations`` -- server operations (0x10) and event
  subscriptions; ``replies`` -- answers the engine sends on its own;
- this module -- frames in (:meth:`Engine.receive` dispatches by message type through a
  table), queue messages (push, CC copies, acknowledges, pull), flow control, time,
  recovery and statistics.

Flow control (``broker.flow``): queue deliveries come out as :class:`Tracked` frames; the
wire calls :meth:`Engine.transmitted` with how many of each client's tracked frames its
socket took, in order, and a consumer never has more than its window of deliveries in
flight.  When a client goes away (:meth:`Engine.disconnect`) what it was handed but never
got returns to the queues.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Callable, Collection, Container, Iterable, Mapping, Sequence

from broker import paging, tmqp
from broker.engine import flow, models, operations, quotas, receipts, routing
from broker.engine.auth import Action, AllowAll, Authorizer
from broker.engine.channels import Channel, ChannelRegistry, Client, valid_channel_name
from broker.engine.clients import ClientRegistry
from broker.engine.definitions import DSUB_PREFIX, ROUTER_PREFIX
from broker.engine.delivery import (
    DefaultDeliveryHandler,
    DeliveryHandler,
    PersistentDeliveryHandler,
)
from broker.engine.dsubs import DurableSubscriptions
from broker.engine.errors import ClientRejected, EngineError, OperationError, RunFailed
from broker.engine.events import EventHub
from broker.engine.fanout import FanoutStreams
from broker.engine.federated import FEDERATION_CLIENT, FederatedIds
from broker.engine.frames import pull_marker
from broker.engine.host import QueueServices
from broker.engine.message import DONE, QueueMessage
from broker.engine.octets_run import push_octets_run, single_reader
from broker.engine.options import (
    DEFAULT_RETAIN_LIMIT,
    BrokerConfig,
    ChannelOptions,
    ChannelQueueOptions,
)
from broker.engine.parts import EngineParts
from broker.engine.queue.queue import Queue
from broker.engine.queue.saved_run import push_saved_run
from broker.engine.replies import answer_done, answer_failure, is_answer, reject_push
from broker.engine.retain import RETAIN_KEY, check_retain_status, retain_wish
from broker.engine.router import Router, RouterError, RouterTable, router_from_json
from broker.engine.tmqp_door import frame_of, message_of, shape_of
from broker.message import Headers, Message
from broker.protocol import (
    ClearOption,
    ConnectionInfo,
    EventName,
    Header,
    MessageType,
    NackReason,
    NoContent,
    Outgoing,
    PlainSends,
    ResultCode,
    Tracked,
    header,
)
from broker.store import NOT_SAVED, MemoryStore, Store

__all__ = [
    "ClientRejected",
    "Engine",
    "EngineError",
    "Message",
    "OperationError",
    "Outgoing",
    "Tracked",
    "valid_channel_name",
]

log = logging.getLogger("broker.engine.engine")

_Handler = Callable[[Client, tmqp.Frame, float, list[Outgoing]], None]
_QUEUE = int(MessageType.QUEUE)
_ACK = int(MessageType.ACK)
_RESPONSE = int(MessageType.RESPONSE)
_Frame = tmqp.Frame
_NACK = Header.NACK_REASON.lower()
_REASON = Header.REASON.lower()
_CC = Header.CC.lower()
_PATTERN = Header.PATTERN.lower()
#: Why a push carrying ``Pattern`` is refused (a pattern is joined, never pushed to).
_PATTERN_PUSH = "a push cannot name a pattern (Pattern is for JOIN and LEAVE)"
_NO_RECEIPT: tuple[str, int | None] = ("", None)
#: A push a collaborator failed (it raised): how a producer that waits is refused.
_INTERNAL = OperationError(ResultCode.FAILED, "internal error")
#: A batch's push a collaborator failed, as the batch's acknowledge refuses it.
_FAILED = (_INTERNAL.token, _INTERNAL.reason)
#: A push its handler wanted saved that the store refused.
_UNSAVED = OperationError(ResultCode.FAILED, NOT_SAVED)
#: A handler whose ``received_from_producer`` is this saves and confirms every push
#: (``SAVE_ACK``): its queue's acknowledged runs may take ``saved_run``.
_SAVES_EVERY_PUSH = PersistentDeliveryHandler.received_from_producer
#: Header names (lower case) a push's typed path acts on (``Engine._push``).
#: Why a run's push that ``check_push`` refused was refused (as :meth:`Engine._push` says).
_REFUSED_BY_QUEUE = "push refused by the queue"
_ACTED_ON = frozenset(
    {
        _CC,
        _PATTERN,
        receipts.RECEIPT.lower(),
        receipts.RECEIPT_TIMEOUT.lower(),
        Header.RETAIN.lower(),
    }
)


def _names_pattern(headers: tuple[tuple[str, str], ...]) -> bool:
    """Does a push carry a ``Pattern`` header (whatever its value)?"""
    return any(k.lower() == _PATTERN for k, _ in headers)


def _acted_on(headers: tuple[tuple[str, str], ...]) -> bool:
    """Does a header ask :meth:`Engine._push` for more than a plain accept?"""
    for name, _ in headers:  # noqa: SIM110  (per message: no generator)
        if name.lower() in _ACTED_ON:
            return True
    return False


#: A handler whose ``received_from_producer`` is this confirms every push on receipt
#: (``ALLOW_ACK``) on a queue without consumer acknowledges: ``saved_run`` too.
_CONFIRMS_EVERY_PUSH = DefaultDeliveryHandler.received_from_producer


def _not_copied(primary: Queue, m: Message, missed: list[tuple[str, int]]) -> OperationError:
    """The refusal of push ``m``, taken by ``primary`` but not by the queues ``missed``
    (CC queues, durable subscriptions: their keys); ``primary`` forgets its id, so the
    resend is taken (again, at least once) and reaches the copies, instead of being
    answered as a duplicate done."""
    if m.message_id:
        primary.recent.forget(m.message_id)
    names = ", ".join(f"{channel}/{qid}" for channel, qid in missed)
    where = f"{primary.channel.name}/{primary.id}"
    return OperationError(ResultCode.FAILED, f"taken by {where}, not by {names}")


def _saves_every_push(queue: Queue) -> bool:
    """Does the queue's handler save every push and confirm it once saved?"""
    return type(queue.hooks.handler).received_from_producer is _SAVES_EVERY_PUSH


def _answers_alike(queue: Queue) -> bool:
    """Does the queue's handler decide the same for every push (``saved_run``)?"""
    decides = type(queue.hooks.handler).received_from_producer
    return decides is _SAVES_EVERY_PUSH or (
        decides is _CONFIRMS_EVERY_PUSH and not queue.options.request_acknowledge
    )


def _default_id_factory() -> Callable[[], str]:
    prefix = os.urandom(4).hex()
    counter = itertools.count(1)
    return lambda: f"{prefix}-{next(counter):x}"


class Engine:
    """Channels, queues, clients, routers and events, driven by frames and a clock value."""

    def __init__(
        self,
        *,
        handler: DeliveryHandler | None = None,
        authorizer: Authorizer | None = None,
        store: Store | None = None,
        new_id: Callable[[], str] | None = None,
        config: BrokerConfig | None = None,
        handlers: Mapping[str, DeliveryHandler] | None = None,
    ) -> None:
        self.config = config = config or BrokerConfig()
        self.authorizer = authorizer = authorizer or AllowAll()
        self.store = store = store if store is not None else MemoryStore()
        self.new_id = new_id = new_id or _default_id_factory()
        self.events = events = EventHub()
        clients: dict[str, Client] = {}
        self.services = services = QueueServices(
            config, store, new_id, handler or DefaultDeliveryHandler(), handlers or {}, clients
        )
        self.channel_registry = ChannelRegistry(config, authorizer, store, events, services)
        self.client_registry = ClientRegistry(
            config, authorizer, new_id, events, self.channel_registry, services, clients
        )
        self.router_table = RouterTable(config.limits)
        #: Receipts asked for by producers (``broker.engine.receipts``).
        self.receipts = services.receipts
        #: Durable subscriptions (``broker.engine.dsubs``): topic copies kept while away.
        self.durable = DurableSubscriptions(self.channel_registry)
        #: Federation ids taken (``broker.engine.federated``): a resend is not queued again.
        self.federated = FederatedIds(store)
        self.parts = EngineParts(
            config,
            authorizer,
            events,
            services,
            self.channel_registry,
            self.client_registry,
            self.router_table,
            self.durable,
        )
        #: Connected clients by id; channels by name; routers by name (the registries' tables).
        self.clients = clients
        self.channels = self.channel_registry.channels
        self.routers = self.router_table.routers
        #: While a batch is served (:meth:`receive_batch`, :meth:`receive_pushes` asked
        #: for its refusals): the refusals of its pushes whose producer waits for nothing
        #: of their own, (nack reason, reason) as noted by :meth:`_push` and
        #: :meth:`receive`, each taken by the loop that served that push; None otherwise.
        self._unheard: list[tuple[str, str]] | None = None
        for spec in config.routers:
            self.add_router(router_from_json(spec))
        parts = self.parts
        direct = self.client_registry
        #: Message type -> what handles a frame of it (anything else: 406 Unacceptable).
        self._handlers: dict[int, _Handler] = {
            MessageType.QUEUE: lambda c, f, now, out: self._push(
                c, message_of(f), f.pending_response, now, out
            ),
            MessageType.ACK: self._on_ack,
            MessageType.PULL: self._pull,
            MessageType.DIRECT: lambda c, f, now, out: direct.direct(c, f, out),
            MessageType.RESPONSE: lambda c, f, now, out: direct.on_response(c, f, out),
            MessageType.SERVER: lambda c, f, now, out: operations.dispatch(parts, c, f, now, out),
            MessageType.EVENT: lambda c, f, now, out: operations.event_subscription(
                parts, c, f, out
            ),
            MessageType.ROUTER: lambda c, f, now, out: routing.publish(parts, c, f, now, out),
            MessageType.TERMINATE: lambda c, f, now, out: out.extend(self.disconnect(c.id, now)),
        }

    # ------------------------------------------------------------------ the parts' API

    @property
    def handler(self) -> DeliveryHandler:
        """The default delivery handler (queues created afterwards use a new one)."""
        return self.services.handler

    @handler.setter
    def handler(self, handler: DeliveryHandler) -> None:
        self.services.handler = handler

    @property
    def handlers(self) -> dict[str, DeliveryHandler]:
        return self.services.handlers

    @property
    def errors(self) -> int:
        """Errors caught inside the engine (the queues count their own)."""
        return self.services.errors

    @property
    def unmatched_acks(self) -> int:
        return self.client_registry.unmatched_acks

    @property
    def queue_count(self) -> int:
        return self.channel_registry.queue_count

    @property
    def timer_count(self) -> int:
        """Queue wake-ups armed (superseded ones included until they come due)."""
        return len(self.services.timers)

    def create_channel(
        self,
        name: str,
        options: ChannelOptions | None = None,
        out: list[Outgoing] | None = None,
        creator: str | None = None,
    ) -> Channel:
        """Create a channel (Python API; OperationError when invalid, existing or past a
        limit); ``creator``: the id of the connected client whose user it counts for
        (``broker.engine.quotas``; None: for no one)."""
        by = self.clients.get(creator) if creator is not None else None
        return self.channel_registry.create_channel(name, options, out, by)

    def create_queue(
        self,
        channel_name: str,
        queue_id: int,
        options: ChannelQueueOptions | None = None,
        out: list[Outgoing] | None = None,
        creator: str | None = None,
    ) -> Queue:
        """Create a queue in an existing channel, enforcing the channel's queue rules and
        the limits; ``creator`` as for :meth:`create_channel`."""
        by = self.clients.get(creator) if creator is not None else None
        return self.channel_registry.create_queue(channel_name, queue_id, options, out, by)

    def add_router(self, router: Router) -> Router:
        """Register a router (Python API; the wire has operation 601)."""
        return self.router_table.add(router)

    def remove_router(self, name: str) -> bool:
        return self.router_table.remove(name)

    def find_receivers(self, target: str) -> list[Client]:
        """Clients a direct target names: an id, ``@name:X`` or ``@type:X`` (oldest first)."""
        return self.client_registry.find_receivers(target)

    def count_error(self, where: str, error: Exception) -> None:
        self.services.count_error(where, error)

    # ------------------------------------------------------------------ connections

    def connect(
        self, info: ConnectionInfo, now: float, *, replace: bool = False, federation: bool = False
    ) -> tuple[str, list[Outgoing]]:
        """Register a client; raises :class:`ClientRejected` (401, 481, 482 or 400).

        The token is checked first: a refused client changes nothing.  An id in use is
        refused (481), unless ``replace``: the front end has proven that this connection
        belongs to the owner of that session (its session secret or CURVE key), whose old
        session then ends as if by :meth:`disconnect` before the new one takes the id.
        The federation client's id is refused (401) unless ``federation``: the front end
        has proven that this connection is this broker's own federation client
        (``broker.engine.federated``).
        """
        self.services.now = now
        registry = self.client_registry
        client_id = registry.admit(info, replace, federation)
        out: list[Outgoing] = []
        if client_id in self.clients:
            out.extend(self.disconnect(client_id, now))
        registry.add(client_id, info, now, out)
        return client_id, out

    # ------------------------------------------------------------------ frames in

    def receive(
        self, client_id: str, frame: tmqp.Frame, now: float, data: bytes | None = None
    ) -> list[Outgoing]:
        """Process one frame from a connected client (anything after connection info).

        ``data``: the octets the frame was decoded from, if the caller has them: a queue
        message delivered unchanged is then sent as those octets (``tmqp_door``).
        """
        self.services.now = now
        out: list[Outgoing] = []
        client = self.clients.get(client_id)
        if client is None:
            return out
        mt = frame.message_type
        try:
            if mt == _QUEUE:
                self._push(client, message_of(frame, data), frame.pending_response, now, out)
                if self.receipts.outbox:
                    self.receipts.take(out)
                return out
            handle = self._handlers.get(mt)
            if handle is not None:
                handle(client, frame, now, out)
            else:
                answer_failure(
                    client,
                    frame,
                    out,
                    OperationError(ResultCode.UNACCEPTABLE, f"message type {mt:#x} not handled"),
                )
        except Exception as exc:
            self.count_error(f"receive type {mt:#x}", exc)
            answer_failure(client, frame, out, _INTERNAL)
            if mt == _QUEUE and self._unheard is not None and not frame.pending_ack:
                self._unheard.append(_FAILED)
        self.receipts.take(out)
        return out

    def receive_batch(
        self,
        client_id: str,
        items: Sequence[tuple[int, tmqp.Frame, bytes]],
        now: float,
    ) -> tuple[list[Outgoing], list[tuple[int, str, str]], list[int]]:
        """Several frames of one client in one call (a TMQP batch, ``broker.batch``):
        ``items`` are (index in the batch, frame, its octets).

        Returns the output of every frame except the acknowledges of its pushes, which
        the caller answers with one acknowledge of the whole batch; the pushes refused:
        (index, nack reason, reason) -- plain ones too (refused by their queue, failed
        inside, not saved: noted by :meth:`_push` and :meth:`receive` in ``_unheard``),
        no push goes untold; and the indexes of acknowledged pushes that got no
        acknowledge yet (one comes later on its own).  The outcome is that of each frame
        handled as :meth:`receive` handles it alone, in order; a run of pushes into one
        existing queue that need no answer and carry no headers goes in with one call
        (:meth:`_push_run`: the checks of the run once, ``Queue.push_plain_run``), and
        so does a run of acknowledged ones into a queue whose handler answers each alike
        (``saved_run``); the other frames one by one.  The store holds the batch's saves
        and writes each queue's consecutive ones as one group (``Store.hold``): one
        write, one ticket, one durability wait for the batch's acknowledge.
        """
        self.services.now = now
        client = self.clients.get(client_id)
        if client is None:
            return [], [], []
        store = self.store
        store.hold()
        self._unheard = []
        try:
            return self._receive_each(client_id, client, items, now)
        finally:
            self._unheard = None
            store.release()

    def _receive_each(
        self,
        client_id: str,
        client: Client,
        items: Sequence[tuple[int, tmqp.Frame, bytes]],
        now: float,
    ) -> tuple[list[Outgoing], list[tuple[int, str, str]], list[int]]:
        """:meth:`receive_batch` of a known client, its saves held."""
        out: list[Outgoing] = []
        refused: list[tuple[int, str, str]] = []
        later: list[int] = []
        unheard = self._unheard
        assert unheard is not None
        receive = self.receive
        n = len(items)
        i = 0
        run_end = 0  # items[run_start:run_end]: pushes into one queue that wait for nothing
        run_start = 0  # (or, ``acked``, all for an acknowledge)
        acked = False
        run_queue: Queue | None = None  # their queue, when they may take its fast path
        run: list[Message] = []  # their messages
        while i < n:
            index, frame, data = items[i]
            if i >= run_end and (
                frame.message_type == _QUEUE and not frame.headers and not frame.pending_response
            ):
                acked = frame.pending_ack  # a run of acknowledged pushes: ``saved_run``
                run_start, run_end = i, self._run_end(items, i, acked)
                run_queue = None
                if run_end - i > 1:
                    run_queue = self._run_queue(client, frame, acked)
                    if run_queue is not None:
                        run = [message_of(f, d) for _, f, d in items[i:run_end]]
            if run_queue is not None and i < run_end:
                if acked:
                    taken = self._push_acked_run(run_queue, run, i - run_start, client, now,
                                                 out, refused, items, run_start)  # fmt: skip
                else:
                    try:
                        taken = run_queue.push_plain_run(run, i - run_start, client, now, out)
                    except RunFailed as exc:  # one push failed: the rest of the run goes on
                        self.count_error("receive batch", exc.cause)
                        taken = exc.done
                        refused.append((items[i + taken - 1][0], *_FAILED))
                    except Exception as exc:  # how far it went is unknown: all refused
                        self.count_error("receive batch", exc)
                        taken = run_end - i
                        refused += [(index, *_FAILED) for index, _f, _d in items[i:run_end]]
                if taken:
                    i += taken
                    continue
            outs = receive(client_id, frame, now, data)
            if frame.message_type == _QUEUE and frame.pending_ack:
                self._take_push_ack(client_id, index, frame, outs, refused, later)
            elif unheard:  # a plain push refused: the batch's acknowledge says so
                refused.append((index, *unheard[0]))
                unheard.clear()
            out += outs
            i += 1
        return out, refused, later

    def receive_pushes(
        self,
        client_id: str,
        messages: Sequence[Message],
        now: float,
        refused: list[tuple[int, str, str]] | None = None,
    ) -> list[Outgoing]:
        """Pushes of one client that wait for no response, plain ones and ones waiting
        for an acknowledge (``Message.wants_ack``), as :meth:`receive` of each frame
        alone gives them, in order: each acknowledged push gets its own acknowledge,
        positive or negative, in its place.  The server's run of a producer's pushes read
        in one socket drain, made with ``tmqp.decode_message_records`` (no frame on the
        way).  Consecutive pushes of one kind into one queue whose fast path may take
        them go in with one call (:meth:`_run_queue`: the checks once): plain ones with
        ``Queue.push_plain_run``, acknowledged ones with ``saved_run`` (the queue's
        handler answers each alike); the others one by one through the general push
        path.  The store holds their saves and writes each queue's as one group (as
        :meth:`receive_batch`): one write, one durability wait for their acknowledges.

        ``refused`` (an acknowledged batch of plain pushes: its acknowledge names what
        was not taken): the plain pushes not taken are added to it as (index in
        ``messages``, nack reason, reason), in order -- refused by their queue (as
        :meth:`receive_batch` refuses them) or failed inside (a push raising alone or
        in its run: ``RunFailed``).  None: they go unanswered, as each would alone."""
        self.services.now = now
        client = self.clients.get(client_id)
        out: list[Outgoing] = []
        if client is not None:
            self.store.hold()
            if refused is not None:
                self._unheard = []
            try:
                self._push_each(client, messages, now, out, refused)
            finally:
                self._unheard = None
                self.store.release()
        return out

    def receive_push_octets(
        self, client_id: str, datas: Sequence[bytes], now: float, readers: Container[str]
    ) -> tuple[int, list[Outgoing]]:
        """The TMQP door's run of a producer's pushes as the octets they came in (plain
        ones and ones waiting for an acknowledge, not decoded): how many from the first on
        were delivered as those octets to their queue's one consumer (``readers``: the
        client ids that read deliveries as TMQP octets), and the output.  The rest (all
        of them when the run does not qualify) go on through :meth:`receive_pushes`, in
        order, as if those had been its first ones (``broker.engine.octets_run``: the
        checks)."""
        out: list[Outgoing] = []
        client = self.clients.get(client_id)
        if client is None or not datas:
            return 0, out
        first = shape_of(datas[0])
        if first is None:
            return 0, out
        m, shape = first
        if m.source != client_id:
            return 0, out
        queue = self._run_queue(client, m)
        if queue is None:
            return 0, out
        one = single_reader(queue, readers)
        if one is None:
            return 0, out
        self.services.now = now
        return push_octets_run(queue, one, datas, shape, now, out), out

    def _push_each(
        self,
        client: Client,
        messages: Sequence[Message],
        now: float,
        out: list[Outgoing],
        refused: list[tuple[int, str, str]] | None,
    ) -> None:
        """:meth:`receive_pushes` of a known client, its saves held."""
        unheard = self._unheard
        n = len(messages)
        i = 0
        while i < n:
            m = messages[i]
            acked = m.wants_ack
            queue = self._run_queue(client, m, acked) if i + 1 < n else None
            if queue is not None:
                if acked:
                    taken = self._push_acked_run(queue, messages, i, client, now, out)
                else:
                    try:
                        taken = queue.push_plain_run(messages, i, client, now, out)
                    except RunFailed as exc:  # one push failed: the rest goes on
                        self.count_error("receive pushes", exc.cause)
                        taken = exc.done
                        if refused is not None:
                            refused.append((i + taken - 1, *_FAILED))
                    except Exception as exc:  # how far it went is unknown: all refused
                        self.count_error("receive pushes", exc)
                        taken = self._same_queue(messages, i)
                        if refused is not None:
                            refused += [(k, *_FAILED) for k in range(i, i + taken)]
                if taken:
                    i += taken
                    continue
            try:
                self._push(client, m, False, now, out)
            except Exception as exc:
                self.count_error(f"receive type {_QUEUE:#x}", exc)
                answer_failure(client, frame_of(m), out, _INTERNAL)
                if unheard is not None and not acked:
                    unheard.append(_FAILED)
            if unheard:  # a plain push refused: the batch's acknowledge says so
                assert refused is not None
                refused.append((i, *unheard[0]))
                unheard.clear()
            if self.receipts.outbox:
                self.receipts.take(out)
            i += 1

    @staticmethod
    def _same_queue(messages: Sequence[Message], start: int) -> int:
        """How many of ``messages[start:]`` in a row go to the queue of the first."""
        first = messages[start]
        end = start + 1
        while end < len(messages) and (
            messages[end].target == first.target
            and messages[end].content_type == first.content_type
        ):
            end += 1
        return end - start

    @staticmethod
    def _run_end(
        items: Sequence[tuple[int, tmqp.Frame, bytes]], start: int, acked: bool = False
    ) -> int:
        """The end of the run of pushes from ``items[start]`` on into its queue that
        carry no headers and wait for no answer (``acked``: all wait for an acknowledge,
        none for a response)."""
        first = items[start][1]
        target = first.target
        content_type = first.content_type
        end = start + 1
        n = len(items)
        while end < n:
            f = items[end][1]
            if (
                f.message_type != _QUEUE
                or f.headers
                or f.pending_ack != acked
                or f.pending_response
                or f.content_type != content_type
                or f.target != target
            ):
                break
            end += 1
        return end

    def _run_queue(
        self, client: Client, first: tmqp.Frame | Message, acked: bool = False
    ) -> Queue | None:
        """The queue a run of pushes goes to when ``_push`` would offer each of them to
        its fast path (``Queue.push_plain``), or (``acked``: acknowledged pushes) when
        its handler answers every push alike (``saved_run``: it saves every push and
        confirms it once saved, or confirms it on receipt): it exists, the producer may
        push, no MESSAGE_PRODUCED subscriber and no durable subscription wait; None: one
        by one.  None of that changes within a batch or a drain's run (they hold only
        pushes and acknowledges)."""
        channel = self.channels.get(first.target)
        queue = channel.queues.get(first.content_type) if channel is not None else None
        if (
            queue is None
            or not (_answers_alike(queue) if acked else queue.plain)
            or self.events.has(EventName.MESSAGE_PRODUCED)
            or (self.durable.by_topic and self.durable.queues_for(queue.channel.name))
        ):
            return None
        authorizer = self.authorizer
        if type(authorizer) is not AllowAll and not authorizer.allows(
            client, Action.PUSH, queue.channel.name, queue.id
        ):
            return None  # refused one by one
        return queue

    def _push_acked_run(
        self,
        queue: Queue,
        run: Sequence[Message],
        start: int,
        client: Client,
        now: float,
        out: list[Outgoing],
        refused: list[tuple[int, str, str]] | None = None,
        items: Sequence[tuple[int, tmqp.Frame, bytes]] = (),
        run_start: int = 0,
    ) -> int:
        """``saved_run.push_saved_run`` of ``run[start:]``: how many it took.  Those
        whose producer must hear "no": in a batch (``refused``, the batch's ``items``
        from ``run_start`` on) refused by index, answered with the batch's acknowledge;
        else (single pushes, each its own acknowledge) answered as :meth:`receive`
        answers a failure."""
        said_no: list[tuple[int, str]] = []
        limit = self.config.limits.max_queue_messages
        answer = refused is None
        taken = push_saved_run(queue, run, start, client, now, out, limit, said_no,
                               saves=_saves_every_push(queue), answer=answer)  # fmt: skip
        for k, why in said_no:  # ("": not saved, the negative acknowledge of ``Ledger``)
            if refused is None:  # (only "internal error": a collaborator raised)
                answer_failure(client, frame_of(run[k]), out, _INTERNAL)
            else:
                refused.append((items[run_start + k][0], NackReason.FAILED, why))
        if self.receipts.outbox:
            self.receipts.take(out)
        return taken

    @staticmethod
    def _take_push_ack(
        client_id: str,
        index: int,
        frame: tmqp.Frame,
        outs: list[Outgoing],
        refused: list[tuple[int, str, str]],
        later: list[int],
    ) -> None:
        """Take the acknowledge of a batched push out of its output (the batch's one
        acknowledge answers it): a negative one becomes a refusal by index; none yet:
        the index goes to ``later``."""
        mid = frame.message_id
        for i, o in enumerate(outs):
            if is_answer(o, client_id, _ACK, mid):
                f = outs.pop(i)[1]
                if f.headers:
                    fields = {k.lower(): v for k, v in f.headers}
                    nack = fields.get(_NACK)
                    if nack is not None:
                        refused.append((index, nack, fields.get(_REASON, "")))
                return
        later.append(index)

    # ------------------------------------------------------------------ typed operations

    def publish(
        self, client_id: str, message: Message, now: float, *, wants_response: bool = False
    ) -> list[Outgoing]:
        """Push ``message`` into queue ``message.content_type`` of channel ``message.target``.

        As a TMQP QUEUE frame would: ``CC`` headers copy it into other queues, a refusal
        is answered only to a producer that waits (``message.wants_ack``: a negative
        acknowledge; ``wants_response``: a response with the code), a producer that
        waits for an acknowledge gets it when the queue's handler says so.  A wire form
        on ``message`` is dropped: only :meth:`receive` attaches the octets it was given.
        """
        if message.wire is not None:
            message = message.replace()  # octets come only from the door that read them
        return self._typed(
            client_id,
            now,
            "publish",
            lambda c, out: self._push_answered(c, message, wants_response, now, out),
        )

    def _push_answered(
        self, client: Client, m: Message, wants_response: bool, now: float, out: list[Outgoing]
    ) -> None:
        """:meth:`_push` for the typed operations: an error it raises refuses the push to a
        producer that waits (an internal one -- a collaborator that raised -- is counted
        and answered FAILED "internal error", as :meth:`receive` answers a frame): no
        waiting producer takes silence for success.  What the push did before it raised
        stays in ``out`` (deliveries it made go out: at least once, never a false yes)."""
        try:
            self._push(client, m, wants_response, now, out)
        except OperationError as err:  # (``_push`` answers its own refusals: a late one)
            reject_push(client, m, wants_response, out, err)
        except Exception as exc:
            self.count_error("publish", exc)
            reject_push(client, m, wants_response, out, _INTERNAL)

    def publish_many(
        self,
        client_id: str,
        messages: Sequence[Message],
        now: float,
        *,
        unique_ids: bool = False,
    ) -> tuple[list[Outgoing], int, str | None]:
        """Several :meth:`publish` calls of one client with ``wants_response`` in one
        operation (the STOMP door's run of SENDs), in order, up to the first refused.

        Consecutive messages into one queue go in as a run (:meth:`_push_run`): the
        queue, the authorizer, the durable subscriptions and the event subscribers are
        looked up once per run, not once per message.  The outcome is that of
        :meth:`publish` of each in turn, but for the authorizer: it is asked once per run
        (its answer, or its failure, for the first message stands for the run).

        ``unique_ids``: the messages' ids were made by the door itself, one per message
        and never a producer's (the STOMP door's ``stomp-<conn>-<n>``): no retry can
        repeat one, so a run into an acknowledged queue does not remember them in its
        duplicate window (``broker.engine.queue.dedupe``: ids the broker made up are not
        remembered), as the queue's own ids are not.

        A run of AUTO deliveries to a queue's single consumer leaves as one
        :class:`~broker.protocol.AutoRun` item when that consumer's transport takes runs
        (``acknowledge_taken(..., runs=True)``: ``Client.auto_runs``; see
        ``Queue.accept_many``); else every delivery is a ``Tracked`` frame.

        Returns the output, how many were taken, and why the next one was refused (None:
        all taken); the refusal's response is not in the output.  An unknown client gets
        ``([], 0, None)``."""
        taken = 0
        refused: str | None = None

        def run(c: Client, out: list[Outgoing]) -> None:
            nonlocal taken, refused
            i, n = 0, len(messages)
            while i < n:
                took, why = self._push_run(c, messages, i, now, out, unique_ids)
                taken += took
                i += took
                if why is not None:
                    refused = why
                    return

        out = self._typed(client_id, now, "publish", run)
        return out, taken, refused

    def _push_run(
        self,
        client: Client,
        ms: Sequence[Message],
        start: int,
        now: float,
        out: list[Outgoing],
        unique_ids: bool = False,
    ) -> tuple[int, str | None]:
        """Push the run of ``ms[start:]`` into the first one's queue (as :meth:`publish`
        with ``wants_response`` would, one after the other): how many were taken, and why
        the next one was refused (None: the whole run was taken).

        Once per run: the queue (created on the fly as for one push), the authorizer,
        the durable subscriptions its channel feeds, whether anyone subscribed to
        MESSAGE_PRODUCED.  Per message: the queue's and the broker's limits
        (``check_push``), room in the durable copies, ``accept``.  A message the typed
        path treats apart (an acknowledge wish, ``Receipt``/``Receipt-Timeout``/``CC``
        headers, a federated push) takes :meth:`_push_one`."""
        first = ms[start]
        target, qid = first.target, first.content_type
        end = start + 1
        if ms.__class__ is PlainSends:  # (one target and queue by construction)
            end = len(ms)
        else:
            for m in itertools.islice(ms, end, None):  # (a Message by position, the tuple
                if m[2] != target or m[3] != qid:  # it is: target, content_type; cheaper)
                    break
                end += 1
        if (end - start == 1 and not unique_ids) or client.id == FEDERATION_CLIENT:
            # (a single push of the door's own id takes the run's way too: into an
            # acknowledged queue through ``accept_many``, which keeps the queue's
            # stretch of unique ids unbroken for its drain's AUTO deliveries)
            return self._push_one(client, first, now, out)
        try:
            queue = self._run_target(client, target, qid, out)
            copies = self.durable.queues_for(queue.channel.name) if self.durable.by_topic else ()
        except OperationError as err:
            return 0, err.reason
        except Exception as exc:
            self.count_error("publish", exc)
            return 0, _INTERNAL.reason
        produced = self.events.has(EventName.MESSAGE_PRODUCED)
        if queue.options.request_acknowledge and not copies and not produced:
            return self._accept_run(client, queue, ms, start, end, now, out, unique_ids)
        check_push = self.channel_registry.check_push
        accept = queue.accept
        for k in range(start, end):
            m = ms[k]
            if m.wants_ack or (m.headers and _acted_on(m.headers)):
                _, why = self._push_one(client, m, now, out)
                if why is not None:
                    return k - start, why
                continue
            if m.wire is not None:
                m = m.replace()  # octets come only from the door that read them
            size = len(m.payload)
            try:
                code = check_push(queue, size)
                if code:
                    return k - start, _REFUSED_BY_QUEUE
                if copies:
                    self._check_durable(copies, size)
                unsaved = queue.unsaved
                qm = accept(m, client, now, out, False)
                if qm is not None and produced:
                    self._produced(queue, qm, out)
                missed: list[tuple[str, int]] | None = None  # (no list per message)
                for copy in copies:
                    if not self._copy_durable(copy, m, client, now, out):
                        missed = [*(missed or ()), copy.key]
            except OperationError as err:
                return k - start, err.reason
            except Exception as exc:
                self.count_error("publish", exc)
                return k - start, _INTERNAL.reason
            if queue.unsaved != unsaved:
                return k - start, _UNSAVED.reason  # (kept in memory, as for one push)
            if missed and qm is not None:  # (taken where it could be: refused aloud)
                return k - start, _not_copied(queue, m, missed).reason
        return end - start, None

    def _accept_run(
        self,
        client: Client,
        queue: Queue,
        ms: Sequence[Message],
        start: int,
        end: int,
        now: float,
        out: list[Outgoing],
        unique_ids: bool = False,
    ) -> tuple[int, str | None]:
        """:meth:`_push_run`'s loop for an acknowledged queue with no durable copies
        and no MESSAGE_PRODUCED subscriber (a STOMP ``/queue/``): the plain pushes in
        stretches through ``Queue.accept_many`` (``unique_ids``: see
        :meth:`publish_many`), the others one by one (as there)."""
        limit = self.config.limits.max_queue_messages
        plain: Headers = ()  # a header block read last and found to ask for nothing
        k = start
        while k < end:
            m = ms[k]
            headers = m.headers
            if m.wants_ack or (headers is not plain and headers and _acted_on(headers)):
                _, why = self._push_one(client, m, now, out)
                if why is not None:
                    return k - start, why
                k += 1
                continue
            plain = headers
            j = k + 1
            if ms.__class__ is PlainSends:  # (one block, no acknowledge wish: all alike)
                j = end
            else:
                for mj in itertools.islice(ms, j, end):  # (a run of SENDs shares one block:
                    if mj[6]:  # read once, not per push; by position: wants_ack, headers)
                        break
                    headers = mj[8]
                    if headers is not plain:
                        if headers and _acted_on(headers):
                            break
                        plain = headers
                    j += 1
            unsaved = queue.unsaved
            took, refused = queue.accept_many(
                ms, k, j, client, now, out, limit, remember_ids=not unique_ids
            )
            k += took
            if isinstance(refused, OperationError):
                return k - start, refused.reason
            if isinstance(refused, Exception):
                self.count_error("publish", refused)
                return k - start, _INTERNAL.reason
            if refused:
                return k - start, _REFUSED_BY_QUEUE
            if queue.unsaved != unsaved:
                return k - start - 1, _UNSAVED.reason  # (kept in memory, as for one push)
        return end - start, None

    def _run_target(
        self, client: Client, target: str, queue_id: int, out: list[Outgoing]
    ) -> Queue:
        """The queue a run of pushes goes to, once it may push there (OperationError
        if not: no such queue and none may be made, or not authorized)."""
        channel = self.channels.get(target)
        queue = channel.queues.get(queue_id) if channel is not None else None
        if queue is None:
            queue = self.channel_registry.resolve_queue(client, target, queue_id, out)
        authorizer = self.authorizer
        if type(authorizer) is not AllowAll and not authorizer.allows(
            client, Action.PUSH, queue.channel.name, queue.id
        ):
            raise OperationError(ResultCode.UNAUTHORIZED, "push not allowed")
        return queue

    def _push_one(
        self, client: Client, m: Message, now: float, out: list[Outgoing]
    ) -> tuple[int, str | None]:
        """One message of :meth:`publish_many` through :meth:`_push_answered`: (1, None)
        when taken, else (0, why) with its response taken out of ``out``."""
        if m.wire is not None:
            m = m.replace()  # octets come only from the door that read them
        mark = len(out)
        self._push_answered(client, m, True, now, out)
        # (a push's response, if any, is the last thing it adds; a delivery -- the
        # common last item -- is a Message: no call to tell)
        if (
            len(out) > mark
            and out[-1][1].__class__ is _Frame
            and is_answer(out[-1], client.id, _RESPONSE, m.message_id)
        ):
            f = out[-1][1]
            assert isinstance(f, _Frame)  # (what is_answer says)
            if f.content_type:  # (0: done, a resend taken before)
                del out[-1]
                return 0, header(f, Header.REASON) or f"code {f.content_type}"
        return 1, None

    def subscribe(
        self, client_id: str, channel: str, now: float, *, prefetch: int | None = None
    ) -> list[Outgoing]:
        """Make the client a consumer of ``channel`` (created on the fly when the
        configuration allows it); ``prefetch``: its own window for the channel's queues.

        Raises :class:`OperationError` when refused (no such channel, not authorized,
        ``prefetch`` below 1); the client is then left as it was.
        """
        if prefetch is not None and prefetch < 1:
            raise OperationError(ResultCode.BAD_REQUEST, "prefetch must be at least 1")
        limited = None if prefetch is None else min(prefetch, self.config.max_prefetch)
        parts = self.parts
        return self._typed(
            client_id,
            now,
            "subscribe",
            lambda c, out: operations.join_channel(parts, c, channel, limited, now, out),
        )

    def acknowledge_taken(
        self, client_id: str, channel: str, on: bool = True, *, runs: bool = False
    ) -> bool:
        """Whether the consumer acknowledges ``channel``'s deliveries by taking them: a
        delivery that waits for an acknowledge is then acknowledged (positively) once
        :meth:`transmitted` reports it taken, with no :meth:`acknowledge` per delivery
        (STOMP's ``ack:auto``).  Until the client leaves the channel; False (nothing set)
        when it is not a consumer of it.  ``runs`` (with ``on``): the client's transport
        takes a run of such deliveries as one :class:`~broker.protocol.AutoRun` item
        (the STOMP door; ``Client.auto_runs``, for as long as the client is connected),
        so a queue sends them so when it is their single consumer, from a run of pushes
        (:meth:`publish_many`) or a drain of its backlog; a client that never said so
        (a TMQP peer: its server writes one frame per delivery) gets one
        ``Tracked`` frame each."""
        client = self.clients.get(client_id)
        if client is None or channel not in client.channels:
            return False
        if on:
            client.auto_acked.add(channel)
            if runs:
                client.auto_runs = True
        else:
            client.auto_acked.discard(channel)
        return True

    def unsubscribe(self, client_id: str, channel: str, now: float) -> list[Outgoing]:
        """The client stops consuming ``channel``; raises :class:`OperationError` (404)
        when it was not a consumer of it."""
        parts = self.parts
        return self._typed(
            client_id,
            now,
            "unsubscribe",
            lambda c, out: operations.leave_channel(parts, c, channel, out),
        )

    def acknowledge(
        self,
        client_id: str,
        channel: str,
        queue_id: int,
        message_id: str,
        now: float,
        *,
        nack_reason: str | None = None,
    ) -> list[Outgoing]:
        """The client acknowledges a delivery (negatively with ``nack_reason``, one of
        ``protocol.NackReason``); one that matches no delivery is counted and ignored."""
        headers = ((Header.NACK_REASON, nack_reason),) if nack_reason is not None else ()
        ack = Message(message_id, client_id, channel, queue_id, headers=headers)
        return self._typed(
            client_id, now, "acknowledge", lambda c, out: self._ack(c, ack, now, out)
        )

    def acknowledge_many(
        self,
        client_id: str,
        acks: Sequence[tuple[str, int, str, str | None]],
        now: float,
    ) -> list[Outgoing]:
        """Several :meth:`acknowledge` calls of one client in one operation (the STOMP
        door settles a batch of deliveries at once): ``acks`` are (channel, queue id,
        message id, nack reason or None), handled in order."""

        def run(c: Client, out: list[Outgoing]) -> None:
            ack = self._ack
            for channel, queue_id, message_id, nack_reason in acks:
                headers = ((Header.NACK_REASON, nack_reason),) if nack_reason is not None else ()
                try:  # as separate calls would: one failing does not stop the others
                    ack(
                        c,
                        Message(message_id, client_id, channel, queue_id, headers=headers),
                        now,
                        out,
                    )
                except Exception as exc:
                    self.count_error("acknowledge", exc)

        return self._typed(client_id, now, "acknowledge", run)

    def pull(
        self,
        client_id: str,
        channel: str,
        queue_id: int,
        request_id: str,
        now: float,
        *,
        count: int = 1,
        lifo: bool = False,
        clear: str = ClearOption.NONE,
        info: bool = False,
    ) -> list[Outgoing]:
        """Pull up to ``count`` messages from a Pull queue (or the latest of a Cache
        queue), answered as a TMQP pull is: the messages (``Request-Id``, ``Index``,
        ``Count`` headers), then a ``No-Content: End`` marker; problems are one
        ``No-Content`` marker before it."""
        headers: tuple[tuple[str, str], ...] = ((Header.COUNT, str(count)),)
        if lifo:
            headers += ((Header.ORDER, "LIFO"),)
        if clear != ClearOption.NONE:
            headers += ((Header.CLEAR, clear),)
        if info:
            headers += ((Header.INFO, "yes"),)
        request = Message(request_id, client_id, channel, queue_id, headers=headers)
        return self._typed(
            client_id, now, "pull", lambda c, out: self._pull_request(c, request, now, out)
        )

    def _typed(
        self,
        client_id: str,
        now: float,
        what: str,
        operation: Callable[[Client, list[Outgoing]], None],
    ) -> list[Outgoing]:
        """Run a typed operation for a connected client (an unknown one gets nothing, as
        in :meth:`receive`); OperationError passes, any other error is counted."""
        self.services.now = now
        out: list[Outgoing] = []
        client = self.clients.get(client_id)
        if client is None:
            return out
        try:
            operation(client, out)
        except OperationError:
            raise
        except Exception as exc:
            self.count_error(what, exc)
        self.receipts.take(out)
        return out

    # ------------------------------------------------------------------ queue messages

    def _push(
        self,
        client: Client,
        m: Message,
        wants_response: bool,
        now: float,
        out: list[Outgoing],
    ) -> None:
        channel = self.channels.get(m.target)
        queue = channel.queues.get(m.content_type) if channel is not None else None
        fed_id = FederatedIds.id_of(client.id, m.headers)
        if fed_id is not None and self.federated.seen(fed_id):
            answer_done(client, m, wants_response, out)  # taken before: done
            return
        try:
            if queue is None:
                if m.headers and _names_pattern(m.headers):  # (before a channel is made)
                    raise OperationError(ResultCode.BAD_REQUEST, _PATTERN_PUSH)
                queue = self.channel_registry.resolve_queue(client, m.target, m.content_type, out)
            authorizer = self.authorizer
            if type(authorizer) is not AllowAll and not authorizer.allows(
                client, Action.PUSH, queue.channel.name, queue.id
            ):
                raise OperationError(ResultCode.UNAUTHORIZED, "push not allowed")
            receipt = receipts.requested(m.headers) if m.headers else _NO_RECEIPT
            if receipt[0]:
                self.receipts.check_room()
            copies = self.durable.queues_for(queue.channel.name) if self.durable.by_topic else ()
            if (
                queue.plain
                and fed_id is None
                and not copies
                and not receipt[0]
                and not wants_response
                and not self.events.has(EventName.MESSAGE_PRODUCED)
                and queue.push_plain(m, client, now, out)
            ):
                return
            if not wants_response and queue.duplicate(m.message_id, client, m.wants_ack, now, out):
                return  # taken before (a retry after a lost acknowledge): done
            retain = None
            if m.headers:
                ccs: list[str] = []
                wish: str | None = None
                for k, v in m.headers:  # (one pass: CC copies, a Pattern refused, a Retain wish)
                    key = k.lower()
                    if key == _CC:
                        ccs.append(v)
                    elif key == _PATTERN:
                        raise OperationError(ResultCode.BAD_REQUEST, _PATTERN_PUSH)
                    elif key == RETAIN_KEY and wish is None:
                        wish = v
                if wish is not None:
                    retain = retain_wish(wish)
                    check_retain_status(queue.options.status)
                if ccs:
                    if retain is not None:
                        self._retain(queue, retain, m)
                    self._push_cc(client, m, queue, ccs, now, out, copies, receipt,
                                  wants_response)  # fmt: skip
                    return
            code = self.channel_registry.check_push(queue, len(m.payload))
            if code:
                raise OperationError(ResultCode(code), _REFUSED_BY_QUEUE)
            if copies:
                self._check_durable(copies, len(m.payload))
        except OperationError as err:
            if self._unheard is not None and not (m.wants_ack or wants_response):
                self._unheard.append((err.token, err.reason))  # (a batch's: it answers)
            reject_push(client, m, wants_response, out, err)
            return
        if retain is not None:
            self._retain(queue, retain, m)
        unsaved = queue.unsaved
        qm = queue.accept(m, client, now, out, m.wants_ack)
        if qm is not None:
            if receipt[0]:
                self._watch_receipt(queue, qm, client, receipt, now)
            self._produced(queue, qm, out)
        missed: list[tuple[str, int]] | None = None  # copies not taken (no list per push)
        for copy in copies:
            if not self._copy_durable(copy, m, client, now, out):
                missed = [*(missed or ()), copy.key]
        if missed and qm is not None and queue.unsaved == unsaved:
            self._copies_missed(client, m, wants_response, queue, qm, missed, out)
            return
        if queue.unsaved != unsaved:
            self._unsaved(client, m, wants_response, out)
        elif fed_id is not None:
            self.federated.add(fed_id)  # (after the saves: ``FederatedIds.add``)

    def _retain(self, queue: Queue, keep: bool, m: Message) -> None:
        """A push's ``Retain`` wish, checked: ``broker.engine.retain``."""
        hide = queue.options.hide_client_names
        self.channel_registry.retained.update(queue.channel.name, keep, m, hide)

    def _unsaved(
        self, client: Client, m: Message, wants_response: bool, out: list[Outgoing]
    ) -> None:
        """A push its queue's handler wanted saved and the store refused (full or failed
        disk): no "done" to a producer that waits (one waiting for an acknowledge got a
        negative one from the queue; a batch's acknowledge names it); it stays queued in
        memory (at least once)."""
        if m.wants_ack:
            return
        if wants_response:
            reject_push(client, m, True, out, _UNSAVED)
        elif self._unheard is not None:
            self._unheard.append((_UNSAVED.token, _UNSAVED.reason))

    def _watch_receipt(
        self,
        queue: Queue,
        m: QueueMessage,
        client: Client,
        receipt: tuple[str, int | None],
        now: float,
    ) -> None:
        """The producer asked for a receipt (``broker.engine.receipts``)."""
        mode, timeout = receipt
        if not timeout:
            timeout = queue.options.message_timeout or receipts.DEFAULT_TIMEOUT_MS
        self.receipts.watch(queue.key, m.seq, m.message_id, client.id, mode, now, timeout)
        if m.state == DONE:  # its fate was decided at once (a broadcast nobody took)
            self.receipts.finished(queue.key, m.seq)

    def _check_durable(self, copies: Iterable[Queue], size: int) -> None:
        """OperationError unless every durable subscription queue takes a copy."""
        for copy in copies:
            code = self.channel_registry.check_push(copy, size)
            if code:
                raise OperationError(
                    ResultCode(code), f"durable subscription {copy.channel.name} is full"
                )

    def _copy_durable(
        self,
        queue: Queue,
        message: Message,
        client: Client,
        now: float,
        out: list[Outgoing],
        headers: tuple[tuple[str, str], ...] | None = None,
    ) -> bool:
        """A topic message's copy into a durable subscription (same id; its producer
        waits for the topic's acknowledge only): False when the copy was not taken as
        its handler wanted (the store refused its save, or the handler dropped it)."""
        unsaved = queue.unsaved
        m = queue.accept(message, client, now, out, False, headers=headers)
        if m is not None:
            self._produced(queue, m, out)
        return m is not None and queue.unsaved == unsaved

    def _copies_missed(
        self,
        client: Client,
        m: Message,
        wants_response: bool,
        primary: Queue,
        qm: QueueMessage,
        missed: list[tuple[str, int]],
        out: list[Outgoing],
    ) -> None:
        """A push its own queue took (``qm``) but some of its copies (CC queues, durable
        subscriptions: ``missed``, their keys) did not: the message stays where it was
        taken, and a producer that waits is told "failed" -- never "taken" -- as a
        RabbitMQ publisher is nacked when one of the queues its message was routed to
        refused it.  An acknowledge the push's queue already gave is made
        negative; one it would give later (a consumer's) is not sent; a push in an
        acknowledged batch is named in the batch's acknowledge.
        (:func:`_not_copied`: its id forgotten)."""
        err = _not_copied(primary, m, missed)
        if m.wants_ack:
            if qm.acked:  # (its queue answered it in this call: the last ACK of its id)
                for i in range(len(out) - 1, -1, -1):
                    if is_answer(out[i], client.id, _ACK, m.message_id):
                        del out[i]
                        break
            qm.acked = True  # (no consumer's acknowledge relayed later)
            reject_push(client, m, False, out, err)
        elif wants_response:
            reject_push(client, m, True, out, err)
        elif self._unheard is not None:
            self._unheard.append((err.token, err.reason))  # (a batch's: it answers)

    def _produced(self, queue: Queue, m: QueueMessage, out: list[Outgoing]) -> None:
        """The MessageProduced event, when anyone subscribed to it."""
        if self.events.has(EventName.MESSAGE_PRODUCED):
            self.events.emit(
                EventName.MESSAGE_PRODUCED,
                models.message_event(queue, m),
                out,
                queue.channel.name,
                queue.id,
            )

    def _push_cc(
        self,
        client: Client,
        message: Message,
        primary: Queue,
        ccs: list[str],
        now: float,
        out: list[Outgoing],
        durable: Iterable[Queue] = (),
        receipt: tuple[str, int | None] = ("", None),
        wants_response: bool = False,
    ) -> None:
        """Push into the target queue and a copy into each ``CC`` queue, all or nothing.

        A queue gets one copy however often it is named (the target queue none: it has
        the message); more than ``limits.max_cc`` distinct queues refuse the push (482).
        """
        copies: list[tuple[Queue, str]] = []
        named: set[tuple[str, int]] = {primary.key}
        max_cc = self.config.limits.max_cc
        for value in ccs:
            parts = [p.strip() for p in value.split(";")]
            if len(parts) > 3 or not parts[0]:
                raise OperationError(ResultCode.BAD_REQUEST, f"bad CC header {value!r}")
            qid = primary.id
            if len(parts) > 1 and parts[1]:
                try:
                    qid = int(parts[1])
                except ValueError:
                    raise OperationError(ResultCode.BAD_REQUEST, f"bad CC queue id {value!r}")
                if not 0 <= qid <= 0xFFFF:
                    raise OperationError(ResultCode.BAD_REQUEST, f"bad CC queue id {value!r}")
            if (parts[0], qid) in named:
                continue
            if len(named) > max_cc:
                raise OperationError(ResultCode.LIMIT_EXCEEDED, f"more than {max_cc} CC queues")
            named.add((parts[0], qid))
            queue = self.channel_registry.resolve_queue(client, parts[0], qid, out)
            if not self.authorizer.allows(client, Action.PUSH, queue.channel.name, queue.id):
                raise OperationError(ResultCode.UNAUTHORIZED, f"push to {parts[0]} not allowed")
            mid = parts[2] if len(parts) > 2 and parts[2] else self.new_id()
            copies.append((queue, mid))
        size = len(message.payload)
        for queue in (primary, *(q for q, _ in copies)):
            code = self.channel_registry.check_push(queue, size)
            if code:
                raise OperationError(ResultCode(code), f"push refused by {queue.key}")
        self._check_durable(durable, size)
        plain = tuple((k, v) for k, v in message.headers if k.lower() != _CC)
        targets: list[tuple[Queue, str | None, bool]] = [(primary, None, message.wants_ack)]
        targets += [(q, copy_id, False) for q, copy_id in copies]
        unsaved = primary.unsaved
        taken: QueueMessage | None = None  # (the primary's)
        missed: list[tuple[str, int]] = []  # copies not taken as their handlers wanted
        for queue, message_id, waits in targets:
            before = queue.unsaved
            m = queue.accept(
                message, client, now, out, waits, headers=plain, message_id=message_id
            )
            if m is not None:
                if queue is primary:
                    taken = m
                    if receipt[0]:
                        self._watch_receipt(queue, m, client, receipt, now)
                self._produced(queue, m, out)
            if queue is not primary and (m is None or queue.unsaved != before):
                missed.append(queue.key)
        for copy in durable:
            if not self._copy_durable(copy, message, client, now, out, plain):
                missed.append(copy.key)
        if primary.unsaved != unsaved:
            self._unsaved(client, message, wants_response, out)
            return
        if missed and taken is not None:
            self._copies_missed(client, message, wants_response, primary, taken, missed, out)
            return
        fed_id = FederatedIds.id_of(client.id, message.headers)
        if fed_id is not None:  # (a federated message its publisher gave CC headers;
            self.federated.add(fed_id)  # after its saves)

    def _on_ack(self, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]) -> None:
        if frame.high_priority:  # acknowledge of a direct message: pass it on
            self.client_registry.forward_ack(client, frame, out)
            return
        self._ack(client, message_of(frame), now, out)

    def _ack(self, client: Client, ack: Message, now: float, out: list[Outgoing]) -> None:
        channel = self.channels.get(ack.target)
        queue = channel.queues.get(ack.content_type) if channel is not None else None
        if queue is None or not queue.on_ack(client, ack, now, out):
            self.client_registry.unmatched_acks += 1

    def _pull(self, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]) -> None:
        self._pull_request(client, message_of(frame), now, out)

    def _pull_request(
        self, client: Client, request: Message, now: float, out: list[Outgoing]
    ) -> None:
        rid, name, qid = request.message_id, request.target, request.content_type
        channel = self.channels.get(name)
        queue = channel.queues.get(qid) if channel is not None else None
        token = None
        if not rid:
            token = NoContent.ID_REQUIRED
        elif channel is None:
            token = NoContent.NO_CHANNEL
        elif queue is None:
            token = NoContent.NO_QUEUE
        elif client.id not in channel.consumers or not self.authorizer.allows(
            client, Action.PULL, name, qid
        ):
            token = NoContent.UNAUTHORIZED
        if token is not None or queue is None:
            out.append(Outgoing(client.id, pull_marker(rid, name, qid, token or "")))
            out.append(Outgoing(client.id, pull_marker(rid, name, qid, NoContent.END)))
            return
        queue.pull(client, request, now, out, self.config.limits.max_pull_count)

    # ------------------------------------------------------------------ flow control

    def transmitted(
        self,
        counts: Mapping[str, int],
        now: float,
        unwritten: Mapping[str, Collection[int]] | None = None,
    ) -> list[Outgoing]:
        """The transport took the next ``counts[id]`` :class:`Tracked` frames of each client.

        Settles those deliveries (counted as sent; a queue without acknowledges finishes
        them and frees their window slots) and sends what the freed room lets through.
        ``unwritten[id]``: positions among a client's that never reached its socket (see
        ``flow.transmitted``).  See ``broker.flow``.
        """
        self.services.now = now
        out: list[Outgoing] = []
        ready: dict[Queue, None] = {}
        acked: dict[Queue, None] = {}
        clients = self.clients
        for client_id, count in counts.items():
            client = clients.get(client_id)
            if client is None:
                continue  # already disconnected: its deliveries were returned then
            try:
                left = unwritten.get(client_id, ()) if unwritten else ()
                if flow.transmitted(client, count, now, ready, out, acked, left) != count:
                    self.count_error("transmitted", ValueError(f"{client_id}: {count} > sent"))
            except Exception as exc:
                self.count_error("transmitted", exc)
        self._drain_ready([q for q in ready if q.stalled or q in acked], now, out)
        self.receipts.take(out)
        return out

    def enable_fanout(self, endpoint: str) -> None:
        """Consumers may ask for broadcast fan-out (``broker.engine.fanout``); their SUB
        sockets connect to ``endpoint`` (the server's XPUB)."""
        self.channel_registry.fanout = FanoutStreams(endpoint)

    def fanout_claim(self, topic: bytes) -> tuple[bytes, list[Outgoing]] | None:
        """A subscription on the fan-out socket: when its topic is a member's live ticket,
        the stream token to apply to that pipe and what to publish then (its marker, and
        what a token change held); else None (refuse it)."""
        fanout = self.channel_registry.fanout
        return fanout.claim(topic) if fanout is not None else None

    def fanout_beat(self) -> list[Outgoing]:
        """Every fan-out stream's marker (the server sends them about once a second): a
        subscriber whose last messages were dropped learns of that gap from it; a hold
        for a token change lets go after ``broker.engine.fanout.HOLD_BEATS`` of them."""
        fanout = self.channel_registry.fanout
        return fanout.markers() if fanout is not None else []

    def disconnect(self, client_id: str, now: float) -> list[Outgoing]:
        """The client is gone: what never reached its socket returns to its queues first,
        then its unacknowledged deliveries return and its requests fail."""
        self.services.now = now
        out: list[Outgoing] = []
        client = self.clients.get(client_id)
        if client is None:
            return out
        if not client.unsent:
            self.client_registry.disconnect(client_id, now, out)
            self._receipts_after_disconnect(client_id, out)
            return out
        ready: dict[Queue, None] = {}
        try:
            flow.abandon(client, now, out, ready)
        except Exception as exc:  # never raise into the wire loop
            self.count_error("disconnect", exc)
        self.client_registry.disconnect(client_id, now, out)
        self._drain_ready(ready, now, out)
        self._receipts_after_disconnect(client_id, out)
        return out

    def _receipts_after_disconnect(self, client_id: str, out: list[Outgoing]) -> None:
        """The client's own pending receipts are forgotten (nobody to tell); those its
        leaving decided for others go out."""
        receipts = self.receipts
        receipts.forget_producer(client_id)
        if receipts.outbox:
            kept = [item for item in receipts.outbox if item[0] != client_id]
            receipts.outbox.clear()
            out.extend(kept)

    def _drain_ready(self, ready: Iterable[Queue], now: float, out: list[Outgoing]) -> None:
        for queue in ready:
            if queue.alive and (queue.n_priority or queue.n_regular):  # put-backs counted
                try:
                    queue.drain(now, out)
                except Exception as exc:
                    self.count_error("drain", exc)

    # ------------------------------------------------------------------ time

    def tick(self, now: float) -> list[Outgoing]:
        """Run every timer due by ``now`` (ack timeouts, message timeouts, put-backs)."""
        self.services.now = now
        out: list[Outgoing] = []
        timers = self.services.timers
        touched: list[Channel] = []
        while (queue := timers.pop_due(now)) is not None:
            due = queue.wake_at
            if not queue.alive or due is None or due > now:
                continue  # superseded by an earlier wake-up that already ran
            try:
                queue.tick(now, out)
            except Exception as exc:
                self.count_error("tick", exc)
            if queue.channel.options.destroy_when_empty:
                touched.append(queue.channel)
        for channel in touched:
            self.channel_registry.maybe_destroy(channel, out)
        receipts = self.receipts
        if receipts.pending or receipts.outbox:
            receipts.tick(now)
            receipts.take(out)
        return out

    def next_deadline(self) -> float | None:
        """Earliest ``now`` at which :meth:`tick` has work (None: no timer armed)."""
        timers = self.services.timers.next_deadline()
        if not self.receipts.pending:
            return timers
        due = self.receipts.next_deadline()
        if due is None or timers is None:
            return due if timers is None else timers
        return min(timers, due)

    # ------------------------------------------------------------------ recovery, stats

    def recover(self, now: float) -> int:
        """Rebuild channels, queues and their saved messages from the store (after a
        restart), in sequence order, each queue numbering on above its last sequence
        number the store knows (``broker.sequence``); returns the message count.  A
        definition or queue that cannot be recreated (options this broker refuses, a
        limit) is logged and skipped; its messages stay in the store."""
        self.services.now = now
        out: list[Outgoing] = []
        registry = self.channel_registry
        channels, queues = registry.definitions.saved()
        for name, options in sorted(channels.items()):
            if name in self.channels:
                continue
            try:
                registry.create_channel(name, ChannelOptions.from_json(options), out)
            except (OperationError, ValueError) as err:
                log.warning("cannot recreate channel %r: %s", name, err)
        for (name, qid), options in sorted(queues.items()):
            channel = self.channels.get(name)
            if channel is None or qid in channel.queues:
                continue
            try:
                registry.create_queue(name, qid, ChannelQueueOptions.from_json(options), out)
            except (OperationError, ValueError) as err:
                log.warning("cannot recreate queue %s/%d: %s", name, qid, err)
        self._recover_routers()
        self.federated.load()
        self.durable.recover(registry.definitions.saved_under(DSUB_PREFIX))
        registry.quotas.recover(self._holds)
        count = 0
        for key in self.store.queues():
            channel_name, queue_id = key
            try:
                queue = self.channel_registry.resolve_queue(None, channel_name, queue_id, out)
            except OperationError as err:
                log.warning("cannot recover queue %s: %s", key, err.reason)
                continue
            if queue.messages.window:  # paging: the store's index, payloads left on disk
                count += queue.restore_index(self.store.index_chunks(key), now)
            else:
                count += queue.restore_all(self.store.iterate(key), now)
        for channel in self.channels.values():  # numbering goes on where it stopped
            for queue in channel.queues.values():
                try:
                    last = self.store.last_sequence(queue.key)
                except Exception as exc:
                    self.count_error("store.last_sequence", exc)
                    continue
                queue.sequence = max(queue.sequence, last)
                count += self._recover_retained(queue)
                self._recover_trash(queue, now)
        return count

    def _holds(self, key: str) -> bool:
        """Whether the entity a per-user quota key names exists (``broker.engine.quotas``)."""
        found = quotas.split_key(key)
        if found is None:
            return False
        kind, name, queue_id = found
        if kind is quotas.Kind.DURABLE_SUBSCRIPTION:
            return self.durable.get(name) is not None
        channel = self.channels.get(name)
        return channel is not None and (kind is quotas.Kind.CHANNEL or queue_id in channel.queues)

    def _recover_trash(self, queue: Queue, now: float) -> None:
        """Bring back what the queue's trash kept in the store (oldest first), within its
        ``TrashLimit`` and ``TrashRetention``."""
        try:
            kept = list(self.store.trashed(queue.key))
        except Exception as exc:
            self.count_error("store.trashed", exc)
            return
        for stored, reason, at in kept:
            queue.restore_trashed(stored, reason, at, now)
            queue.sequence = max(queue.sequence, stored.sequence)

    def _recover_routers(self) -> None:
        """Routers (with bindings) created by operations before the restart; one the
        configuration already defines keeps the configuration's definition."""
        saved = self.channel_registry.definitions.saved_under(ROUTER_PREFIX)
        for name, definition in sorted(saved.items()):
            if name in self.routers:
                continue
            try:
                self.router_table.add(router_from_json(definition))
            except (OperationError, RouterError) as err:
                log.warning("cannot recreate router %r: %s", name, err)

    def _recover_retained(self, queue: Queue) -> int:
        """Bring back a queue's retained messages (``Retain``), oldest first, within its
        ``RetainLimit``; returns how many."""
        try:
            kept = list(self.store.retained(queue.key))
        except Exception as exc:
            self.count_error("store.retained", exc)
            return 0
        limit = queue.options.retain_limit or DEFAULT_RETAIN_LIMIT
        for stored in kept[: max(0, len(kept) - limit)]:
            self.store.forget_retained(queue.key, stored.sequence)
        kept = kept[max(0, len(kept) - limit) :]
        opts = queue.options
        for stored in kept:
            queue.retained.restore(stored.sequence, stored.message)
            if stored.message.message_id and opts.use_message_id and opts.duplicate_window:
                queue.recent.add(
                    stored.message.message_id, self.services.now, opts.duplicate_window
                )
            queue.sequence = max(queue.sequence, stored.sequence)
        return len(kept)

    def stats(self) -> dict[str, object]:
        """Counters and a per-queue summary, JSON-able (for ``broker stats``), and the
        first ``Limits.max_listed_clients`` connected clients, oldest connection first
        (``client_list``, see :func:`models.client_rows`; ``clients`` counts them all)."""
        out = models.engine_stats(self._counts(), list(self.channels.values()))
        limit = self.config.limits.max_listed_clients
        out["client_list"] = models.client_rows(self.clients.values(), limit)
        return out

    def stats_page(self, after: str | None, budget: int) -> tuple[dict[str, object], str | None]:
        """The statistics with one page of ``channel_list`` (channels by name, after
        ``after``), within ``budget`` octets of JSON; and the key of the next page."""
        out = models.engine_totals(self._counts(), list(self.channels.values()))
        room = budget - paging.json_size(out) - len('"channel_list":[],')
        channels = self.channels
        page = paging.cut(
            sorted(channels), after, lambda n: models.channel_stats(channels[n]), room
        )
        out["channel_list"] = page.items
        return out, page.next

    @property
    def pending_requests(self) -> int:
        """Direct requests still waiting for a response."""
        return len(self.client_registry.requests)

    def count_patterns(self, held: Callable[[], int]) -> None:
        """A door holding patterns of its own (STOMP wildcards) counts them with the
        engine's: ``held()``, read on the engine thread, is added to :meth:`patterns_held`,
        which ``Limits.max_patterns`` bounds (broker-wide, every door together)."""
        self.parts.channels.patterns.count_elsewhere(held)

    def patterns_held(self) -> int:
        """Distinct patterns held at once, every door together (``patterns`` in the
        statistics)."""
        return self.parts.channels.patterns.held()

    def _counts(self) -> models.EngineCounts:
        return models.EngineCounts(
            node=self.config.node_name,
            clients=len(self.clients),
            pending_requests=self.pending_requests,
            routers=len(self.routers),
            errors=self.errors,
            unmatched_acks=self.unmatched_acks,
            patterns=self.patterns_held(),
            limits=self.config.limits.table(),
        )
