"""Server operations of ``broker.Client``: channels, queues, clients, nodes, statistics.

Each method sends one SERVER frame (content type = ``protocol.Operation``) and waits for
its ACK (create/update/delete) or RESPONSE (lists and information, parsed from JSON).
A failure raises ``RemoteError`` with the broker's status code.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from broker import tmqp
from broker.protocol import Header, MessageType, Operation


def operation_frame(
    message_id: str,
    operation: int,
    target: str = "",
    *,
    payload: Any = None,
    queue_id: int | None = None,
    response: bool = False,
) -> tmqp.Frame:
    """A SERVER frame for ``operation`` asking for an ACK, or (``response``) a RESPONSE.

    Shared by the blocking client and ``broker.aioclient``; ``payload`` is sent as JSON.
    """
    headers = ((Header.QUEUE_ID, str(queue_id)),) if queue_id is not None else ()
    body = b"" if payload is None else json.dumps(payload).encode("utf-8")
    return tmqp.Frame(
        message_type=MessageType.SERVER,
        pending_ack=not response,
        pending_response=response,
        content_type=operation,
        message_id=message_id,
        target=target,
        headers=headers,
        payload=body,
    )


class AdminOperations:
    """Mixed into ``Client``, which provides ``new_id`` and ``_call``."""

    def new_id(self) -> str:
        raise NotImplementedError

    def _call(self, frame: tmqp.Frame, timeout: float | None = None) -> tmqp.Frame:
        raise NotImplementedError

    def _json(self, frame: tmqp.Frame, timeout: float | None = None) -> Any:
        reply = self._call(frame, timeout)
        return json.loads(reply.payload) if reply.payload else None

    def _op(
        self,
        operation: int,
        target: str = "",
        *,
        payload: Any = None,
        queue_id: int | None = None,
        response: bool = False,
    ) -> tmqp.Frame:
        return operation_frame(
            self.new_id(), operation, target, payload=payload, queue_id=queue_id, response=response
        )

    def create_channel(self, name: str, options: Mapping[str, Any] | None = None) -> None:
        self._call(self._op(Operation.CHANNEL_CREATE, name, payload=options))

    def update_channel(self, name: str, options: Mapping[str, Any]) -> None:
        self._call(self._op(Operation.CHANNEL_UPDATE, name, payload=options))

    def delete_channel(self, name: str) -> None:
        self._call(self._op(Operation.CHANNEL_DELETE, name))

    def channels(self, pattern: str = "") -> Any:
        return self._json(self._op(Operation.CHANNEL_LIST, pattern, response=True))

    def channel_info(self, name: str) -> Any:
        return self._json(self._op(Operation.CHANNEL_INFO, name, response=True))

    def create_queue(
        self, channel: str, queue_id: int, options: Mapping[str, Any] | None = None
    ) -> None:
        self._call(self._op(Operation.QUEUE_CREATE, channel, payload=options, queue_id=queue_id))

    def update_queue(self, channel: str, queue_id: int, options: Mapping[str, Any]) -> None:
        self._call(self._op(Operation.QUEUE_UPDATE, channel, payload=options, queue_id=queue_id))

    def delete_queue(self, channel: str, queue_id: int) -> None:
        self._call(self._op(Operation.QUEUE_DELETE, channel, queue_id=queue_id))

    def queues(self, channel: str) -> Any:
        return self._json(self._op(Operation.QUEUE_LIST, channel, response=True))

    def queue_info(self, channel: str, queue_id: int) -> Any:
        frame = self._op(Operation.QUEUE_INFO, channel, queue_id=queue_id, response=True)
        return self._json(frame)

    def clients(self, client_type: str = "") -> Any:
        return self._json(self._op(Operation.CLIENT_LIST, client_type, response=True))

    def nodes(self) -> Any:
        return self._json(self._op(Operation.NODE_LIST, response=True))

    def stats(self) -> Any:
        """The server's transport counters and the engine's statistics."""

        return self._json(self._op(Operation.STATS, response=True))
