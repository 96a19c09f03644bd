"""Frames the clients send: shared by the blocking ``Client`` and ``AsyncClient``.

Pure builders (no I/O): pushes, direct messages, responses, acknowledges, joins, pulls,
event subscriptions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from broker import tmqp
from broker.client.message import Message
from broker.fanout import FANOUT
from broker.fanout import VERSION as FANOUT_VERSION
from broker.protocol import Header, MessageType, Operation, ResultCode

Headers = Mapping[str, str] | tuple[tuple[str, str], ...]


def normalize_headers(headers: Headers | None) -> tuple[tuple[str, str], ...]:
    """Headers as the codec wants them: a tuple of (key, value) pairs."""
    if not headers:
        return ()
    if isinstance(headers, Mapping):
        return tuple((str(k), str(v)) for k, v in headers.items())
    return tuple(headers)


def as_bytes(payload: bytes | str | None) -> bytes:
    """A payload as bytes (str is UTF-8 encoded, None is empty)."""
    if payload is None:
        return b""
    return payload.encode("utf-8") if isinstance(payload, str) else bytes(payload)


#: A queue push's frame from (queue id, message id, channel, payload): see ``queue_senders``.
PushEncoder = Callable[[int, str, str, bytes], list[bytes]]


def queue_senders(source: str) -> tuple[PushEncoder, PushEncoder, PushEncoder, PushEncoder]:
    """The encoders of queue pushes (no headers) from ``source``, indexed by
    ``high_priority + 2 * ack``: fire-and-forget first, then those asking for an
    acknowledge (``tmqp.encode_frame_sender``: the flags and the source made once, not per
    push)."""
    kind = int(MessageType.QUEUE)
    return (
        tmqp.encode_frame_sender(message_type=kind, source=source),
        tmqp.encode_frame_sender(high_priority=True, message_type=kind, source=source),
        tmqp.encode_frame_sender(message_type=kind, pending_ack=True, source=source),
        tmqp.encode_frame_sender(
            high_priority=True, message_type=kind, pending_ack=True, source=source
        ),
    )


def batch_senders(source: str) -> tuple[PushEncoder, PushEncoder]:
    """The encoders of batch frames (``broker.batch``) from ``source``, indexed by
    ``ack``: called with (``batch.BATCH``, the batch id, "", the packed entries) they give
    the octets ``batch.batch_frame`` gives (the flags and the source made once)."""
    kind = int(MessageType.SERVER)
    return (
        tmqp.encode_frame_sender(message_type=kind, source=source),
        tmqp.encode_frame_sender(message_type=kind, pending_ack=True, source=source),
    )


def queue_frame(
    message_id: str,
    channel: str,
    queue_id: int,
    payload: bytes,
    *,
    source: str,
    ack: bool,
    headers: Headers | None,
    high_priority: bool,
) -> tmqp.Frame:
    """A push into a queue (``source`` is the client's own id)."""
    return tmqp.Frame(
        high_priority=high_priority,
        message_type=MessageType.QUEUE,
        pending_ack=ack,
        content_type=queue_id,
        message_id=message_id,
        source=source,
        target=channel,
        headers=normalize_headers(headers),
        payload=payload,
    )


def direct_frame(
    message_id: str,
    target: str,
    payload: bytes | str,
    *,
    content_type: int = 0,
    headers: Headers | None = None,
    high_priority: bool = False,
    response: bool = False,
    ack: bool = False,
) -> tmqp.Frame:
    """A direct message to a client id, ``@name:NAME`` or ``@type:TYPE``."""
    return tmqp.Frame(
        high_priority=high_priority,
        message_type=MessageType.DIRECT,
        pending_response=response,
        pending_ack=ack,
        content_type=content_type,
        message_id=message_id,
        target=target,
        headers=normalize_headers(headers),
        payload=as_bytes(payload),
    )


def response_frame(
    message: Message,
    payload: bytes | str = b"",
    *,
    code: int = ResultCode.OK,
    headers: Headers | None = None,
) -> tmqp.Frame:
    """The answer to a direct message that waits for a response."""
    return tmqp.Frame(
        message_type=MessageType.RESPONSE,
        content_type=code,
        message_id=message.id,
        target=message.source,
        headers=normalize_headers(headers),
        payload=as_bytes(payload),
    )


def ack_frame(message: Message, headers: tuple[tuple[str, str], ...] = ()) -> tmqp.Frame:
    """Acknowledge (negative with a ``Nack-Reason`` header) of a received message.

    Direct messages are acknowledged to their sender with the high-priority flag; queue
    messages to their channel, content type = queue id.
    """
    f = message.frame
    if f.message_type == MessageType.DIRECT:
        return tmqp.Frame(
            high_priority=True,
            message_type=MessageType.ACK,
            message_id=f.message_id,
            target=f.source,
            headers=headers,
        )
    return tmqp.Frame(
        message_type=MessageType.ACK,
        content_type=f.content_type,
        message_id=f.message_id,
        target=f.target,
        headers=headers,
    )


@dataclass(frozen=True, slots=True)
class Joining:
    """What a JOIN asked for beyond its channel (a session keeps it per joined channel and
    joins with it again after a reconnect): ``Prefetch``, ``Selector``, ``Credit``."""

    prefetch: int | None = None
    selector: str | None = None
    credit: tuple[int, int] | None = None


def _credit_header(credit: tuple[int, int]) -> tuple[str, str]:
    """``Credit: COUNT,SIZE``; ValueError for what the broker would refuse anyway."""
    try:
        count, size = credit
    except (TypeError, ValueError):
        raise ValueError("credit must be a (count, size) pair") from None
    for value in (count, size):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"credit windows must be whole numbers >= 0, not {credit!r}")
    if count == 0 and size == 0:
        raise ValueError("credit (0, 0) would never let a message through")
    return (Header.CREDIT, f"{count},{size}")


def _prefetch_headers(prefetch: int | None) -> tuple[tuple[str, str], ...]:
    """A JOIN's ``Prefetch`` header (none for None); ValueError unless a positive integer."""
    if prefetch is None:
        return ()
    if isinstance(prefetch, bool) or prefetch < 1:
        raise ValueError("prefetch must be a positive integer")
    return ((Header.PREFETCH, str(prefetch)),)


def join_frame(
    message_id: str,
    channel: str,
    prefetch: int | None = None,
    fanout: bool = False,
    *,
    selector: str | None = None,
    credit: tuple[int, int] | None = None,
) -> tmqp.Frame:
    """JOIN ``channel``; ``prefetch``: the most deliveries of each of its queues this client
    takes in flight (``Prefetch`` header; None: the queue's or the broker's default).
    ``fanout``: ask for the broadcast fan-out (``broker.engine.fanout``), answered by a
    RESPONSE whose headers say where to subscribe (none from a broker without it).
    ``selector`` (``Selector``: SQL-92 over message headers, checked by the broker) and
    ``credit`` (``Credit: COUNT,SIZE``): see ``broker.engine.join_rules``."""
    headers = _prefetch_headers(prefetch)
    if selector is not None:
        if "\r" in selector or "\n" in selector:
            raise ValueError("a selector is one line")
        headers = (*headers, (Header.SELECTOR, selector))
    if credit is not None:
        headers = (*headers, _credit_header(credit))
    if fanout:
        headers = (*headers, (FANOUT, FANOUT_VERSION))
    return tmqp.Frame(
        message_type=MessageType.SERVER,
        pending_ack=not fanout,
        pending_response=fanout,
        content_type=Operation.JOIN,
        message_id=message_id,
        target=channel,
        headers=headers,
    )


#: ``Pattern: yes`` on a JOIN or LEAVE: its target is a channel-name pattern.
PATTERN_HEADER = (Header.PATTERN, "yes")


def pattern_join_frame(message_id: str, pattern: str, prefetch: int | None = None) -> tmqp.Frame:
    """JOIN every channel ``pattern`` matches, now and as they are created (``Pattern:
    yes``; ``broker.engine.patterns``); ``prefetch`` as for :func:`join_frame`."""
    window = _prefetch_headers(prefetch)
    return tmqp.Frame(
        message_type=MessageType.SERVER,
        pending_ack=True,
        content_type=Operation.JOIN,
        message_id=message_id,
        target=pattern,
        headers=(*window, PATTERN_HEADER),
    )


def pattern_leave_frame(message_id: str, pattern: str) -> tmqp.Frame:
    """LEAVE pattern join ``pattern``: the channels it joined are left."""
    return tmqp.Frame(
        message_type=MessageType.SERVER,
        pending_ack=True,
        content_type=Operation.LEAVE,
        message_id=message_id,
        target=pattern,
        headers=(PATTERN_HEADER,),
    )


def event_frame(
    message_id: str, event: str, on: bool, channel: str | None, queue_id: int | None
) -> tmqp.Frame:
    """Subscribe to (``on``) or unsubscribe from a server event."""
    headers: list[tuple[str, str]] = []
    if channel is not None:
        headers.append((Header.CHANNEL_NAME, channel))
    if queue_id is not None:
        headers.append((Header.QUEUE_ID, str(queue_id)))
    return tmqp.Frame(
        message_type=MessageType.EVENT,
        pending_ack=True,
        content_type=1 if on else 0,
        message_id=message_id,
        target=event,
        headers=tuple(headers),
    )


def pull_frame(
    message_id: str,
    channel: str,
    queue_id: int,
    count: int,
    *,
    clear: str | None = None,
    order: str | None = None,
    info: bool = False,
) -> tmqp.Frame:
    """A pull request (``count`` messages of a pull or cache queue)."""
    headers = [(Header.COUNT, str(count))]
    if clear:
        headers.append((Header.CLEAR, clear))
    if order:
        headers.append((Header.ORDER, order))
    if info:
        headers.append((Header.INFO, "yes"))
    return tmqp.Frame(
        message_type=MessageType.PULL,
        pending_response=True,
        content_type=queue_id,
        message_id=message_id,
        target=channel,
        headers=tuple(headers),
    )
