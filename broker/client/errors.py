"""Errors of the broker clients (one hierarchy under ``ClientError``), and the error an
answer frame from the broker reports."""

from __future__ import annotations

from broker import tmqp
from broker.protocol import CODE_FOR_NACK_REASON, MessageType, ResultCode


class ClientError(Exception):
    """Root of the client's errors."""


class ConnectError(ClientError):
    """The broker refused the session, or could not be reached in time."""


class AccessRefused(ConnectError):
    """The broker refused this client: CURVE handshake failed, or its token (status 401)."""


class ConnectionLost(ClientError):
    """The session ended while a request was outstanding."""


class RequestTimeout(ClientError, TimeoutError):
    """No answer to a request within its timeout (a ``TimeoutError`` too)."""


class ProtocolError(ClientError):
    """The broker answered with something that does not fit the request (wrong type, not JSON)."""


class ClientClosed(ClientError):
    """The client was closed."""


class UnconfirmedSends(ClientError):
    """``close()``: messages this client sent without waiting for an answer (pushes
    without ``ack``, direct messages) may not have reached the broker: its session was
    lost while they were on their way, or the broker did not answer the goodbye (which
    says it read everything) within the linger time.  ``count`` is at most how many
    (a batch of pushes counts once); ``reasons`` says when."""

    def __init__(self, count: int, reasons: list[str]) -> None:
        super().__init__(
            f"up to {count} messages sent without an answer may not have reached the broker: "
            + "; ".join(reasons)
        )
        self.count = count
        self.reasons = reasons


class RemoteError(ClientError):
    """The broker (or a peer) answered with a failure status or a negative acknowledge."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"{reason} (status {code})")
        self.code = code
        self.reason = reason


class StopLoop(Exception):
    """Internal: leave the I/O loop."""


def failure(frame: tmqp.Frame) -> RemoteError | None:
    """The error an ACK/RESPONSE frame reports, or None if it is a success.

    A negative acknowledge carries ``Nack-Reason`` (its content type is a queue id, not
    a status); a failed response carries the status as its content type.
    """
    reason = nack = None
    for key, value in frame.headers:
        low = key.lower()
        if low == "nack-reason":
            nack = value
        elif low == "reason":
            reason = value
    if frame.message_type == MessageType.ACK:
        if nack is None:
            return None
        status = CODE_FOR_NACK_REASON.get(nack, ResultCode.FAILED)
        return RemoteError(int(status), reason or nack)
    code = frame.content_type
    if code == ResultCode.OK:
        return None
    if reason is None:
        known = code in ResultCode._value2member_map_
        reason = ResultCode(code).name.lower().replace("_", " ") if known else "failed"
    return RemoteError(code, reason)
