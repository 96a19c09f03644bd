"""Frame builders the engine uses (positional construction: these run per message)."""

from __future__ import annotations

from broker import tmqp
from broker.message import Message
from broker.protocol import DEFAULT_TTL, Header, MessageType

_Frame = tmqp.Frame
_QUEUE = int(MessageType.QUEUE)
_ACK = int(MessageType.ACK)
_RESPONSE = int(MessageType.RESPONSE)

Headers = tuple[tuple[str, str], ...]


def derive(
    f: tmqp.Frame,
    message_type: int,
    pending_response: bool,
    pending_ack: bool,
    content_type: int,
    message_id: str,
    source: str,
    target: str,
    headers: Headers,
) -> tmqp.Frame:
    """A frame with ``f``'s flags (one delivery, priority), TTL and payload.

    Returns ``f`` itself when nothing differs, so the server can forward the
    octets it received instead of encoding the frame again.
    """
    if (
        message_id == f.message_id
        and source == f.source
        and message_type == f.message_type
        and content_type == f.content_type
        and pending_ack == f.pending_ack
        and pending_response == f.pending_response
        and target == f.target
        and headers == f.headers
    ):
        return f
    return _Frame(
        f.first_acquirer,
        f.high_priority,
        message_type,
        pending_response,
        pending_ack,
        f.ttl,
        content_type,
        message_id,
        source,
        target,
        headers,
        f.payload,
    )


def response_with(m: Message, request_id: str, to: str, source: str) -> tmqp.Frame:
    """A successful RESPONSE to ``request_id`` carrying message ``m`` (a Cache queue's
    answer): its headers, payload, priority, first-acquirer flag and TTL."""
    payload = m.payload
    return _Frame(
        m.first_acquirer,
        m.high_priority,
        _RESPONSE,
        False,
        False,
        m.ttl,
        0,
        request_id,
        source,
        to,
        m.headers,
        payload if type(payload) is bytes else bytes(payload),
    )


def with_source(f: tmqp.Frame, source: str) -> tmqp.Frame:
    """``f`` with another source (the sending client, as the server stamps it)."""
    if f.source == source:
        return f
    return f.replace(source=source)


def control(
    message_type: int,
    content_type: int,
    message_id: str,
    source: str,
    target: str,
    headers: Headers = (),
    payload: bytes = b"",
    high_priority: bool = False,
) -> tmqp.Frame:
    """A server-made frame without wait flags (acks, responses, markers, events)."""
    return _Frame(
        False,
        high_priority,
        message_type,
        False,
        False,
        DEFAULT_TTL,
        content_type,
        message_id,
        source,
        target,
        headers,
        payload,
    )


def ack(
    content_type: int,
    message_id: str,
    source: str,
    target: str,
    nack_reason: str | None = None,
    reason: str | None = None,
    high_priority: bool = False,
) -> tmqp.Frame:
    """An acknowledge (negative when ``nack_reason`` is given; ``reason`` is for humans)."""
    headers: Headers = ()
    if nack_reason is not None:
        headers = ((Header.NACK_REASON, nack_reason),)
        if reason:
            headers += ((Header.REASON, reason),)
    return control(_ACK, content_type, message_id, source, target, headers, b"", high_priority)


def response(
    message_id: str,
    to: str,
    code: int,
    reason: str | None = None,
    payload: bytes = b"",
    headers: Headers = (),
    source: str = "",
) -> tmqp.Frame:
    """A response to request ``message_id`` for client ``to``; code 0 = success."""
    if code and reason:
        headers = (*headers, (Header.REASON, reason))
    return control(_RESPONSE, code, message_id, source, to, headers, payload)


def pull_marker(
    request_id: str, channel: str, queue_id: int, token: str, reason: str = ""
) -> tmqp.Frame:
    """A ``No-Content`` queue message answering a pull request (``Reason``: why, if given)."""
    headers: Headers = ((Header.REQUEST_ID, request_id), (Header.NO_CONTENT, token))
    if reason:
        headers = (*headers, (Header.REASON, reason))
    return control(_QUEUE, queue_id, "", "", channel, headers)
