"""Pull requests (message type 0x15) against a Pull or Cache queue.

Pull status: up to ``Count`` messages (default 1) leave the queue, high priority first,
FIFO or (``Order: LIFO``) LIFO; each carries ``Request-Id``, ``Index`` (1-based) and
``Count`` headers, plus ``Priority-Messages``/``Messages`` (left in the queue) with
``Info: yes``.  The answer always ends with a ``No-Content: End`` marker; an empty queue
or a bad request adds one ``No-Content`` marker (Empty, Unacceptable) before it.  After
sending, ``Clear`` (all / high-priority / default-priority) empties the rest.  A request
gets at most the room left in the client's window for the queue (``broker.flow``): with
none, one ``No-Content: Limit-Exceeded`` marker (the client must acknowledge first).

Cache status: one RESPONSE to the request id: content type 0 and the latest message
(which stays in the queue), or 404 with ``No-Content: Empty``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker.engine.delivery import PutBack
from broker.engine.flow import ACKED, CACHE, COPY
from broker.engine.frames import pull_marker, response, response_with
from broker.engine.message import INFLIGHT, Message, QueueMessage, derive
from broker.engine.options import status_name
from broker.engine.queue.dispatch import redelivery_headers
from broker.engine.queue.protocols import QueueCore
from broker.protocol import (
    ClearOption,
    Header,
    MessageType,
    NackReason,
    NoContent,
    Outgoing,
    ResultCode,
)

if TYPE_CHECKING:
    from broker.engine.channel import Client as _Client

    Client = _Client[Any]

_QUEUE = int(MessageType.QUEUE)
_RESPONSE = int(MessageType.RESPONSE)
_CLEAR_VALUES = (
    ClearOption.NONE,
    ClearOption.ALL,
    ClearOption.HIGH_PRIORITY,
    ClearOption.DEFAULT_PRIORITY,
)


def refuse_pull(q: QueueCore, client: Client, request: Message, out: list[Outgoing]) -> None:
    """A status without pull requests: one Unacceptable marker, then End."""
    status = status_name(q.strategy.status)
    where = f"{q.channel.name}/{q.id}"
    why = f"queue {where} has status {status}: pull works on Pull and Cache queues"
    _refuse(q, client, request.message_id, why, out)


def _refuse(q: QueueCore, client: Client, rid: str, why: str, out: list[Outgoing]) -> None:
    name = q.channel.name
    out.append(Outgoing(client.id, pull_marker(rid, name, q.id, NoContent.UNACCEPTABLE, why)))
    out.append(Outgoing(client.id, pull_marker(rid, name, q.id, NoContent.END)))


def pull_messages(
    q: QueueCore,
    client: Client,
    request: Message,
    now: float,
    out: list[Outgoing],
    max_count: int,
) -> None:
    """Pull status: answer a request with up to ``Count`` messages (see the docstring)."""
    rid = request.message_id
    name = q.channel.name
    raw = request.header(Header.COUNT)
    try:
        count = 1 if raw is None else int(raw)
    except ValueError:
        count = 0
    clear = (request.header(Header.CLEAR) or ClearOption.NONE).strip().lower()
    if count < 1:
        _refuse(q, client, rid, "Count must be a whole number of at least 1", out)
        return
    if clear not in _CLEAR_VALUES:
        _refuse(q, client, rid, f"Clear must be one of: {', '.join(_CLEAR_VALUES)}", out)
        return
    room = (client.prefetch.get(name) or q.window) - q.used.get(client.id, 0)
    if room <= 0:
        out.append(Outgoing(client.id, pull_marker(rid, name, q.id, NoContent.LIMIT_EXCEEDED)))
        out.append(Outgoing(client.id, pull_marker(rid, name, q.id, NoContent.END)))
        return
    count = min(count, max_count, room)
    lifo = (request.header(Header.ORDER) or "").strip().upper() == "LIFO"
    info = (request.header(Header.INFO) or "").strip().lower() in ("yes", "true", "1")
    batch = _take(q, client, count, lifo, now, out)
    total = len(batch)
    if not total:
        out.append(Outgoing(client.id, pull_marker(rid, name, q.id, NoContent.EMPTY)))
    extra: tuple[tuple[str, str], ...] = ()
    if info:
        extra = (
            (Header.PRIORITY_MESSAGES, str(q.messages.n_priority)),
            (Header.MESSAGES, str(q.messages.n_regular)),
        )
    opts = q.options
    req_ack = opts.request_acknowledge
    deadline = now + opts.acknowledge_timeout / 1000.0 if opts.acknowledge_timeout else q.NEVER
    kind = ACKED if req_ack else COPY
    for index, m in enumerate(batch, 1):
        f = m.message
        headers = redelivery_headers(f.headers, m.delivered) if m.delivered else f.headers
        headers = (
            *headers,
            (Header.REQUEST_ID, rid),
            (Header.INDEX, str(index)),
            (Header.COUNT, str(total)),
            *extra,
        )
        source = "" if opts.hide_client_names else f.source
        frame = derive(f, req_ack, q.id, f.message_id, source, name, headers)
        m.transmitted = 0
        if not req_ack:
            m.unsent += 1
        q.hand(client, kind, m, frame, out)
        q.after_send(m, client, req_ack, deadline, out)
    out.append(Outgoing(client.id, pull_marker(rid, name, q.id, NoContent.END)))
    if clear != ClearOption.NONE:
        q.clear(
            out,
            priority=clear in (ClearOption.ALL, ClearOption.HIGH_PRIORITY),
            regular=clear in (ClearOption.ALL, ClearOption.DEFAULT_PRIORITY),
            in_flight=False,
        )


def _take(
    q: QueueCore, client: Client, count: int, lifo: bool, now: float, out: list[Outgoing]
) -> list[QueueMessage]:
    """Dequeue up to ``count`` messages the client may receive."""
    req_ack = q.options.request_acknowledge
    messages = q.messages
    messages.flush_front()
    batch: list[QueueMessage] = []
    while len(batch) < count:
        m = messages.next_last() if lifo else messages.next_first()
        if m is None:
            break
        if m.deadline and m.deadline <= now:
            q.expire(m, out)
            continue
        if (req_ack and (client.id, m.message_id) in q.pending) or not q.eligible(m, client):
            messages.unpop(m, last=lifo)
            break
        if q.hooks.begin_send:
            d = q.hooks.call(m, "begin_send", q, m)
            q.side_effects(m, d, out)
            if not d.allow:
                if d.put_back is not PutBack.NO:
                    m.state = INFLIGHT
                    q.put_back(m, d.put_back, now, out)
                    break
                q.drop(m, out, NackReason.UNACCEPTABLE)
                continue
        m.state = INFLIGHT
        batch.append(m)
    return batch


def pull_latest(q: QueueCore, client: Client, request: Message, out: list[Outgoing]) -> None:
    """Cache status: the latest message (left in the queue), or 404 Empty."""
    latest = q.messages.latest()
    rid = request.message_id
    if latest is None:
        empty = ((Header.NO_CONTENT, NoContent.EMPTY),)
        frame = response(rid, client.id, ResultCode.NOT_FOUND, "empty", headers=empty)
    else:
        f = latest.message
        source = "" if q.options.hide_client_names else f.source
        answer = response_with(f, rid, client.id, source)
        q.hand(client, CACHE, None, answer, out)  # counted once sent
        return
    out.append(Outgoing(client.id, frame))


__all__ = ["pull_latest", "pull_messages", "refuse_pull"]
