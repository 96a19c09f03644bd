"""Publishing through a router (message type ROUTER, 0x17): see ``broker.engine.router``.

A binding hands the message to a channel queue (created on the fly when the config
allows it) or to the clients a direct target names.
"""

from __future__ import annotations

from broker import tmqp
from broker.engine import frames
from broker.engine.auth import Action
from broker.engine.channels import Client
from broker.engine.errors import OperationError
from broker.engine.parts import EngineParts
from broker.engine.replies import ack_frame, answer_failure
from broker.engine.router import Binding, Interaction, QueueBinding
from broker.engine.tmqp_door import message_of
from broker.protocol import MessageType, NackReason, Outgoing, ResultCode


def publish(
    parts: EngineParts, client: Client, frame: tmqp.Frame, now: float, out: list[Outgoing]
) -> None:
    """A ROUTER message: pass it to the router's bindings by its method.

    The publisher waiting for an ack (or a response) gets it from a binding whose
    interaction passes that wish on; otherwise the server answers success itself once a
    binding took the message, and a failure (404 ``no-route``) when none did.
    """
    try:
        router = parts.routers.routers.get(frame.target)
        if router is None or not router.enabled:
            raise OperationError(ResultCode.NOT_FOUND, "no such router", NackReason.NO_ROUTE)
        if not parts.authorizer.allows(client, Action.ROUTER_PUBLISH, target=router.name):
            raise OperationError(ResultCode.UNAUTHORIZED, "may not publish to this router")
        bindings, stop_first = router.candidates()
        delivered = 0
        answered = False
        for binding in bindings:
            if _route(parts, client, frame, binding, now, out):
                delivered += 1
                if (binding.interaction is Interaction.ACKNOWLEDGE and frame.pending_ack) or (
                    binding.interaction is Interaction.RESPONSE and frame.pending_response
                ):
                    answered = True
                if stop_first:
                    break
        if not delivered:
            raise OperationError(ResultCode.NOT_FOUND, "no binding took it", NackReason.NO_ROUTE)
    except OperationError as err:
        answer_failure(client, frame, out, err)
        return
    if answered:
        return
    if frame.pending_response:
        out.append(Outgoing(client.id, frames.response(frame.message_id, client.id, 0)))
    elif frame.pending_ack:
        out.append(Outgoing(client.id, ack_frame(frame, ResultCode.OK, None)))


def _route(
    parts: EngineParts,
    client: Client,
    frame: tmqp.Frame,
    binding: Binding,
    now: float,
    out: list[Outgoing],
) -> bool:
    """Hand the message to one binding; False when the binding cannot take it."""
    interaction = binding.interaction
    keep_id = interaction is not Interaction.NONE and bool(frame.message_id)
    mid = frame.message_id if keep_id else parts.services.new_id()
    if isinstance(binding, QueueBinding):
        try:
            queue = parts.channels.resolve_queue(client, binding.channel, binding.queue, out)
        except OperationError:
            return False
        if not parts.authorizer.allows(client, Action.PUSH, queue.channel.name, queue.id):
            return False
        waits = interaction is Interaction.ACKNOWLEDGE and frame.pending_ack and keep_id
        if keep_id and queue.duplicate(mid, client, waits, now, out):
            return True  # taken before (a retry): done
        size = len(frame.payload)
        if parts.channels.check_push(queue, size):
            return False
        copies = parts.durable.queues_for(queue.channel.name) if parts.durable.by_topic else []
        if any(parts.channels.check_push(copy, size) for copy in copies):
            return False  # a durable subscription of the channel is full: all or nothing
        message = message_of(frame)
        taken = queue.accept(message, client, now, out, waits, message_id=mid) is not None
        for copy in copies:  # (broker.engine.dsubs)
            copy.accept(message, client, now, out, False, message_id=mid)
        return taken
    receivers = parts.clients.find_receivers(binding.target)
    if frame.first_acquirer:
        receivers = receivers[:1]
    if not receivers:
        return False
    direct = frames.derive(
        frame,
        _DIRECT,
        interaction is Interaction.RESPONSE and frame.pending_response and keep_id,
        interaction is Interaction.ACKNOWLEDGE and frame.pending_ack and keep_id,
        frame.content_type if binding.content_type is None else binding.content_type,
        mid,
        client.id,
        binding.target,
        frame.headers,
    )
    parts.clients.deliver_direct(client, direct, receivers, out)
    return True


_DIRECT = int(MessageType.DIRECT)
