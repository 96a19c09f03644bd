"""The TMQP side of the message model: frames to :class:`~broker.message.Message` and back.

The engine's core (queues, delivery handlers, routers, the store) works with
:class:`~broker.message.Message`; TMQP frames exist only at the TMQP door: the server
decodes a frame, :meth:`broker.engine.Engine.receive` turns a queue frame into a message
(:func:`message_of`) and every queue delivery leaves the engine as a message, which the
server encodes (:func:`encode`) as a QUEUE frame.

A message made from a received QUEUE frame carries the received octets as its wire form
(keyed :data:`WIRE`), when the frame is exactly what the message would be encoded as
(a QUEUE frame, no response awaited): a delivery of that message unchanged is sent as
those octets.  Any change to the message drops the wire form (``broker.message``).
"""

from __future__ import annotations

from broker import tmqp
from broker.message import Message
from broker.protocol import MessageType


class _DoorKey:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<door {self.name}>"


#: The key of TMQP wire forms (a door trusts only its own: compared by identity).
WIRE = _DoorKey("tmqp")

_QUEUE = int(MessageType.QUEUE)
_Frame = tmqp.Frame
_encode_frame = tmqp.encode_frame
_new = tuple.__new__


def message_of(frame: tmqp.Frame, data: bytes | None = None) -> Message:
    """The message a frame carries; ``data``: the octets it was decoded from, if known."""
    wire = None
    if data is not None and frame.message_type == _QUEUE and not frame.pending_response:
        wire = (WIRE, data)
    return _new(
        Message,
        (
            frame.message_id,
            frame.source,
            frame.target,
            frame.content_type,
            frame.high_priority,
            frame.first_acquirer,
            frame.pending_ack,
            frame.ttl,
            frame.headers,
            frame.payload,
            wire,
        ),
    )


def frame_of(m: Message, message_type: int = _QUEUE) -> tmqp.Frame:
    """The frame a message is sent as (a QUEUE frame unless told otherwise)."""
    payload = m.payload
    return _Frame(
        m.first_acquirer,
        m.high_priority,
        message_type,
        False,
        m.wants_ack,
        m.ttl,
        m.content_type,
        m.message_id,
        m.source,
        m.target,
        m.headers,
        payload if type(payload) is bytes else bytes(payload),
    )


def encode(m: Message) -> bytes:
    """The octets of ``m`` as a QUEUE frame: the received ones when it is unchanged."""
    wire = m.wire
    if wire is not None and wire[0] is WIRE:
        return wire[1]
    payload = m.payload
    return _encode_frame(  # (frame_of's frame, without building it)
        m.first_acquirer,
        m.high_priority,
        _QUEUE,
        False,
        m.wants_ack,
        m.ttl,
        m.content_type,
        m.message_id,
        m.source,
        m.target,
        m.headers,
        payload if type(payload) is bytes else bytes(payload),
    )[0]
