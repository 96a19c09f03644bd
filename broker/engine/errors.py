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


class RunFailed(EngineError):
    """A push of a run of plain pushes raised (``Queue.push_plain_run``,
    ``broadcast_run.publish_plain_run``).

    The pushes before it were taken and counted as if the run had ended there; nothing
    of the failed push left the broker (no delivery, no place in the queue, no number)
    and its id and those of the pushes after it are forgotten, so a resend of any of
    them is taken, not answered as a duplicate.  ``done``: how many pushes of the run are
    finished (those taken and the failed one); the caller goes on after them, as the
    one-by-one path goes on after a push that raised alone; ``cause``: what it raised.
    """

    def __init__(self, done: int, cause: Exception) -> None:
        super().__init__(ResultCode.FAILED, "internal error")
        self.done = done
        self.cause = cause


class PatternError(EngineError):
    """A channel-name pattern that cannot be used (``broker.engine.patterns``): bad
    syntax, too long, or a ``{regex}`` whose matching cost is not bounded."""

    def __init__(self, reason: str) -> None:
        super().__init__(ResultCode.BAD_REQUEST, reason)
