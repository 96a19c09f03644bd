"""Receiving for ``broker.Client``: the inbox, ``receive``/``consume``, event subscriptions.

Queue messages, direct messages and (callback-less) events go to an inbox read by
``consume()``/``receive()``, or to an ``on_message`` callback that runs on the I/O
thread.  A full inbox pauses reading (ZeroMQ pushes back) until it drains to half.
Event subscriptions are remembered so that the I/O loop can renew them after a
reconnect.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import zmq

from broker import tmqp
from broker.client.core import ClientCore, SessionState
from broker.client.errors import ClientClosed
from broker.client.message import Message
from broker.protocol import Header, MessageType


class ClientInbox(ClientCore):
    """Receiving and events (see the module docstring)."""

    # -- receiving ---------------------------------------------------------------------

    def on_message(self, callback: Callable[[Message], Any] | None) -> None:
        """Deliver queue and direct messages to ``callback`` on the I/O thread instead."""
        self._on_message = callback

    def receive(self, timeout: float | None = None) -> Message | None:
        """Next queue/direct/event message, or None after ``timeout`` seconds."""
        inbox = self._inbox
        if not inbox:
            deadline = None if timeout is None else time.monotonic() + timeout
            if self._loop is not None:
                if not self._pump(lambda: bool(inbox), deadline):
                    return None
            elif not self._await_inbox(deadline):
                return None
        msg = inbox.popleft()
        if self._rx_paused and len(inbox) <= self.max_inbox // 2:
            self._resume()
        return msg

    def _await_inbox(self, deadline: float | None) -> bool:
        inbox = self._inbox
        with self._in_cv:
            self._in_waiting += 1
            try:
                while not inbox:
                    if self._state is SessionState.CLOSED:
                        raise self._error or ClientClosed("client is closed")
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._in_cv.wait(left if left is not None else 1.0)
            finally:
                self._in_waiting -= 1
        return True

    def consume(self, timeout: float | None = None) -> Iterator[Message]:
        """Iterate over received messages; stops after ``timeout`` seconds without one."""
        inbox = self._inbox
        while True:
            if inbox and not self._rx_paused:
                yield inbox.popleft()
                continue
            msg = self.receive(timeout)
            if msg is None:
                return
            yield msg

    def _resume(self) -> None:
        """The inbox drained: let the I/O loop read again."""
        if self._loop is not None:
            self._rx_paused = False
            return
        with self._cv:
            tx = self._wake_tx
            if tx is not None and not self._woken:
                self._woken = True
                with contextlib.suppress(zmq.Again):
                    tx.send(b"", zmq.NOBLOCK)

    # -- events ------------------------------------------------------------------------

    def subscribe(
        self,
        event: str,
        callback: Callable[[Message], Any] | None = None,
        *,
        channel: str | None = None,
        queue_id: int | None = None,
        timeout: float | None = None,
    ) -> None:
        """Subscribe to a server event; notifications go to ``callback`` or the inbox."""
        self._call(self._event_frame(event, True, channel, queue_id), timeout)
        self._subscriptions[(event, channel, queue_id)] = None
        if callback is not None:
            self._event_handlers.append((event, channel, queue_id, callback))

    def unsubscribe(
        self,
        event: str,
        *,
        channel: str | None = None,
        queue_id: int | None = None,
        timeout: float | None = None,
    ) -> None:
        self._subscriptions.pop((event, channel, queue_id), None)
        self._event_handlers = [
            h for h in self._event_handlers if (h[0], h[1], h[2]) != (event, channel, queue_id)
        ]
        self._call(self._event_frame(event, False, channel, queue_id), timeout)

    def _event_frame(
        self, event: str, on: bool, channel: str | None, queue_id: int | None
    ) -> tmqp.Frame:
        headers: list[tuple[str, str]] = []
        if channel is not None:
            headers.append((Header.CHANNEL_NAME, channel))
        if queue_id is not None:
            headers.append((Header.QUEUE_ID, str(queue_id)))
        return tmqp.Frame(
            message_type=MessageType.EVENT,
            pending_ack=True,
            content_type=1 if on else 0,
            message_id=self.new_id(),
            target=event,
            headers=tuple(headers),
        )
