"""Broadcast fan-out wire vocabulary shared by the engine, server and client (no I/O).

The protocol is described in ``broker.engine.fanout``: JOIN header ``Fanout: 1``; the
answer's ``Fanout-Endpoint``, ``Fanout-Token`` (hex) and ``Fanout-Seq``; each published
message is two frames, the *head* (token, then the stream sequence number as 8 octets
little-endian) and the delivery (empty for a marker).
"""

from __future__ import annotations

import struct

#: JOIN header asking for fan-out, and the answer's headers.
FANOUT = "Fanout"
FANOUT_ENDPOINT = "Fanout-Endpoint"
FANOUT_TOKEN = "Fanout-Token"
FANOUT_SEQ = "Fanout-Seq"
#: Octets of a stream token (the SUB's subscription topic).
TOKEN_SIZE = 16
#: The sequence number in a head frame (readers unpack it in place).
SEQ = struct.Struct("<Q")
_SEQ = SEQ
HEAD_SIZE = TOKEN_SIZE + _SEQ.size


def head(token: bytes, seq: int) -> bytes:
    """The first frame of a published message: the token then the sequence number."""
    return token + _SEQ.pack(seq)


def read_head(data: bytes) -> tuple[bytes, int]:
    """(token, sequence number) of a head frame; ValueError when it is not one."""
    if len(data) != HEAD_SIZE:
        raise ValueError("not a fan-out head frame")
    return data[:TOKEN_SIZE], _SEQ.unpack_from(data, TOKEN_SIZE)[0]
