"""Error hierarchy of the zproto package.

``ZprotoError`` is the root.  Three branches:

* ``ModelError``: a protocol model (XML) is invalid; raised by the loader and the
  generator, never by generated code.
* ``EncodeError``: *we* misused a codec (a string too long for its length prefix,
  a number out of range, a wrong type).  A local error, like h11's
  ``LocalProtocolError``.
* ``DecodeError``: *the peer* sent bytes that are not a valid message (bad
  signature, unknown id, truncated, length beyond the buffer, wrong constant,
  trailing garbage).  A remote error, like h11's ``RemoteProtocolError``.  It is
  the only exception a generated ``decode()`` ever raises.
"""

from __future__ import annotations


class ZprotoError(Exception):
    """Root of every error raised by zproto and by generated codecs."""


class ModelError(ZprotoError):
    """The XML protocol model is invalid (names the file and the element)."""


class EncodeError(ZprotoError, ValueError):
    """A message could not be encoded: the caller built an invalid message."""


class DecodeError(ZprotoError):
    """Bytes received from a peer are not a valid message.

    ``signature_ok`` tells the caller whether the bytes at least carried the
    protocol signature: protocols such as FILEMQ drop signature-less messages
    silently but answer other malformed commands (with RTFM).
    ``message_id`` is the id byte when it could be read, else ``None``.
    """

    def __init__(
        self, reason: str, *, signature_ok: bool = True, message_id: int | None = None
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.signature_ok = signature_ok
        self.message_id = message_id
