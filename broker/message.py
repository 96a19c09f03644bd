"""The broker's message model: what the engine, its front doors and the store share.

A :class:`Message` is what a producer published and what a consumer receives, whatever
door it came through (TMQP over ZeroMQ today, STOMP or a federation link next): nothing
in it is specific to one wire protocol.  It is immutable; a change is a new message
(:meth:`Message.replace`).

Zero-copy pass-through: a door may attach the octets it received as the message's
*wire form* (:attr:`Message.wire`: the door's own key and the octets).  When the same
message leaves through the same door unchanged, the door sends those octets instead of
encoding again; any change (:meth:`Message.replace`, the engine's ``derive``) makes a
message without a wire form, and a door ignores a wire form keyed by another door.

A named tuple rather than a frozen dataclass: one is built per message received and per
changed delivery, and a tuple is built several times faster (as ``broker.protocol.Outgoing``).
"""

from __future__ import annotations

from sys import intern as _intern
from typing import Any, NamedTuple

#: Header lines, in order (names compared case-insensitively by the readers).
Headers = tuple[tuple[str, str], ...]
#: A door's cached encoding of a message: (the door's key, the octets).
Wire = tuple[object, bytes]

#: Hops a message may still take (federation links decrement it); TMQP's default.
DEFAULT_TTL = 16


class Message(NamedTuple):
    """One message (see the module docstring)."""

    #: The message's id ('' when the producer gave none and the queue needs none).
    message_id: str = ""
    #: The producing client's id.
    source: str = ""
    #: The channel of a queue message (or the client a message is addressed to).
    target: str = ""
    #: The queue id within the channel.
    content_type: int = 0
    #: Consumed before every message of default priority.
    high_priority: bool = False
    #: Delivered to one consumer only (the first that can take it).
    first_acquirer: bool = False
    #: Its sender waits for an acknowledge (a producer's push; a delivery the consumer
    #: must acknowledge).
    wants_ack: bool = False
    #: Hops the message may still take.
    ttl: int = DEFAULT_TTL
    headers: Headers = ()
    payload: bytes | memoryview = b""
    #: The octets a door received it as, keyed by that door (see the module docstring).
    wire: Wire | None = None

    def replace(self, **changes: Any) -> Message:
        """A copy with ``changes`` and without the wire form (the octets no longer match).

        Use this, never ``_replace`` (which would keep the wire form)."""
        return self._replace(wire=None, **changes)

    def header(self, name: str) -> str | None:
        """The first header called ``name`` (case-insensitive), or None."""
        lname = name.lower()
        for key, value in self.headers:
            if key.lower() == lname:
                return value
        return None


def with_source(m: Message, source: str) -> Message:
    """``m`` stamped with another source (the client that pushed it), no wire form."""
    return _new(
        Message,
        (
            m.message_id,
            source,
            m.target,
            m.content_type,
            m.high_priority,
            m.first_acquirer,
            m.wants_ack,
            m.ttl,
            m.headers,
            m.payload,
            None,
        ),
    )


def derive(
    m: Message,
    wants_ack: bool,
    content_type: int,
    message_id: str,
    source: str,
    target: str,
    headers: Headers,
) -> Message:
    """``m`` with other addressing, id, headers or acknowledge wish; priority, first
    acquirer, TTL and payload kept.  Returns ``m`` itself when nothing differs, so its
    wire form can still be used."""
    if (
        message_id == m.message_id
        and source == m.source
        and content_type == m.content_type
        and wants_ack == m.wants_ack
        and target == m.target
        and headers == m.headers
    ):
        return m
    return _new(
        Message,
        (
            message_id,
            source,
            target,
            content_type,
            m.high_priority,
            m.first_acquirer,
            wants_ack,
            m.ttl,
            headers,
            m.payload,
            None,
        ),
    )


def parked(m: Message) -> Message:
    """The form a message waits in a queue: without its wire form, with its source and
    target the interned (shared) strings.  A received message holds its frame's octets
    beside the decoded fields, and per-message copies of the producer's id and the
    channel's name: ~340 of the ~960 octets a waiting 100-byte message cost.  A message
    sent from the queue later is encoded again (``broker.engine.tmqp_door.encode``)."""
    return _new(
        Message,
        (
            m.message_id,
            _intern(m.source),
            _intern(m.target),
            m.content_type,
            m.high_priority,
            m.first_acquirer,
            m.wants_ack,
            m.ttl,
            m.headers,
            m.payload,
            None,
        ),
    )


#: ``Message(...)`` from a tuple of every field, without the named tuple's Python-level
#: ``__new__`` (the doors build one per message received).
_new = tuple.__new__
