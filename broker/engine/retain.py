"""Retained messages: the last message kept for each broadcast channel.

A push carrying ``Retain: set`` (or ``true``) into a queue whose status is Broadcast
is kept as its channel's retained message (replacing the one before: one per channel);
``Retain: remove`` forgets it.  A client that joins the channel afterwards gets the
retained message first, before any live delivery: a TMQP client from the JOIN
(``broker.engine.operations``), a STOMP subscriber from its door
(``broker.stomp.engine_door``) -- one store, so a message retained through one door is
seen by joiners of the other.  ``retain`` is STOMP's header (``retain:set|remove`` on a
``/topic/``), ``Retain`` TMQP's: header names are compared without case.

A push with ``Retain`` into a queue of any other status is refused (406): such a queue
keeps its messages until consumed, and a "last value" beside them has no meaning.  A
value other than set, true or remove is refused (400).

Memory only: the retained messages are not saved, a restart forgets them (as STOMP's
always did).  A channel removed takes its retained message with it.  Sans-IO.
"""

from __future__ import annotations

from broker.engine.errors import OperationError
from broker.engine.options import status_name
from broker.message import Message
from broker.protocol import Header, QueueStatus, ResultCode

#: The header's name in lower case (what ``Engine._push`` compares header names with).
RETAIN_KEY = Header.RETAIN.lower()
#: ``Retain`` values that keep the message, and the one that forgets it.
SET_VALUES = frozenset({"set", "true"})
REMOVE_VALUE = "remove"


def retain_wish(value: str) -> bool:
    """A push's ``Retain`` value: True keep, False forget; OperationError (400) for any
    other value."""
    wish = value.strip().lower()
    if wish in SET_VALUES:
        return True
    if wish == REMOVE_VALUE:
        return False
    raise OperationError(
        ResultCode.BAD_REQUEST, f"Retain must be set or remove, not {value[:40]!r}"
    )


def check_retain_status(status: QueueStatus) -> None:
    """OperationError (406) unless a queue of ``status`` may retain."""
    if status is not QueueStatus.BROADCAST:
        raise OperationError(
            ResultCode.UNACCEPTABLE,
            f"Retain only on a Broadcast queue (this one is {status_name(status)})",
        )


class RetainedMessages:
    """The retained message of each channel (see the module docstring)."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        #: channel name -> its retained message (no wire form, no acknowledge wish)
        self._kept: dict[str, Message] = {}

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, channel: str) -> Message | None:
        return self._kept.get(channel)

    def update(self, channel: str, keep: bool, message: Message, hide_source: bool) -> None:
        """Keep ``message`` as ``channel``'s retained message (``keep``; ``hide_source``:
        without its producer's id, the queue's ``HideClientNames``) or forget it."""
        if not keep:
            self._kept.pop(channel, None)
            return
        payload = message.payload
        self._kept[channel] = message.replace(
            source="" if hide_source else message.source,
            wants_ack=False,
            first_acquirer=False,
            # (a memoryview may be a window on a receive buffer that is reused)
            payload=payload if isinstance(payload, bytes) else bytes(payload),
        )

    def forget(self, channel: str) -> None:
        self._kept.pop(channel, None)
