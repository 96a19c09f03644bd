"""What the clients receive: :class:`Message` (a frame with convenient names)."""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from enum import Enum
from itertools import repeat
from typing import Any

from broker import tmqp
from broker.protocol import MessageType


class Kind(Enum):
    QUEUE = "queue"
    DIRECT = "direct"
    EVENT = "event"
    REPLY = "reply"


@dataclass(frozen=True, slots=True)
class Message:
    """A frame received from the broker, with convenient names."""

    frame: tmqp.Frame

    @property
    def kind(self) -> Kind:
        return _KINDS.get(MessageType(self.frame.message_type), Kind.REPLY)

    @property
    def id(self) -> str:
        return self.frame.message_id

    @property
    def channel(self) -> str:
        return self.frame.target

    @property
    def queue_id(self) -> int:
        return self.frame.content_type

    @property
    def content_type(self) -> int:
        return self.frame.content_type

    @property
    def source(self) -> str:
        return self.frame.source

    @property
    def target(self) -> str:
        return self.frame.target

    @property
    def payload(self) -> bytes:
        return self.frame.payload

    @property
    def headers(self) -> tuple[tuple[str, str], ...]:
        return self.frame.headers

    @property
    def needs_ack(self) -> bool:
        return self.frame.pending_ack

    @property
    def needs_response(self) -> bool:
        return self.frame.pending_response

    def header(self, name: str, default: str | None = None) -> str | None:
        wanted = name.lower()
        for key, value in self.frame.headers:
            if key.lower() == wanted:
                return value
        return default

    def json(self) -> Any:
        return json.loads(self.frame.payload) if self.frame.payload else None


def messages_of(frames: list[tmqp.Frame]) -> list[Message]:
    """``[Message(frame) for frame in frames]``, made without Python code per frame
    (``map`` over C functions: the slotted object's ``__new__`` and its slot's setter,
    not the frozen dataclass's ``__init__``): a fan-out run's deliveries in bulk."""
    out = list(map(_new, repeat(Message, len(frames))))
    deque(map(_set_frame, out, frames), maxlen=0)
    return out


_new = object.__new__
_set_frame = vars(Message)["frame"].__set__

_KINDS = {
    MessageType.QUEUE: Kind.QUEUE,
    MessageType.DIRECT: Kind.DIRECT,
    MessageType.EVENT: Kind.EVENT,
}
