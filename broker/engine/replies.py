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


def find_answer(
    out: list[Outgoing], start: int, client_id: str, message_type: int, message_id: str
) -> int:
    """Where in ``out[start:]`` the engine answered ``client_id``'s push ``message_id``
    with a frame of ``message_type`` (ACK or RESPONSE); -1: it did not (yet).

    Searched from the end: a push's own answer is the last thing it adds (a refusal, or
    an acknowledge after the deliveries it caused)."""
    frame_class = tmqp.Frame
    for i in range(len(out) - 1, start - 1, -1):
        o = out[i]
        f = o[1]
        if (
            f.__class__ is frame_class
            and f.message_type == message_type
            and f.message_id == message_id
            and o[0] == client_id
        ):
            return i
    return -1


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
