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

from typing import NamedTuple

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
#: Options octet: waits for a response (0x80) or an acknowledge (0x40), has headers (0x20).
_WAITS = 0xE0


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


# -- pushes carried as their octets (``broker.engine.octets_run``) ----------------------

#: Octets before the message id in a QUEUE frame's simplest shape: the flags and options
#: octets, the three string lengths (id, source, target), the content type (2), the
#: payload's one-octet length (``tmqp.xml``; ``tmqp.decode_message_records`` reads it so).
HEAD = 8
#: The largest one-octet payload length; 253 says a two-octet length follows.
SHORT_PAYLOAD = 252


class PushShape(NamedTuple):
    """What every push of a producer's run shares with its first, as octets: a push whose
    octets match it carries the first's flags, source, target and content type, and
    differs only in its id and payload (``octets_run``).  Made by :func:`shape_of`."""

    #: The flags octet and the options octet (type, priority, acquirer, TTL, waits).
    flags: int
    options: int
    #: The source and target lengths and the content type (octets 3-6).
    fixed: bytes
    #: The source's and the target's octets, one after the other.
    names: bytes


def shape_of(data: bytes) -> tuple[Message, PushShape] | None:
    """The message of a plain push's octets and the shape of the pushes like it; None when
    ``data`` is not a push in the simplest shape (no headers, a one-octet payload length)
    that decodes, or waits for an acknowledge or a response, or asks for a first
    acquirer."""
    if len(data) <= HEAD or data[7] > SHORT_PAYLOAD:
        return None
    ms, bad = tmqp.decode_message_records((data,), Message, WIRE)
    if bad or not ms:
        return None
    m = ms[0]
    if m.headers or m.wants_ack or m.first_acquirer or data[1] & _WAITS:
        return None
    names_at = HEAD + data[2]
    names_end = names_at + data[3] + data[4]
    return m, PushShape(data[0], data[1], data[3:7], data[names_at:names_end])


def message_of_octets(data: bytes) -> Message:
    """The message of a push carried as its octets (``octets_run``: it decoded once, as
    its run's first did); for a delivery that must go back to its queue."""
    ms, bad = tmqp.decode_message_records((data,), Message, WIRE)
    if bad:
        raise ValueError("not the octets of a push")  # (never: the run's check passed it)
    return ms[0]
