"""Errors of the broker engine (the wire has its own: ``ServerError``, ``ClientError``)."""

from __future__ import annotations

from broker.protocol import NACK_REASON_FOR_CODE, NackReason, ResultCode


class EngineError(Exception):
    """Base of the engine's errors; ``code`` is the TMQP result code to report."""

    def __init__(self, code: ResultCode, reason: str) -> None:
        super().__init__(f"{code.name}: {reason}")
        self.code = code
        self.reason = reason


class ClientRejected(EngineError):
    """``Engine.connect`` refused the client (401 token, 481 id in use, 400 bad id)."""


class OperationError(EngineError):
    """An operation failed; the engine turns it into a negative ack or an error response.

    ``token`` is the ``Nack-Reason`` value used when the answer is an acknowledge.
    """

    def __init__(self, code: ResultCode, reason: str, token: str | None = None) -> None:
        super().__init__(code, reason)
        self.token = token or NACK_REASON_FOR_CODE.get(code, NackReason.FAILED)
