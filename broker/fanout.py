"""Broadcast fan-out wire vocabulary shared by the engine, server and client (no I/O).

The protocol is described in ``broker.engine.fanout``: JOIN header ``Fanout: 3``; the
answer's ``Fanout-Endpoint``, ``Fanout-Token`` (hex), ``Fanout-Ticket`` (hex) and
``Fanout-Seq``; each published ZeroMQ message is ONE frame: the *head* (token, then the
stream sequence number of its first delivery as 8 octets little-endian) followed by a
*run* of consecutive deliveries of that stream, each an *entry*: 4 octets little-endian
length, then the delivery exactly as a consumer gets it over its DEALER (the entry form
of ``broker.batch``); the n-th entry (from 0) has number head + n.  Nothing follows the
head in a marker.  A run holds at most :data:`RUN_MAX` entries and about
:data:`RUN_OCTETS` octets.  A token change (a member left) reaches the remaining members
as a DIRECT frame of content type :data:`ROTATED` from :data:`SOURCE` with the same
headers and ``Channel-Name``.
"""

from __future__ import annotations

import struct

#: JOIN header asking for fan-out (value :data:`VERSION`), and the answer's headers.
FANOUT = "Fanout"
FANOUT_ENDPOINT = "Fanout-Endpoint"
FANOUT_TOKEN = "Fanout-Token"
FANOUT_TICKET = "Fanout-Ticket"
FANOUT_SEQ = "Fanout-Seq"
#: The protocol this module describes: runs of deliveries per publish, tickets, token
#: rotation.  (Versions 1, two frames per publish and no tickets, and 2, one delivery
#: per publish, are answered one by one: a stream has one wire form for all its SUBs.)
VERSION = "3"
#: Content type and source of the DIRECT frame telling a member its stream's new token.
ROTATED = 251
SOURCE = "@fanout"
#: Octets of a stream token (the SUB's subscription topic) and of a ticket.
TOKEN_SIZE = 16
#: The sequence number in a head (readers unpack it in place).
SEQ = struct.Struct("<Q")
_SEQ = SEQ
HEAD_SIZE = TOKEN_SIZE + _SEQ.size
#: An entry's length prefix (4 octets little-endian, as ``broker.batch``).
ENTRY = struct.Struct("<I")
ENTRY_SIZE = ENTRY.size
#: Entries one published message carries at most (the broker sends a run when it ends
#: a drain of its socket, so a run is what it had in hand: no delivery waits for one).
RUN_MAX = 256
#: Octets of entries after which the broker sends a run (one entry may pass it).
RUN_OCTETS = 64 * 1024


def head(token: bytes, seq: int) -> bytes:
    """The start of a published message: the token then the sequence number."""
    return token + _SEQ.pack(seq)


def read_head(data: bytes) -> tuple[bytes, int]:
    """(token, sequence number) of a published message; ValueError when it is not one."""
    if len(data) < HEAD_SIZE:
        raise ValueError("not a fan-out message")
    return data[:TOKEN_SIZE], _SEQ.unpack_from(data, TOKEN_SIZE)[0]


def entry(delivery: bytes) -> bytes:
    """A delivery's length prefix (its entry is the prefix, then the delivery)."""
    return ENTRY.pack(len(delivery))


def read_run(data: bytes) -> list[bytes]:
    """The deliveries of a published message after its head, in order; ValueError when
    its entries do not fill it exactly (the readers on the hot path inline this)."""
    out: list[bytes] = []
    size = len(data)
    pos = HEAD_SIZE
    while pos < size:
        if pos + ENTRY_SIZE > size:
            raise ValueError("a fan-out entry's length is cut")
        end = pos + ENTRY_SIZE + ENTRY.unpack_from(data, pos)[0]
        if end > size:
            raise ValueError("a fan-out entry runs past the message")
        out.append(data[pos + ENTRY_SIZE : end])
        pos = end
    return out
