"""Broadcast fan-out wire vocabulary shared by the engine, server and client (no I/O).

The protocol is described in ``broker.engine.fanout``: JOIN header ``Fanout: 2``; the
answer's ``Fanout-Endpoint``, ``Fanout-Token`` (hex), ``Fanout-Ticket`` (hex) and
``Fanout-Seq``; each published message is ONE ZeroMQ frame: the *head* (token, then the
stream sequence number as 8 octets little-endian) followed by the delivery exactly as a
consumer gets it over its DEALER (nothing follows the head in a marker).  A token change
(a member left) reaches the remaining members as a DIRECT frame of content type
:data:`ROTATED` from :data:`SOURCE` with the same headers and ``Channel-Name``.
"""

from __future__ import annotations

import struct

#: JOIN header asking for fan-out (value :data:`VERSION`), and the answer's headers.
FANOUT = "Fanout"
FANOUT_ENDPOINT = "Fanout-Endpoint"
FANOUT_TOKEN = "Fanout-Token"
FANOUT_TICKET = "Fanout-Ticket"
FANOUT_SEQ = "Fanout-Seq"
#: The protocol this module describes: one frame per publish, tickets, token rotation.
#: (Version 1, two frames per publish and no tickets, is answered one by one.)
VERSION = "2"
#: Content type and source of the DIRECT frame telling a member its stream's new token.
ROTATED = 251
SOURCE = "@fanout"
#: Octets of a stream token (the SUB's subscription topic) and of a ticket.
TOKEN_SIZE = 16
#: The sequence number in a head (readers unpack it in place).
SEQ = struct.Struct("<Q")
_SEQ = SEQ
HEAD_SIZE = TOKEN_SIZE + _SEQ.size


def head(token: bytes, seq: int) -> bytes:
    """The start of a published message: the token then the sequence number."""
    return token + _SEQ.pack(seq)


def read_head(data: bytes) -> tuple[bytes, int]:
    """(token, sequence number) of a published message; ValueError when it is not one."""
    if len(data) < HEAD_SIZE:
        raise ValueError("not a fan-out message")
    return data[:TOKEN_SIZE], _SEQ.unpack_from(data, TOKEN_SIZE)[0]
