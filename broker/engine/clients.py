"""Clients of the engine: connection, disconnection, direct messages and responses.

Clients are found by id, by name (``@name:X``) or by type (``@type:X``), oldest first.
A direct message (0x12) waiting for a response is remembered until a receiver answers
(0x14); a receiver that disconnects before answering makes the engine answer the
requester with a 581 (SendError) response.  A client that disconnects leaves its
channels, its unacknowledged deliveries fail back to their queues, and its own
outstanding requests are forgotten.

:class:`ClientRegistry` owns the clients (by id, name and type) and the table of direct
requests waiting for a response; it makes clients leave their channels through the
:class:`~broker.engine.channels.ChannelRegistry`.
"""

from __future__ import annotations

from collections.abc import Callable

from broker import tmqp
from broker.engine import frames, models
from broker.engine.auth import Action, Authorizer
from broker.engine.channel import Client as _Client
from broker.engine.channels import ChannelRegistry, Client
from broker.engine.errors import ClientRejected, OperationError
from broker.engine.events import EventHub
from broker.engine.federated import FEDERATION_CLIENT
from broker.engine.host import QueueServices
from broker.engine.options import BrokerConfig
from broker.engine.quotas import user_of
from broker.engine.replies import answer_failure
from broker.protocol import (
    TARGET_BY_NAME,
    TARGET_BY_TYPE,
    ConnectionInfo,
    EventName,
    NackReason,
    Outgoing,
    ResultCode,
)


class ClientRegistry:
    """Client registry and direct messages (see the module docstring)."""

    def __init__(
        self,
        config: BrokerConfig,
        authorizer: Authorizer,
        new_id: Callable[[], str],
        events: EventHub,
        channels: ChannelRegistry,
        services: QueueServices,
        clients: dict[str, Client],
    ) -> None:
        self.config = config
        self.authorizer = authorizer
        self.new_id = new_id
        self.events = events
        self.channels = channels
        self.services = services
        #: Connected clients by id (the same table the queues' host looks clients up in).
        self.clients = clients
        self._by_name: dict[str, list[Client]] = {}
        self._by_type: dict[str, list[Client]] = {}
        #: Direct requests waiting for a response: (requester, message id) -> receivers.
        self.requests: dict[tuple[str, str], set[str]] = {}
        #: Acknowledges and responses that matched nothing.
        self.unmatched_acks = 0

    # ------------------------------------------------------------------ connections

    def admit(self, info: ConnectionInfo, replace: bool, federation: bool = False) -> str:
        """The id a connecting client gets; raises :class:`ClientRejected` (401, 481, 400).

        The token is checked first: a refused client changes nothing.  An id in use is
        refused (481), unless ``replace`` (the caller then ends the old session first).
        The federation's id (``FEDERATION_CLIENT``) is reserved: refused (401) unless
        ``federation`` (the front door checked the connection's proof).
        """
        if not self.authorizer.authenticate(info):
            raise ClientRejected(ResultCode.UNAUTHORIZED, "client token refused")
        client_id = info.client_id
        if client_id == FEDERATION_CLIENT and not federation:
            raise ClientRejected(
                ResultCode.UNAUTHORIZED,
                f"client id {client_id!r} is reserved for this broker's own federation",
            )
        if client_id is None:
            client_id = self.new_id()
            while client_id in self.clients:
                client_id = self.new_id()
        elif not client_id or len(client_id.encode()) > 255 or client_id.startswith("@"):
            raise ClientRejected(ResultCode.BAD_REQUEST, f"invalid client id {client_id!r}")
        if client_id in self.clients and not replace:
            raise ClientRejected(
                ResultCode.ALREADY_CREATED, f"client id {client_id!r} is in use by a session"
            )
        return client_id

    def add(self, client_id: str, info: ConnectionInfo, now: float, out: list[Outgoing]) -> None:
        """Register an admitted client (:meth:`admit`) whose id is free; raises
        :class:`ClientRejected` (482) past ``limits.max_clients``."""
        if len(self.clients) >= self.config.limits.max_clients:
            raise ClientRejected(ResultCode.LIMIT_EXCEEDED, "too many clients connected")
        client: Client = _Client(client_id, info, now)
        client.user = user_of(self.authorizer, client)
        self.clients[client_id] = client
        if client.name:
            self._by_name.setdefault(client.name, []).append(client)
        if client.type:
            self._by_type.setdefault(client.type, []).append(client)
        self.events.emit(EventName.CLIENT_CONNECTED, models.client_event(client), out)

    def disconnect(self, client_id: str, now: float, out: list[Outgoing]) -> None:
        """The client is gone: its unacknowledged deliveries return, its requests fail."""
        client = self.clients.pop(client_id, None)
        if client is None:
            return
        try:
            self._forget_client(client, now, out)
        except Exception as exc:  # never raise into the wire loop
            self.services.count_error("disconnect", exc)

    def _forget_client(self, client: Client, now: float, out: list[Outgoing]) -> None:
        for index in (self._by_name.get(client.name or ""), self._by_type.get(client.type or "")):
            if index is not None and client in index:
                index.remove(client)
        if client.name and not self._by_name.get(client.name):
            self._by_name.pop(client.name, None)
        if client.type and not self._by_type.get(client.type):
            self._by_type.pop(client.type, None)
        self.events.drop_client(client.id)
        self.channels.patterns.forget_client(client.id)
        left = list(client.channels.values())
        for channel in left:
            self.channels.remove_consumer(channel, client, out)
        for queue in list(client.pending_queues):
            if queue.alive:
                queue.consumer_gone(client, now, out)
                queue.drain(now, out)
        client.pending_queues.clear()
        # requests this client was asked to answer
        for key in list(client.awaiting):
            waiting = self.requests.get(key)
            if waiting is None:
                continue
            waiting.discard(client.id)
            if not waiting:
                del self.requests[key]
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
            for rid in self.requests.pop((client.id, mid), ()):
                receiver = self.clients.get(rid)
                if receiver is not None:
                    receiver.awaiting.discard((client.id, mid))
        self.events.emit(EventName.CLIENT_DISCONNECTED, models.client_event(client), out)
        for channel in left:
            self.channels.maybe_destroy(channel, out)

    # ------------------------------------------------------------------ direct, response

    def find_receivers(self, target: str) -> list[Client]:
        """Clients a direct target names: an id, ``@name:X`` or ``@type:X`` (oldest first)."""
        if target.startswith(TARGET_BY_NAME):
            return list(self._by_name.get(target[len(TARGET_BY_NAME) :], ()))
        if target.startswith(TARGET_BY_TYPE):
            return list(self._by_type.get(target[len(TARGET_BY_TYPE) :], ()))
        client = self.clients.get(target)
        return [client] if client is not None else []

    def direct(self, client: Client, frame: tmqp.Frame, out: list[Outgoing]) -> None:
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
            if wants and len(client.requests) >= self.config.limits.max_pending_requests:
                raise OperationError(ResultCode.BUSY, "too many outstanding requests")
        except OperationError as err:
            answer_failure(client, frame, out, err, direct=True)
            return
        self.deliver_direct(client, frame, receivers, out)

    def deliver_direct(
        self, client: Client, frame: tmqp.Frame, receivers: list[Client], out: list[Outgoing]
    ) -> None:
        fwd = frames.with_source(frame, client.id)
        for receiver in receivers:
            out.append(Outgoing(receiver.id, fwd))
        if frame.pending_response and frame.message_id:
            key = (client.id, frame.message_id)
            waiting = self.requests.setdefault(key, set())
            for receiver in receivers:
                waiting.add(receiver.id)
                receiver.awaiting.add(key)
            client.requests.add(frame.message_id)

    def on_response(self, client: Client, frame: tmqp.Frame, out: list[Outgoing]) -> None:
        key = (frame.target, frame.message_id)
        waiting = self.requests.get(key)
        if waiting is not None and client.id in waiting:
            del self.requests[key]
            for rid in waiting:
                receiver = self.clients.get(rid)
                if receiver is not None:
                    receiver.awaiting.discard(key)
        requester = self.clients.get(frame.target)
        if requester is None:
            self.unmatched_acks += 1
            return
        requester.requests.discard(frame.message_id)
        out.append(Outgoing(requester.id, frames.with_source(frame, client.id)))

    def forward_ack(self, client: Client, frame: tmqp.Frame, out: list[Outgoing]) -> None:
        """An acknowledge of a direct message: pass it on to the client it names."""
        receiver = self.clients.get(frame.target)
        if receiver is not None:
            out.append(Outgoing(receiver.id, frames.with_source(frame, client.id)))
