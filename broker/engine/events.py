"""Event subscriptions and event messages (document section "Events").

A client subscribes with an EVENT message whose target is the event name and whose
content type is 1 (subscribe) or 0 (unsubscribe); ``Channel-Name`` / ``Queue-Id`` headers
narrow channel and queue events (absent = every channel / every queue).  Notifications
are EVENT messages with source and target set to the event name, content type the queue
id (0 when none), the same two headers when they apply, and the event model as JSON.
"""

from __future__ import annotations

import json
from typing import Any

from broker import tmqp
from broker.protocol import DEFAULT_TTL, Header, MessageType, Outgoing

#: (channel name or None for all, queue id or None for all)
EventFilter = tuple[str | None, int | None]


class EventHub:
    """Who listens to what; builds the notification frames."""

    def __init__(self) -> None:
        self._subs: dict[str, dict[str, set[EventFilter]]] = {}

    def subscribe(self, client_id: str, name: str, channel: str | None, queue: int | None) -> None:
        self._subs.setdefault(name, {}).setdefault(client_id, set()).add((channel, queue))

    def unsubscribe(
        self, client_id: str, name: str, channel: str | None, queue: int | None
    ) -> bool:
        clients = self._subs.get(name)
        filters = clients.get(client_id) if clients else None
        if filters is None or (channel, queue) not in filters:
            return False
        filters.discard((channel, queue))
        if not filters:
            del clients[client_id]  # type: ignore[union-attr]
            if not clients:
                del self._subs[name]
        return True

    def count(self, client_id: str) -> int:
        """How many subscriptions (event, filter) the client holds."""
        return sum(len(clients.get(client_id, ())) for clients in self._subs.values())

    def has_subscription(
        self, client_id: str, name: str, channel: str | None, queue: int | None
    ) -> bool:
        return (channel, queue) in self._subs.get(name, {}).get(client_id, ())

    def drop_client(self, client_id: str) -> None:
        for name in list(self._subs):
            clients = self._subs[name]
            clients.pop(client_id, None)
            if not clients:
                del self._subs[name]

    def has(self, name: str) -> bool:
        return name in self._subs

    def subscriptions(self, client_id: str) -> list[tuple[str, EventFilter]]:
        return sorted(
            (
                (name, f)
                for name, clients in self._subs.items()
                for f in clients.get(client_id, ())
            ),
            key=repr,
        )

    def emit(
        self,
        name: str,
        model: dict[str, Any],
        out: list[Outgoing],
        channel: str | None = None,
        queue: int | None = None,
    ) -> None:
        clients = self._subs.get(name)
        if not clients:
            return
        frame: tmqp.Frame | None = None
        for client_id, filters in clients.items():
            if not any(
                (fc is None or fc == channel) and (fq is None or fq == queue) for fc, fq in filters
            ):
                continue
            if frame is None:
                headers: list[tuple[str, str]] = []
                if channel is not None:
                    headers.append((Header.CHANNEL_NAME, channel))
                if queue is not None:
                    headers.append((Header.QUEUE_ID, str(queue)))
                frame = tmqp.Frame(
                    message_type=MessageType.EVENT,
                    ttl=DEFAULT_TTL,
                    content_type=queue or 0,
                    source=name,
                    target=name,
                    headers=tuple(headers),
                    payload=json.dumps(model, separators=(",", ":")).encode(),
                )
            out.append(Outgoing(client_id, frame))
