"""The document's JSON models (PascalCase keys): information, summaries and events."""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from broker.engine.auth import bare_token
from broker.engine.flow import unsent_deliveries
from broker.engine.options import status_name

if TYPE_CHECKING:
    from broker.engine.channel import Channel, Client
    from broker.engine.message import QueueMessage
    from broker.engine.queue_view import QueueView as Queue

#: The queue type of the channels given (anything a ``QueueView`` describes).
QV = TypeVar("QV", bound="Queue")


def queue_information(q: Queue, wall: float, now: float) -> dict[str, Any]:
    """QueueInformation; ``wall`` is UNIX seconds at monotonic ``now``."""

    def stamp(t: float | None) -> int:
        return 0 if t is None else int((wall - (now - t)) * 1000)

    o = q.options
    return {
        "Id": q.id,
        "Channel": q.channel.name,
        "Tag": o.tag,
        "PriorityMessages": q.n_priority,
        "Messages": q.n_regular,
        "Status": status_name(q.status),
        "OnlyFirstAcquirer": o.send_only_first_acquirer,
        "RequestAcknowledge": o.request_acknowledge,
        "AcknowledgeTimeout": o.acknowledge_timeout,
        "MessageTimeout": o.message_timeout,
        "UseMessageId": o.use_message_id,
        "WaitForAcknowledge": o.wait_for_acknowledge,
        "HideClientNames": o.hide_client_names,
        "ReceivedMessages": q.received,
        "SentMessages": q.sent,
        "Deliveries": q.deliveries,
        "NegativeAcks": q.nacks,
        "Acks": q.acks,
        "TimeoutMessages": q.timeouts,
        "SavedMessages": q.saves,
        "RemovedMessages": q.removed,
        "Errors": q.errors,
        "LastMessageReceived": stamp(q.last_received),
        "LastMessageSent": stamp(q.last_sent),
        "MessageLimit": o.message_limit,
        "MessageSizeLimit": o.message_size_limit,
        # zerohub additions
        # (AUTO deliveries, ``flow.AUTO``, wait for their acknowledge by taking too)
        "PendingAcknowledges": len(q.pending) + q.auto_in_flight,
        "Sequence": q.sequence,
        "Prefetch": q.window,
        # deliveries holding a slot of a consumer's window: not yet acknowledged, or
        # (queues without acknowledges) handed to the transport and not yet sent
        "InFlight": sum(q.used.values()),
        "DroppedDeliveries": q.dropped,
        # zerohub: pushes taken as duplicates of a recent message id (``queue.dedupe``),
        # and consumed messages kept readable by sequence (``Retain``)
        "DuplicateMessages": q.duplicates,
        "RetainedMessages": len(q.retained),
    }


def queue_summary(q: Queue) -> dict[str, Any]:
    """QueueSummary (queue list) and the QueueEvent model."""
    return {
        "Channel": q.channel.name,
        "Id": q.id,
        "Tag": q.options.tag,
        "Status": status_name(q.status),
        "PriorityMessages": q.n_priority,
        "Messages": q.n_regular,
    }


def channel_information(channel: Channel[Any]) -> dict[str, Any]:
    o = channel.options
    q = o.queue
    return {
        "Name": channel.name,
        "Queues": sorted(channel.queues),
        "AllowMultipleQueues": o.allow_multiple_queues,
        "AllowedQueues": None if o.allowed_queues is None else list(o.allowed_queues),
        "OnlyFirstAcquirer": q.send_only_first_acquirer,
        "RequestAcknowledge": q.request_acknowledge,
        "AcknowledgeTimeout": q.acknowledge_timeout,
        "MessageTimeout": q.message_timeout,
        "UseMessageId": q.use_message_id,
        "WaitForAcknowledge": q.wait_for_acknowledge,
        "HideClientNames": q.hide_client_names,
        "ActiveClients": len(channel.consumers),
        "ClientLimit": o.client_limit,
        "QueueLimit": o.queue_limit,
        "DestroyWhenEmpty": o.destroy_when_empty,
    }


def client_information(client: Client[Any], now: float) -> dict[str, Any]:
    return {
        "Id": client.id,
        "Name": client.name,
        "Type": client.type,
        "Online": int((now - client.connected_at) * 1000),
        "IsAuthenticated": bare_token(client.token) is not None,
    }


# ---------------------------------------------------------------------- event models


def client_event(client: Client[Any]) -> dict[str, Any]:
    return {"Id": client.id, "Name": client.name, "Type": client.type}


def channel_event(channel: Channel[Any]) -> dict[str, Any]:
    return {
        "Name": channel.name,
        "ActiveClient": len(channel.consumers),
        "ClientLimit": channel.options.client_limit,
    }


def subscription_event(channel: Channel[Any], client: Client[Any]) -> dict[str, Any]:
    return {
        "Channel": channel.name,
        "ClientId": client.id,
        "ClientName": client.name,
        "ClientType": client.type,
    }


def message_event(queue: Queue, message: QueueMessage) -> dict[str, Any]:
    producer = message.producer
    return {
        "Channel": queue.channel.name,
        "Queue": queue.id,
        "Id": message.message_id,
        "Saved": message.saved,
        "ProducerId": producer.id if producer is not None else message.message.source,
        "ProducerName": producer.name if producer is not None else None,
        "ProducerType": producer.type if producer is not None else None,
    }


def channel_stats(c: Channel[QV]) -> dict[str, Any]:
    """One entry of the statistics' ``channel_list``."""
    return {
        "name": c.name,
        "consumers": len(c.consumers),
        "queues": [
            {
                **queue_summary(q),
                "PendingAcknowledges": len(q.pending) + q.auto_in_flight,
                "Sequence": q.sequence,
                # counters: the hub's per-queue rates are their differences over time
                "ReceivedMessages": q.received,
                "SentMessages": q.sent,
            }
            for q in c.queues.values()
        ],
    }


def client_rows(clients: Iterable[Client[Any]], limit: int) -> list[dict[str, Any]]:
    """The statistics' ``client_list``: the first ``limit`` clients of ``clients`` (the
    engine passes them oldest connection first), each with what it said about itself,
    since when it is connected (``ConnectedAt``: the engine's clock), the channels it
    joined (in join order), its deliveries waiting for its acknowledge (``Unacked``: its
    window slots in the queues it owes acknowledges to) and those not yet taken by the
    transport (``Unsent``).  Costs O(``limit`` x channels and queues a client holds),
    never a walk over every client or every delivery."""
    rows = []
    for c in itertools.islice(clients, max(0, limit)):
        cid = c.id
        rows.append(
            {
                "Id": cid,
                "Name": c.name,
                "Type": c.type,
                "ConnectedAt": c.connected_at,
                "Channels": list(c.channels),
                "Unacked": sum(q.used.get(cid, 0) for q in c.pending_queues),
                "Unsent": unsent_deliveries(c),
            }
        )
    return rows


@dataclass(frozen=True, slots=True)
class EngineCounts:
    """The engine-wide figures of the statistics (the queues' own come from the queues)."""

    node: str
    clients: int
    pending_requests: int
    routers: int
    errors: int
    unmatched_acks: int
    #: Distinct patterns held (TMQP pattern joins and STOMP wildcards).
    patterns: int
    limits: dict[str, int]


def engine_totals(counts: EngineCounts, channels: Collection[Channel[QV]]) -> dict[str, object]:
    # one pass over the queues (the hub's metrics read this every scrape: 1000s of queues)
    n = messages = pending = errors = in_flight = 0
    received = sent = deliveries = acks = nacks = timeouts = removed = dropped = 0
    for c in channels:
        for q in c.queues.values():
            n += 1
            messages += q.message_count
            pending += len(q.pending) + q.auto_in_flight
            errors += q.errors
            received += q.received
            sent += q.sent
            deliveries += q.deliveries
            acks += q.acks
            nacks += q.nacks
            timeouts += q.timeouts
            removed += q.removed
            dropped += q.dropped
            if q.used:
                in_flight += sum(q.used.values())
    return {
        "node": counts.node,
        "clients": counts.clients,
        "channels": len(channels),
        "queues": n,
        "messages": messages,
        "pending_acks": pending,
        "pending_requests": counts.pending_requests,
        "routers": counts.routers,
        "errors": counts.errors + errors,
        "unmatched_acks": counts.unmatched_acks,
        "patterns": counts.patterns,
        "received": received,
        "sent": sent,
        "deliveries": deliveries,
        "acks": acks,
        "nacks": nacks,
        "timeouts": timeouts,
        "removed": removed,
        "dropped_deliveries": dropped,
        "in_flight": in_flight,
        "limits": counts.limits,
    }


def engine_stats(counts: EngineCounts, channels: Collection[Channel[QV]]) -> dict[str, object]:
    out = engine_totals(counts, channels)
    out["channel_list"] = [channel_stats(c) for c in channels]
    return out
