"""Server operations on the wire: the SERVER frame that asks, and the pages of its answer.

Pure (no I/O): ``broker.client.session`` gathers paged answers with :func:`next_page`;
the operations themselves are the methods of ``broker.client.api.ClientApi``.
"""

from __future__ import annotations

import json
from typing import Any

from broker import tmqp
from broker.client.errors import ClientError
from broker.protocol import Header, MessageType, header


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

    ``payload`` is sent as JSON.
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
