"""Answers the engine sends on its own: operation replies and failure notices.

Pure functions of the request frame (they append to the output list they are given).
"""

from __future__ import annotations

from typing import Any

from broker import tmqp
from broker.engine import frames
from broker.engine.channel import Client
from broker.engine.errors import OperationError
from broker.message import Message
from broker.protocol import Outgoing, ResultCode


def is_answer(item: Outgoing, client_id: str, message_type: int, message_id: str) -> bool:
    """Is ``item`` the engine's answer (a frame of ``message_type``: ACK or RESPONSE) to
    push ``message_id`` of ``client_id``?  (How a caller that batches pushes finds, in
    their output, the answers it gives in its own way.)"""
    f = item[1]
    return (
        f.__class__ is tmqp.Frame
        and f.message_type == message_type
        and f.message_id == message_id
        and item[0] == client_id
    )


def ack_frame(
    frame: tmqp.Frame, code: int, err: OperationError | None, high: bool = False
) -> tmqp.Frame:
    """An ACK of ``frame`` carrying ``code`` (and the failure's token and reason)."""
    token, reason = (err.token, err.reason) if err is not None else (None, None)
    return frames.ack(code, frame.message_id, "", frame.target, token, reason, high)


def reply(
    client: Client[Any],
    frame: tmqp.Frame,
    out: list[Outgoing],
    *,
    response: bool,
    payload: bytes = b"",
    error: OperationError | None = None,
    headers: tuple[tuple[str, str], ...] = (),
) -> None:
    """Answer a server operation: ACK (or RESPONSE when asked/for lists), code inside."""
    code = error.code if error is not None else ResultCode.OK
    if response or (frame.pending_response and not frame.pending_ack):
        reason = error.reason if error is not None else None
        out.append(
            Outgoing(
                client.id,
                frames.response(frame.message_id, client.id, code, reason, payload, headers),
            )
        )
    else:
        out.append(Outgoing(client.id, ack_frame(frame, code, error)))


def answer_failure(
    client: Client[Any],
    frame: tmqp.Frame,
    out: list[Outgoing],
    err: OperationError,
    direct: bool = False,
) -> None:
    """Tell a waiting sender why its message went nowhere (silence if it waits for none)."""
    if frame.pending_response:
        out.append(
            Outgoing(client.id, frames.response(frame.message_id, client.id, err.code, err.reason))
        )
    elif frame.pending_ack:
        out.append(Outgoing(client.id, ack_frame(frame, err.code, err, high=direct)))


def answer_done(
    client: Client[Any], message: Message, wants_response: bool, out: list[Outgoing]
) -> None:
    """A push taken before (a resend): answered as done, as a push taken now would be."""
    if message.wants_ack:
        qid, mid, target = message.content_type, message.message_id, message.target
        out.append(Outgoing(client.id, frames.ack(qid, mid, "", target)))
    elif wants_response:
        out.append(Outgoing(client.id, frames.response(message.message_id, client.id, 0)))


def reject_push(
    client: Client[Any],
    message: Message,
    wants_response: bool,
    out: list[Outgoing],
    err: OperationError,
) -> None:
    """A refused push: a negative ACK (queue id, channel) when the producer waits for an
    acknowledge, else a RESPONSE with the code when it waits for a response."""
    if message.wants_ack:
        qid, mid, target = message.content_type, message.message_id, message.target
        out.append(Outgoing(client.id, frames.ack(qid, mid, "", target, err.token, err.reason)))
    elif wants_response:
        response = frames.response(message.message_id, client.id, err.code, err.reason)
        out.append(Outgoing(client.id, response))
