"""The sans-IO broker engine: frames in, frames out, time passed in.

The wire (``broker.server``) decodes frames, calls :meth:`Engine.receive` with the
client id and a monotonic ``now``, and sends every returned :class:`Outgoing`; it calls
:meth:`Engine.tick` when :meth:`Engine.next_deadline` passes.  The engine never reads a
clock, never raises out of ``receive``/``tick``/``disconnect``, and answers a malformed
request with an acknowledge or response carrying the result code when the sender waits
for one.

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
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
from collections.abc import Callable, Mapping

from broker import frames, models, tmqp
from broker.auth import Action, AllowAll, Authorizer
from broker.channel import Channel, Client
from broker.delivery import DefaultDeliveryHandler, DeliveryHandler
from broker.errors import ClientRejected, EngineError, OperationError
from broker.events import EventHub
from broker.frames import pull_marker
from broker.options import BrokerConfig, ChannelOptions, ChannelQueueOptions
from broker.protocol import (
    TARGET_BY_NAME,
    TARGET_BY_TYPE,
    ConnectionInfo,
    EventName,
    Header,
    MessageType,
    NackReason,
    NoContent,
    Outgoing,
    ResultCode,
    headers_all,
)
from broker.queue import Queue
from broker.router import Router, publish, router_from_json
from broker.store import MemoryStore, Store

__all__ = ["ClientRejected", "Engine", "EngineError", "OperationError", "Outgoing"]

log = logging.getLogger("broker.engine")

_Frame = tmqp.Frame
_QUEUE = int(MessageType.QUEUE)
_ACK = int(MessageType.ACK)
_PULL = int(MessageType.PULL)
_DIRECT = int(MessageType.DIRECT)
_RESPONSE = int(MessageType.RESPONSE)
_SERVER = int(MessageType.SERVER)
_EVENT = int(MessageType.EVENT)
_ROUTER = int(MessageType.ROUTER)
_TERMINATE = int(MessageType.TERMINATE)


def _default_id_factory() -> Callable[[], str]:
    prefix = os.urandom(4).hex()
    counter = itertools.count(1)
    return lambda: f"{prefix}-{next(counter):x}"


def valid_channel_name(name: str) -> bool:
    return bool(name) and " " not in name and ";" not in name and len(name.encode()) <= 255


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
        self.config = config or BrokerConfig()
        self.handler = handler or DefaultDeliveryHandler()
        #: Delivery handlers a queue can select with its MessageDeliveryHandler option.
        self.handlers: dict[str, DeliveryHandler] = dict(handlers or {})
        self.authorizer = authorizer or AllowAll()
        self.store = store if store is not None else MemoryStore()
        self.new_id = new_id or _default_id_factory()
        self.clients: dict[str, Client] = {}
        self.channels: dict[str, Channel] = {}
        self.routers: dict[str, Router] = {}
        self.events = EventHub()
        self._by_name: dict[str, list[Client]] = {}
        self._by_type: dict[str, list[Client]] = {}
        self._requests: dict[tuple[str, str], set[str]] = {}
        self._timers: list[tuple[float, int, Queue]] = []
        self._timer_seq = itertools.count()
        for spec in self.config.routers:
            self.add_router(router_from_json(spec))
        self._now = 0.0
        self.errors = 0
        self.unmatched_acks = 0
        from broker import operations

        self._operations = operations

    # ------------------------------------------------------------------ QueueHost

    def client(self, client_id: str) -> Client | None:
        return self.clients.get(client_id)

    def wake(self, queue: Queue, when: float) -> None:
        heapq.heappush(self._timers, (when, next(self._timer_seq), queue))

    def handler_for(self, key: str | None) -> DeliveryHandler:
        if key is None:
            return self.handler
        return self.handlers.get(key, self.handler)

    def check_handler(self, key: str | None) -> None:
        """OperationError (400) unless ``key`` names a registered delivery handler."""
        if key is not None and key not in self.handlers:
            raise OperationError(ResultCode.BAD_REQUEST, f"unknown delivery handler {key!r}")

    def count_error(self, where: str, error: Exception) -> None:
        self.errors += 1
        log.warning("error in %s: %r", where, error)

    # ------------------------------------------------------------------ connections

    def connect(self, info: ConnectionInfo, now: float) -> tuple[str, list[Outgoing]]:
        """Register a client; raises :class:`ClientRejected` (401, 481 or 400)."""
        self._now = now
        if not self.authorizer.authenticate(info):
            raise ClientRejected(ResultCode.UNAUTHORIZED, "client token refused")
        client_id = info.client_id
        if client_id is None:
            client_id = self.new_id()
            while client_id in self.clients:
                client_id = self.new_id()
        elif not client_id or len(client_id.encode()) > 255 or client_id.startswith("@"):
            raise ClientRejected(ResultCode.BAD_REQUEST, f"invalid client id {client_id!r}")
        if client_id in self.clients:
            raise ClientRejected(ResultCode.ALREADY_CREATED, f"client id {client_id!r} in use")
        client = Client(client_id, info, now)
        self.clients[client_id] = client
        if client.name:
            self._by_name.setdefault(client.name, []).append(client)
        if client.type:
            self._by_type.setdefault(client.type, []).append(client)
        out: list[Outgoing] = []
        self.events.emit(EventName.CLIENT_CONNECTED, models.client_event(client), out)
        return client_id, out

    def disconnect(self, client_id: str, now: float) -> list[Outgoing]:
        """The client is gone: its unacknowledged deliveries return, its requests fail."""
        self._now = now
        out: list[Outgoing] = []
        client = self.clients.pop(client_id, None)
        if client is None:
            return out
        try:
            self._forget_client(client, now, out)
        except Exception as exc:  # never raise into the wire loop
            self.count_error("disconnect", exc)
        return out

    def _forget_client(self, client: Client, now: float, out: list[Outgoing]) -> None:
        for index in (self._by_name.get(client.name or ""), self._by_type.get(client.type or "")):
            if index is not None and client in index:
                index.remove(client)
        if client.name and not self._by_name.get(client.name):
            self._by_name.pop(client.name, None)
        if client.type and not self._by_type.get(client.type):
            self._by_type.pop(client.type, None)
        self.events.drop_client(client.id)
        left = list(client.channels.values())
        for channel in left:
            self._remove_consumer(channel, client, out)
        for queue in list(client.pending_queues):
            if queue.alive:
                queue.consumer_gone(client, now, out)
                queue.drain(now, out)
        client.pending_queues.clear()
        # requests this client was asked to answer
        for key in list(client.awaiting):
            waiting = self._requests.get(key)
            if waiting is None:
                continue
            waiting.discard(client.id)
            if not waiting:
                del self._requests[key]
                requester = self.clients.get(key[0])
                if requester is not None:
                    requester.requests.discard(key[1])
                    out.append(
                        Outgoing(
                            requester.id,
                            frames.response(
                                key[1], requester.id, ResultCode.SEND_ERROR, "receiver left"
                            ),
                        )
                    )
        # requests this client sent
        for mid in client.requests:
            for rid in self._requests.pop((client.id, mid), ()):
                receiver = self.clients.get(rid)
                if receiver is not None:
                    receiver.awaiting.discard((client.id, mid))
        self.events.emit(EventName.CLIENT_DISCONNECTED, models.client_event(client), out)
        for channel in left:
            self._maybe_destroy(channel, out)

    # ------------------------------------------------------------------ frames in

    def receive(self, client_id: str, frame: tmqp.Frame, now: float) -> list[Outgoing]:
        """Process one frame from a connected client (anything after connection info)."""
        self._now = now
        out: list[Outgoing] = []
        client = self.clients.get(client_id)
        if client is None:
            return out
        mt = frame.message_type
        try:
            if mt == _QUEUE:
                self._push(client, frame, now, out)
            elif mt == _ACK:
                self._on_ack(client, frame, now, out)
            elif mt == _PULL:
                self._pull(client, frame, now, out)
            elif mt == _DIRECT:
                self._direct(client, frame, out)
            elif mt == _RESPONSE:
                self._on_response(client, frame, out)
            elif mt == _SERVER:
                self._operations.dispatch(self, client, frame, now, out)
            elif mt == _EVENT:
                self._operations.event_subscription(self, client, frame, out)
            elif mt == _ROUTER:
                publish(self, client, frame, now, out)
            elif mt == _TERMINATE:
                out.extend(self.disconnect(client_id, now))
            else:
                self.answer_failure(
                    client,
                    frame,
                    out,
                    OperationError(ResultCode.UNACCEPTABLE, f"message type {mt:#x} not handled"),
                )
        except Exception as exc:
            self.count_error(f"receive type {mt:#x}", exc)
            self.answer_failure(
                client, frame, out, OperationError(ResultCode.FAILED, "internal error")
            )
        return out

    # ------------------------------------------------------------------ queue messages

    def _push(self, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]) -> None:
        channel = self.channels.get(frame.target)
        queue = channel.queues.get(frame.content_type) if channel is not None else None
        try:
            if queue is None:
                queue = self.resolve_queue(client, frame.target, frame.content_type, out)
            authorizer = self.authorizer
            if type(authorizer) is not AllowAll and not authorizer.allows(
                client, Action.PUSH, queue.channel.name, queue.id
            ):
                raise OperationError(ResultCode.UNAUTHORIZED, "push not allowed")
            if (
                queue.plain
                and not self.events.has(EventName.MESSAGE_PRODUCED)
                and queue.push_plain(frame, client, now, out)
            ):
                return
            if frame.headers:
                ccs = headers_all(frame, Header.CC)
                if ccs:
                    self._push_cc(client, frame, queue, ccs, now, out)
                    return
            code = queue.check_push(len(frame.payload))
            if code:
                raise OperationError(ResultCode(code), "push refused by the queue")
        except OperationError as err:
            self._reject_push(client, frame, out, err)
            return
        m = queue.accept(frame, client, now, out, frame.pending_ack)
        if m is not None and self.events.has(EventName.MESSAGE_PRODUCED):
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
        frame: tmqp.Frame,
        primary: Queue,
        ccs: list[str],
        now: float,
        out: list[Outgoing],
    ) -> None:
        """Push into the target queue and a copy into each ``CC`` queue, all or nothing."""
        copies: list[tuple[Queue, str]] = []
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
            queue = self.resolve_queue(client, parts[0], qid, out)
            if not self.authorizer.allows(client, Action.PUSH, queue.channel.name, queue.id):
                raise OperationError(ResultCode.UNAUTHORIZED, f"push to {parts[0]} not allowed")
            mid = parts[2] if len(parts) > 2 and parts[2] else self.new_id()
            copies.append((queue, mid))
        size = len(frame.payload)
        for queue in (primary, *(q for q, _ in copies)):
            code = queue.check_push(size)
            if code:
                raise OperationError(ResultCode(code), f"push refused by {queue.key}")
        plain = tuple((k, v) for k, v in frame.headers if k.lower() != "cc")
        targets: list[tuple[Queue, str | None, bool]] = [(primary, None, frame.pending_ack)]
        targets += [(q, copy_id, False) for q, copy_id in copies]
        for queue, message_id, waits in targets:
            m = queue.accept(frame, client, now, out, waits, headers=plain, message_id=message_id)
            if m is not None and self.events.has(EventName.MESSAGE_PRODUCED):
                self.events.emit(
                    EventName.MESSAGE_PRODUCED,
                    models.message_event(queue, m),
                    out,
                    queue.channel.name,
                    queue.id,
                )

    def resolve_queue(
        self, client: Client | None, channel_name: str, queue_id: int, out: list[Outgoing]
    ) -> Queue:
        """The queue, created on the fly when the config allows it (OperationError if not)."""
        channel = self.channels.get(channel_name)
        if channel is None:
            if not self.config.auto_create_channel:
                raise OperationError(
                    ResultCode.NOT_FOUND, "no such channel", NackReason.NO_CHANNEL
                )
            if not valid_channel_name(channel_name):
                raise OperationError(ResultCode.BAD_REQUEST, "invalid channel name")
            if client is not None and not self.authorizer.allows(
                client, Action.CHANNEL_CREATE, channel_name
            ):
                raise OperationError(ResultCode.UNAUTHORIZED, "may not create channels")
            channel = self.create_channel(channel_name, out=out)
        queue = channel.queues.get(queue_id)
        if queue is None:
            if not self.config.auto_create_queue:
                raise OperationError(ResultCode.NOT_FOUND, "no such queue", NackReason.NO_QUEUE)
            if client is not None and not self.authorizer.allows(
                client, Action.QUEUE_CREATE, channel_name, queue_id
            ):
                raise OperationError(ResultCode.UNAUTHORIZED, "may not create queues")
            queue = self.create_queue(channel_name, queue_id, out=out)
        return queue

    def _reject_push(
        self, client: Client, frame: tmqp.Frame, out: list[Outgoing], err: OperationError
    ) -> None:
        if frame.pending_ack:
            qid, mid, target = frame.content_type, frame.message_id, frame.target
            out.append(
                Outgoing(client.id, frames.ack(qid, mid, "", target, err.token, err.reason))
            )
        elif frame.pending_response:
            out.append(
                Outgoing(
                    client.id,
                    frames.response(frame.message_id, client.id, err.code, err.reason),
                )
            )

    def _on_ack(self, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]) -> None:
        if frame.high_priority:  # acknowledge of a direct message: pass it on
            receiver = self.clients.get(frame.target)
            if receiver is not None:
                out.append(Outgoing(receiver.id, self._from(client, frame)))
            return
        channel = self.channels.get(frame.target)
        queue = channel.queues.get(frame.content_type) if channel is not None else None
        if queue is None or not queue.on_ack(client, frame, now, out):
            self.unmatched_acks += 1

    def _pull(self, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]) -> None:
        rid, name, qid = frame.message_id, frame.target, frame.content_type
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
        queue.pull(client, frame, now, out, self.config.max_pull_count)

    # ------------------------------------------------------------------ direct, response

    def find_receivers(self, target: str) -> list[Client]:
        """Clients a direct target names: an id, ``@name:X`` or ``@type:X`` (oldest first)."""
        if target.startswith(TARGET_BY_NAME):
            return list(self._by_name.get(target[len(TARGET_BY_NAME) :], ()))
        if target.startswith(TARGET_BY_TYPE):
            return list(self._by_type.get(target[len(TARGET_BY_TYPE) :], ()))
        client = self.clients.get(target)
        return [client] if client is not None else []

    def _from(self, client: Client, frame: tmqp.Frame) -> tmqp.Frame:
        """The frame with its source set to the sending client."""
        return frames.with_source(frame, client.id)

    def _direct(self, client: Client, frame: tmqp.Frame, out: list[Outgoing]) -> None:
        try:
            if not self.authorizer.allows(client, Action.DIRECT, target=frame.target):
                raise OperationError(ResultCode.UNAUTHORIZED, "direct messages not allowed")
            receivers = self.find_receivers(frame.target)
            if frame.target.startswith("@"):
                receivers = [r for r in receivers if r is not client]
            if frame.first_acquirer:
                receivers = receivers[:1]
            if not receivers:
                raise OperationError(ResultCode.NOT_FOUND, "no receiver", NackReason.NO_CONSUMERS)
            wants = frame.pending_response and frame.message_id
            if wants and len(client.requests) >= self.config.max_pending_requests:
                raise OperationError(ResultCode.BUSY, "too many outstanding requests")
        except OperationError as err:
            self.answer_failure(client, frame, out, err, direct=True)
            return
        self.deliver_direct(client, frame, receivers, out)

    def deliver_direct(
        self, client: Client, frame: tmqp.Frame, receivers: list[Client], out: list[Outgoing]
    ) -> None:
        fwd = self._from(client, frame)
        for receiver in receivers:
            out.append(Outgoing(receiver.id, fwd))
        if frame.pending_response and frame.message_id:
            key = (client.id, frame.message_id)
            waiting = self._requests.setdefault(key, set())
            for receiver in receivers:
                waiting.add(receiver.id)
                receiver.awaiting.add(key)
            client.requests.add(frame.message_id)

    def _on_response(self, client: Client, frame: tmqp.Frame, out: list[Outgoing]) -> None:
        key = (frame.target, frame.message_id)
        waiting = self._requests.get(key)
        if waiting is not None and client.id in waiting:
            del self._requests[key]
            for rid in waiting:
                receiver = self.clients.get(rid)
                if receiver is not None:
                    receiver.awaiting.discard(key)
        requester = self.clients.get(frame.target)
        if requester is None:
            self.unmatched_acks += 1
            return
        requester.requests.discard(frame.message_id)
        out.append(Outgoing(requester.id, self._from(client, frame)))

    # ------------------------------------------------------------------ routers

    def add_router(self, router: Router) -> Router:
        """Register a router (Python API; the wire has operation 601)."""
        if router.name in self.routers:
            raise OperationError(ResultCode.ALREADY_CREATED, f"router {router.name!r} exists")
        self.routers[router.name] = router
        return router

    def remove_router(self, name: str) -> bool:
        return self.routers.pop(name, None) is not None

    # ------------------------------------------------------------------ channels, queues

    def create_channel(
        self, name: str, options: ChannelOptions | None = None, out: list[Outgoing] | None = None
    ) -> Channel:
        """Create a channel (Python API; OperationError when invalid or existing)."""
        if not valid_channel_name(name):
            raise OperationError(ResultCode.BAD_REQUEST, f"invalid channel name {name!r}")
        if name in self.channels:
            raise OperationError(ResultCode.ALREADY_CREATED, f"channel {name!r} exists")
        channel = Channel(name, options or self.config.channel_defaults)
        self.channels[name] = channel
        self.events.emit(
            EventName.CHANNEL_CREATED,
            models.channel_event(channel),
            out if out is not None else [],
        )
        return channel

    def create_queue(
        self,
        channel_name: str,
        queue_id: int,
        options: ChannelQueueOptions | None = None,
        out: list[Outgoing] | None = None,
    ) -> Queue:
        """Create a queue in an existing channel, enforcing the channel's queue rules."""
        channel = self.channels.get(channel_name)
        if channel is None:
            raise OperationError(ResultCode.NOT_FOUND, "no such channel", NackReason.NO_CHANNEL)
        if not 0 <= queue_id <= 0xFFFF:
            raise OperationError(ResultCode.BAD_REQUEST, "queue id must be 0..65535")
        if queue_id in channel.queues:
            raise OperationError(ResultCode.ALREADY_CREATED, f"queue {queue_id} exists")
        copts = channel.options
        if copts.allowed_queues and queue_id not in copts.allowed_queues:
            raise OperationError(ResultCode.UNACCEPTABLE, f"queue {queue_id} not allowed here")
        if not copts.allow_multiple_queues and channel.queues:
            raise OperationError(ResultCode.UNACCEPTABLE, "channel allows a single queue")
        if copts.queue_limit and len(channel.queues) >= copts.queue_limit:
            raise OperationError(ResultCode.LIMIT_EXCEEDED, "channel queue limit reached")
        options = options or copts.queue
        self.check_handler(options.message_delivery_handler)
        queue = Queue(channel, queue_id, options, self)
        channel.queues[queue_id] = queue
        if out is None:
            out = []
        self.events.emit(
            EventName.QUEUE_CREATED, models.queue_summary(queue), out, channel_name, queue_id
        )
        queue.drain(self._now, out)
        return queue

    def remove_queue(self, queue: Queue, out: list[Outgoing]) -> None:
        channel = queue.channel
        if channel.queues.get(queue.id) is not queue:
            return
        del channel.queues[queue.id]
        queue.close(out)
        self.store.drop_queue(queue.key)
        self.events.emit(
            EventName.QUEUE_REMOVED, models.queue_summary(queue), out, channel.name, queue.id
        )

    def remove_channel(self, channel: Channel, out: list[Outgoing]) -> None:
        if self.channels.get(channel.name) is not channel:
            return
        del self.channels[channel.name]
        for queue in list(channel.queues.values()):
            queue.close(out)
            self.store.drop_queue(queue.key)
        channel.queues.clear()
        for client in channel.consumer_list:
            client.channels.pop(channel.name, None)
        channel.consumers.clear()
        channel.consumer_list.clear()
        self.events.emit(EventName.CHANNEL_REMOVED, models.channel_event(channel), out)

    def join(self, client: Client, channel: Channel, now: float, out: list[Outgoing]) -> None:
        if client.id in channel.consumers:
            return
        limit = channel.options.client_limit
        if limit and len(channel.consumers) >= limit:
            raise OperationError(ResultCode.LIMIT_EXCEEDED, "channel client limit reached")
        channel.consumers[client.id] = client
        channel.consumer_list.append(client)
        client.channels[channel.name] = channel
        self.events.emit(
            EventName.CLIENT_JOINED, models.subscription_event(channel, client), out, channel.name
        )
        for queue in list(channel.queues.values()):
            queue.drain(now, out)

    def leave(self, client: Client, channel: Channel, out: list[Outgoing]) -> bool:
        if client.id not in channel.consumers:
            return False
        self._remove_consumer(channel, client, out)
        self._maybe_destroy(channel, out)
        return True

    def _remove_consumer(self, channel: Channel, client: Client, out: list[Outgoing]) -> None:
        channel.consumers.pop(client.id, None)
        if client in channel.consumer_list:
            channel.consumer_list.remove(client)
        client.channels.pop(channel.name, None)
        self.events.emit(
            EventName.CLIENT_LEFT, models.subscription_event(channel, client), out, channel.name
        )

    def _maybe_destroy(self, channel: Channel, out: list[Outgoing]) -> None:
        if (
            channel.options.destroy_when_empty
            and not channel.consumers
            and self.channels.get(channel.name) is channel
            and all(q.is_empty() for q in channel.queues.values())
        ):
            self.remove_channel(channel, out)

    # ------------------------------------------------------------------ replies

    def ack_frame(
        self, frame: tmqp.Frame, code: int, err: OperationError | None, high: bool = False
    ) -> tmqp.Frame:
        token, reason = (err.token, err.reason) if err is not None else (None, None)
        return frames.ack(code, frame.message_id, "", frame.target, token, reason, high)

    def reply(
        self,
        client: Client,
        frame: tmqp.Frame,
        out: list[Outgoing],
        *,
        response: bool,
        payload: bytes = b"",
        error: OperationError | None = None,
    ) -> None:
        """Answer a server operation: ACK (or RESPONSE when asked/for lists), code inside."""
        code = error.code if error is not None else ResultCode.OK
        if response or (frame.pending_response and not frame.pending_ack):
            reason = error.reason if error is not None else None
            out.append(
                Outgoing(
                    client.id,
                    frames.response(frame.message_id, client.id, code, reason, payload),
                )
            )
        else:
            out.append(Outgoing(client.id, self.ack_frame(frame, code, error)))

    def answer_failure(
        self,
        client: Client,
        frame: tmqp.Frame,
        out: list[Outgoing],
        err: OperationError,
        direct: bool = False,
    ) -> None:
        """Tell a waiting sender why its message went nowhere (silence if it waits for none)."""
        if frame.pending_response:
            out.append(
                Outgoing(
                    client.id,
                    frames.response(frame.message_id, client.id, err.code, err.reason),
                )
            )
        elif frame.pending_ack:
            out.append(Outgoing(client.id, self.ack_frame(frame, err.code, err, high=direct)))

    # ------------------------------------------------------------------ time

    def tick(self, now: float) -> list[Outgoing]:
        """Run every timer due by ``now`` (ack timeouts, message timeouts, put-backs)."""
        self._now = now
        out: list[Outgoing] = []
        timers = self._timers
        touched: list[Channel] = []
        while timers and timers[0][0] <= now:
            _, _, queue = heapq.heappop(timers)
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
            self._maybe_destroy(channel, out)
        return out

    def next_deadline(self) -> float | None:
        """Earliest ``now`` at which :meth:`tick` has work (None: no timer armed)."""
        timers = self._timers
        while timers and not timers[0][2].alive:
            heapq.heappop(timers)
        return timers[0][0] if timers else None

    # ------------------------------------------------------------------ recovery, stats

    def recover(self, now: float) -> int:
        """Rebuild queues from the store (after a restart); returns the message count."""
        self._now = now
        out: list[Outgoing] = []
        count = 0
        for key in self.store.queues():
            channel_name, queue_id = key
            try:
                queue = self.resolve_queue(None, channel_name, queue_id, out)
            except OperationError as err:
                log.warning("cannot recover queue %s: %s", key, err.reason)
                continue
            for stored in self.store.iterate(key):
                queue.restore(stored, None, now)
                count += 1
        return count

    def stats(self) -> dict[str, object]:
        """Counters and a per-queue summary, JSON-able (for ``broker stats``)."""
        return models.engine_stats(self)

    @property
    def pending_requests(self) -> int:
        """Direct requests still waiting for a response."""
        return len(self._requests)
