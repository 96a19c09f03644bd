"""Broadcast fan-out wire vocabulary shared by the engine, server and client (no I/O).

The protocol is described in ``broker.engine.fanout``: JOIN header ``Fanout: 3``; the
answer's ``Fanout-Endpoint``, ``Fanout-Token`` (hex), ``Fanout-Ticket`` (hex) and
``Fanout-Seq``; each published ZeroMQ message is ONE frame carrying a *run* of
consecutive deliveries of one stream (all numbers little-endian, offsets from the start
of the frame)::

    token (16) | seq (8) | count (2) | count x [payload start (4), end (4)] | deliveries

``seq`` is the first delivery's stream number (the i-th, from 0, has seq + i); the
deliveries follow the table back to back, each exactly as a consumer gets it over its
DEALER: delivery i spans from the end of i - 1 (the first: from the table's end) to its
``end``, its payload (the delivery's last field) from ``payload start`` to ``end``, so a
reader takes payloads or deliveries with one unpack of the table and slices.  A *marker*
is ``token | seq`` alone (the last number sent).  A run holds at most :data:`RUN_MAX`
deliveries and about :data:`RUN_OCTETS` octets.  A token change (a member left) reaches
the remaining members as a DIRECT frame of content type :data:`ROTATED` from
:data:`SOURCE` with the same headers and ``Channel-Name``.
"""

from __future__ import annotations

import struct

from zproto.runtime import dec_varlen

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
#: A run's delivery count (after the head) and one table row (payload start, end).
COUNT = struct.Struct("<H")
ROW = struct.Struct("<II")
#: Octets before a run's table.
TABLE_AT = HEAD_SIZE + COUNT.size
#: Deliveries one published message carries at most (the broker sends a run when it ends
#: a drain of its socket, so a run is what it had in hand: no delivery waits for one).
RUN_MAX = 256
#: Octets of deliveries after which the broker sends a run (one delivery may pass it).
RUN_OCTETS = 64 * 1024
#: Where a delivery's payload length is (its octet 7; above 252: the long form).
_PAYLOAD_LENGTH_AT = 7
_SHORTEST = 8


def head(token: bytes, seq: int) -> bytes:
    """The start of a published message: the token then the sequence number."""
    return token + _SEQ.pack(seq)


def read_head(data: bytes) -> tuple[bytes, int]:
    """(token, sequence number) of a published message; ValueError when it is not one."""
    if len(data) < HEAD_SIZE:
        raise ValueError("not a fan-out message")
    return data[:TOKEN_SIZE], _SEQ.unpack_from(data, TOKEN_SIZE)[0]


def payload_length(delivery: bytes, at: int = 0) -> int:
    """The payload length of the delivery starting at ``at`` in ``delivery`` (its last
    field: octet 7, or the long form above 252); ValueError when it cannot be one."""
    if len(delivery) - at < _SHORTEST:
        raise ValueError("too short for a delivery")
    length = delivery[at + _PAYLOAD_LENGTH_AT]
    if length > 252:
        length = dec_varlen(delivery, at + _PAYLOAD_LENGTH_AT, "little")[0]
    return int(length)


def pack_run(head: bytes, deliveries: list[bytes], payloads: list[int]) -> bytes:
    """A run: ``head`` (its first delivery's), the table, the deliveries (``payloads``:
    each delivery's payload length)."""
    count = len(deliveries)
    rows: list[int] = []
    at = TABLE_AT + ROW.size * count
    for delivery, length in zip(deliveries, payloads, strict=True):
        at += len(delivery)
        rows += (at - length, at)
    return b"".join((head, COUNT.pack(count), table(count).pack(*rows), *deliveries))


def table(count: int) -> struct.Struct:
    """The layout of a table of ``count`` rows (payload start, end); kept for counts up to
    ``RUN_MAX`` only (a run claiming more is not cached: a peer cannot grow the cache)."""
    found = TABLES.get(count)
    if found is None:
        found = struct.Struct(f"<{2 * count}I")
        if count <= RUN_MAX:
            TABLES[count] = found
    return found


#: Table layouts by row count, 1 to ``RUN_MAX`` (readers look a count up here: an
#: absent one is not a run this broker sends, and goes the checked way).
TABLES: dict[int, struct.Struct] = {}
for _count in range(1, RUN_MAX + 1):
    table(_count)


def read_run(data: bytes) -> list[tuple[bytes, bytes]]:
    """(delivery, payload) of each delivery of a run, in order, checked: ValueError at
    the first that its table or the frame's size contradicts (the readers on the hot
    path inline a faster form of this)."""
    if len(data) < TABLE_AT:
        raise ValueError("not a run")
    count = COUNT.unpack_from(data, HEAD_SIZE)[0]
    at = TABLE_AT + ROW.size * count
    if count == 0 or len(data) < at:
        raise ValueError("a run's table is cut")
    rows = table(count).unpack_from(data, TABLE_AT)
    out: list[tuple[bytes, bytes]] = []
    for i in range(count):
        start, end = rows[2 * i], rows[2 * i + 1]
        if not at <= start <= end <= len(data):
            raise ValueError(f"delivery {i} of a run is out of its frame")
        out.append((data[at:end], data[start:end]))
        at = end
    return out
