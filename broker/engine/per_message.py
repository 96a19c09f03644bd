"""A delivery handler that reads a message's own headers: persistence and expiry per message.

The queue options decide for every message of a queue; some producers (STOMP's
``persistent:true``, ``expires``) decide per message.  :class:`PerMessageDeliveryHandler`
keeps :class:`~broker.engine.delivery.DefaultDeliveryHandler`'s at-least-once rules and
adds two, read from the message's headers (names compared without case):

* ``persistent: true`` -- the message is saved in the engine's store when received (a
  queue without consumer acknowledges then acknowledges its producer once it is saved;
  with acknowledges the consumer's acknowledge is relayed as usual).  Any other value,
  or no header: not saved (as the default handler).
* ``expires: MS`` (milliseconds since the UNIX epoch) -- a message whose time has come
  is not sent: it is dropped when the queue reaches it (its producer, if it still waits,
  gets a negative acknowledge).  A value that is not a non-negative integer is ignored.

Sans-IO: the wall clock (UNIX seconds) is injected; ``now`` is never read here.  Register
it with the engine under :data:`PER_MESSAGE` (``Engine(handlers={PER_MESSAGE: ...})``) and
select it with the queue option ``MessageDeliveryHandler``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from broker.engine.delivery import (
    ALLOW,
    ALLOW_ACK,
    DENY,
    SAVE_ACK,
    Decision,
    DefaultDeliveryHandler,
)

if TYPE_CHECKING:
    from broker.engine.channel import Client
    from broker.engine.message import QueueMessage
    from broker.engine.queue_view import QueueView as Queue

#: The handler's key among the engine's delivery handlers.
PER_MESSAGE = "per-message"
#: Save, acknowledge nobody yet (a queue with consumer acknowledges relays them).
_SAVE = Decision(save=True)


def _header(message: QueueMessage, name: str) -> str | None:
    for key, value in message.message.headers:
        if key.lower() == name:
            return value
    return None


def expires_ms(message: QueueMessage) -> int | None:
    """The message's ``expires`` header (ms since the epoch), None if absent or invalid."""
    value = _header(message, "expires")
    if value is None or not value.isdigit() or len(value) > 20:
        return None
    return int(value)


class PerMessageDeliveryHandler(DefaultDeliveryHandler):
    """Default rules, plus ``persistent`` and ``expires`` read per message."""

    def __init__(self, wall_clock: Callable[[], float]) -> None:
        self.wall_clock = wall_clock  # UNIX seconds
        #: Messages dropped because their ``expires`` time had come.
        self.expired = 0

    def received_from_producer(
        self, queue: Queue, message: QueueMessage, sender: Client | None
    ) -> Decision:
        persistent = (_header(message, "persistent") or "").lower() == "true"
        if queue.options.request_acknowledge:
            return _SAVE if persistent else ALLOW
        return SAVE_ACK if persistent else ALLOW_ACK

    def begin_send(self, queue: Queue, message: QueueMessage) -> Decision:
        deadline = expires_ms(message)
        if deadline is not None and deadline <= self.wall_clock() * 1000:
            self.expired += 1
            return DENY
        return ALLOW
