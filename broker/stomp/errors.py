"""Error hierarchy of the STOMP front door.

``StompError`` is the root.  Branches:

* ``FrameError``: *the peer* sent bytes that are not a valid STOMP frame (the only
  exception :meth:`broker.stomp.frames.FrameParser.feed` raises).  ``LimitExceeded``
  is the sub-case where a configured limit (header length, header count, body size)
  was crossed; nothing beyond the limit was buffered.
* ``ProtocolViolation``: a well-formed frame broke a session rule (SUBSCRIBE without
  ``id`` on 1.1+, an unknown transaction, a bad destination, a bad option value...).
  ``DestinationError`` is the sub-case of a destination header that cannot be used;
  ``VersionMismatch`` the case of a CONNECT offering no version we speak.
* ``EncodeError``: *we* asked the serializer for a frame the negotiated version
  cannot represent (a local error).
* ``BackendError``: the backend refused an operation (unknown durable subscription,
  access to another connection's temporary destination...).
* ``VirtualHostError``: a configured list of virtual hosts that cannot be used (a local
  error: the operator's config, reported as one line; ``broker.stomp.vhosts``).

Every remote error becomes an ``ERROR`` frame carrying ``str(error)`` as ``message``,
then the connection is closed after the configured delay.
"""

from __future__ import annotations


class StompError(Exception):
    """Root of every error raised by ``broker.stomp``."""


class FrameError(StompError):
    """Bytes received from a peer are not a valid STOMP frame."""


class LimitExceeded(FrameError):
    """A frame crossed a configured limit; ``limit`` names it (``max_headers``...)."""

    def __init__(self, limit: str, detail: str) -> None:
        super().__init__(f"{limit} exceeded: {detail}")
        self.limit = limit


class ProtocolViolation(StompError):
    """A valid frame that breaks a rule of the STOMP session."""


class VersionMismatch(ProtocolViolation):
    """CONNECT offered no version we speak (the ERROR lists ours in ``version``)."""


class DestinationError(ProtocolViolation):
    """A ``destination`` (or ``reply-to``) header that cannot be used."""


class EncodeError(StompError, ValueError):
    """A frame cannot be represented in the requested protocol version."""


class BackendError(StompError):
    """The backend refused an operation; the message is sent to the client."""


class VirtualHostError(StompError, ValueError):
    """A configured list of virtual hosts that cannot be used (``broker.stomp.vhosts``)."""
