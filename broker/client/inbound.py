"""Frames from the broker, as the client's I/O loop dispatches them.

Queue and direct messages go to the ``on_message`` callback or the inbox; pull answers
are collected for their request; ACK and RESPONSE frames settle the pending request of
their message id (the first one completes the handshake); events go to their callbacks
or the inbox; TERMINATE ends the session (a refusal during the handshake is final when
its status says so); PING gets a PONG.  ``InboundFrames`` is the base class of
``broker.client_io.IOLoop``, which provides the session methods it calls.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from broker import tmqp
from broker.client.core import SessionState
from broker.client.errors import AccessRefused, ConnectError, RemoteError, failure
from broker.client.message import Message, _Pull
from broker.protocol import (
    CODE_FOR_NACK_REASON,
    EVENT_NAMES,
    Header,
    MessageType,
    NoContent,
    ResultCode,
    header,
)
from zproto.errors import DecodeError

if TYPE_CHECKING:
    from broker.client.blocking import Client
    from broker.client.errors import StopLoop

log = logging.getLogger("broker.client.blocking")

_PONG = tmqp.encode(tmqp.Pong())[0]
_PERMANENT = {ResultCode.UNAUTHORIZED, ResultCode.UNACCEPTABLE, ResultCode.BAD_REQUEST}
_QUEUE = MessageType.QUEUE
_ACK = MessageType.ACK
_RESPONSE = MessageType.RESPONSE
_DIRECT = MessageType.DIRECT
_decode = tmqp.decode


class InboundFrames:
    """Dispatch of inbound frames (see the module docstring)."""

    if TYPE_CHECKING:
        # provided by broker.client_io.IOLoop
        c: Client
        hs_id: str
        first: bool

        def _send_now(self, data: bytes) -> None: ...
        def _ready(self, frame: tmqp.Frame) -> None: ...
        def _lost(self, reason: str) -> None: ...
        def _fatal(self, err: Exception) -> StopLoop: ...

    def _dispatch(self, data: bytes) -> None:
        try:
            msg = _decode((data,))
        except DecodeError as exc:
            log.warning("undecodable frame from the broker: %s", exc.reason)
            return
        if type(msg) is not tmqp.Frame:
            if type(msg) is tmqp.Ping:
                self._send_now(_PONG)
            return
        mt = msg.message_type
        c = self.c
        if mt == _QUEUE:
            if msg.headers and self._pulled(msg):
                return
            self._deliver(msg)
        elif mt in (_ACK, _RESPONSE):
            self._settle(msg)
        elif mt == _DIRECT:
            self._deliver(msg)
        elif mt == MessageType.EVENT:
            self._event(msg)
        elif mt == MessageType.TERMINATE:
            self._terminated(msg)
        elif mt == MessageType.PING:
            self._send_now(_PONG)
        elif mt != MessageType.PONG:
            log.debug("ignored frame type %#x from the broker", mt)
        del c

    def _deliver(self, frame: tmqp.Frame) -> None:
        c = self.c
        message = Message(frame)
        callback = c._on_message
        if callback is not None:
            try:
                callback(message)
            except Exception:
                log.exception("on_message callback failed")
            return
        c._inbox.append(message)
        if c._in_waiting:
            with c._in_cv:
                c._in_cv.notify()

    def _settle(self, frame: tmqp.Frame) -> None:
        c = self.c
        mid = frame.message_id
        if c._state is SessionState.HANDSHAKE and mid == self.hs_id:
            err = failure(frame)
            if err is None:
                self._ready(frame)
            else:
                self._refused(err.code, err.reason)
            return
        entry = c._pending.pop(mid, None)
        if entry is None:
            err = failure(frame)
            if err is not None:
                log.warning("broker reported for %r: %s", mid, err)
            return
        future, _deadline, extra = entry
        if future.done():
            return
        err = failure(frame)
        if err is not None:
            future.set_exception(err)
        elif isinstance(extra, _Pull):
            future.set_result([Message(frame)])  # a cache queue answers with a response
        else:
            future.set_result(frame)

    def _pulled(self, frame: tmqp.Frame) -> bool:
        """Route a message answering a pull request; False if it is an ordinary delivery."""
        request = header(frame, Header.REQUEST_ID)
        if request is None:
            return False
        c = self.c
        entry = c._pending.get(request)
        no_content = header(frame, Header.NO_CONTENT)
        if entry is None or not isinstance(entry[2], _Pull):
            return no_content is not None  # a late End marker; real messages are delivered
        pull: _Pull = entry[2]
        if no_content is None:
            pull.messages.append(Message(frame))
            index, count = header(frame, Header.INDEX), header(frame, Header.COUNT)
            if index is None or index != count:
                return True
        elif no_content not in (NoContent.END, NoContent.EMPTY):
            c._pending.pop(request, None)
            code = CODE_FOR_NACK_REASON.get(no_content.lower(), ResultCode.NOT_FOUND)
            if no_content == NoContent.UNAUTHORIZED:
                code = ResultCode.UNAUTHORIZED
            if not pull.future.done():
                reason = header(frame, Header.REASON) or no_content
                pull.future.set_exception(RemoteError(int(code), reason))
            return True
        c._pending.pop(request, None)
        if not pull.future.done():
            pull.future.set_result(pull.messages)
        return True

    def _event(self, frame: tmqp.Frame) -> None:
        c = self.c
        name: str = frame.target if frame.target in EVENT_NAMES else frame.source
        channel = header(frame, Header.CHANNEL_NAME)
        queue = header(frame, Header.QUEUE_ID)
        message = Message(frame)
        handled = False
        for event, want_channel, want_queue, callback in list(c._event_handlers):
            if event != name:
                continue
            if want_channel is not None and channel is not None and want_channel != channel:
                continue
            if want_queue is not None and queue is not None and str(want_queue) != queue:
                continue
            handled = True
            try:
                callback(message)
            except Exception:
                log.exception("event callback failed")
        if not handled:
            c._inbox.append(message)
            if c._in_waiting:
                with c._in_cv:
                    c._in_cv.notify()

    def _terminated(self, frame: tmqp.Frame) -> None:
        code = frame.content_type
        reason = header(frame, Header.REASON) or "no reason given"
        if self.c._state is SessionState.HANDSHAKE:
            self._refused(code, reason)
        else:
            self._lost(f"the broker ended the session: {reason} (status {code})")

    def _refused(self, code: int, reason: str) -> None:
        """The broker turned down the connection info.

        A client id in use by another session (481) is final for the first connect; a
        reconnect keeps trying (the session holding the id may still end).
        """
        if code in _PERMANENT or (code == ResultCode.ALREADY_CREATED and self.first):
            kind = AccessRefused if code == ResultCode.UNAUTHORIZED else ConnectError
            err = kind(f"the broker refused the connection: {reason} (status {code})")
            raise self._fatal(err)
        self._lost(f"connection refused for now: {reason} (status {code})")
