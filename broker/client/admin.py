"""Server operations of ``broker.Client``: channels, queues, clients, nodes, statistics.

Each method sends one SERVER frame (content type = ``protocol.Operation``) and waits for
its ACK (create/update/delete) or RESPONSE (lists and information, parsed from JSON).
A failure raises ``RemoteError`` with the broker's status code.  Lists (and statistics)
that the broker sends in pages are gathered here: the caller gets the whole list.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from broker import tmqp
from broker.client.errors import ClientError
from broker.paging import merge
from broker.protocol import Header, MessageType, Operation, header


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


def next_page(
    request: tmqp.Frame, reply: tmqp.Frame, message_id: str, seen: set[str]
) -> tmqp.Frame | None:
    """The request for the page after ``reply`` (None when ``reply`` ended the list).

    Lists longer than the broker's reply budget come in pages (``broker.paging``); both
    clients gather them with this.  ``seen`` holds the cursors already asked for in this
    list: a broker that names one again (A, B, A, ...) would make the client loop
    forever, so that is a ``ClientError``.
    """
    more = header(reply, Header.PAGE_NEXT)
    if more is None:
        return None
    if more in seen:
        raise ClientError(f"the broker sent the page after {more!r} again")
    seen.add(more)
    wanted = Header.PAGE_AFTER.lower()
    kept = tuple((k, v) for k, v in request.headers if k.lower() != wanted)
    return request.replace(message_id=message_id, headers=(*kept, (Header.PAGE_AFTER, more)))


#: Where the paged list is in a statistics reply (the other lists are the reply itself).
STATS_LIST = ("engine", "channel_list")


class AdminOperations:
    """Mixed into ``Client``, which provides ``new_id`` and ``_call``."""

    def new_id(self) -> str:
        raise NotImplementedError

    def _call(self, frame: tmqp.Frame, timeout: float | None = None) -> tmqp.Frame:
        raise NotImplementedError

    def _json(
        self, frame: tmqp.Frame, timeout: float | None = None, path: tuple[str, ...] = ()
    ) -> Any:
        """The JSON answer to ``frame``, every page of it (the list at ``path``)."""
        reply = self._call(frame, timeout)
        value = json.loads(reply.payload) if reply.payload else None
        seen: set[str] = set()
        request = next_page(frame, reply, self.new_id(), seen)
        while request is not None:
            reply = self._call(request, timeout)
            merge(value, json.loads(reply.payload), path)
            request = next_page(request, reply, self.new_id(), seen)
        return value

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

        return self._json(self._op(Operation.STATS, response=True), path=STATS_LIST)
