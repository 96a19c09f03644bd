"""Several TMQP frames in one ZeroMQ message (zerohub, TMQP server operations 260-261).

One Python call per frame is what a message costs the broker (issue 15): a batch lets a
producer push N messages, a consumer acknowledge N deliveries and the broker deliver N
messages to a consumer in one ZeroMQ message each.  Sans-IO: octets in, octets out.

Wire form: a TMQP frame whose payload is the entries, each a 4-octet little-endian
length followed by that many octets of one whole TMQP frame::

    [len 4 LE][frame] [len 4 LE][frame] ...

* **Batch** (client -> broker): a server operation (message type 0x10), content type
  :data:`BATCH` (260); its entries are QUEUE frames (pushes, no response awaited) and
  ACK frames (a consumer's acknowledges).  With the pending-ack flag the broker answers
  with ONE acknowledge: an ACK frame, content type 260, the batch's message id, empty
  payload when every push was taken, else JSON ``{"Refused": [[index, nack reason,
  reason], ...]}`` (0-based entry indexes; an entry that is not a readable frame is
  refused with ``bad-request`` and the rest are taken).  A batch whose entries cannot
  be split, or with more than the broker's ``max_batch_frames`` entries (announced as the
  ``Batch-Max`` header of the connect response; default :data:`DEFAULT_MAX_FRAMES`), is
  refused whole (RESPONSE 400 / 482, nothing taken).  Its size is bounded by the
  broker's ``max_frame_size`` like any frame.
* **Deliveries** (broker -> client): a server operation frame, content type
  :data:`DELIVERIES` (261), entries QUEUE frames; sent only to a client whose
  connection info has the property ``Batch-Deliveries: N`` (N > 1: at most N entries per
  message), so a client that does not know batches never gets one.

A client uses batches only with a broker that announced ``Batch-Max``; a broker without
batches never sees one.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Sequence

from broker import tmqp
from broker.protocol import MessageType

#: Content type of a batch (client -> broker) and of the broker's answer to it.
BATCH = 260
#: Content type of a message of several deliveries (broker -> client).
DELIVERIES = 261
#: Default and upper bound of the entries one batch may hold (``Batch-Max``).
DEFAULT_MAX_FRAMES = 1024
#: Header of the connect response: the most entries one batch may hold (absent: none).
BATCH_MAX = "Batch-Max"
#: Header of the connect response: the most octets of entries one batch may hold (what
#: ``max_frame_size`` leaves beside the batch frame's own fields, ``BATCH_OVERHEAD``).
BATCH_OCTETS = "Batch-Octets"
#: Octets a batch frame may need beside its entries (flags, lengths, ids, headers).
BATCH_OVERHEAD = 1024
#: Connection-info property of a client that reads delivery batches: the most entries.
BATCH_DELIVERIES = "Batch-Deliveries"
#: Octets of payload a delivery batch gathers at most before it is sent.
DELIVERY_OCTETS = 256 * 1024

_SERVER = int(MessageType.SERVER)
_ACK = int(MessageType.ACK)
_LEN = struct.Struct("<I")
_pack_len = _LEN.pack
_unpack_len = _LEN.unpack_from
#: The broker's delivery batches: a server operation frame without id, source or target
#: (the flags checked once, ``tmqp.encode_frame_sender``).
_deliveries_encoder = tmqp.encode_frame_sender(message_type=_SERVER)


class BatchError(ValueError):
    """A batch payload that cannot be split into its entries."""


class TooMany(BatchError):
    """A batch with more entries than allowed."""


def pack(entries: Iterable[bytes]) -> bytes:
    """The payload holding ``entries`` (each the octets of one TMQP frame)."""
    # A plain loop: 2.0x faster than joining ``chain(zip(map(pack, map(len, ...)),
    # ...))`` for the 13 entries of a delivery batch, 1.7x for 256 (session 15, CPU time).
    parts: list[bytes] = []
    add = parts.append
    for entry in entries:
        add(_pack_len(len(entry)))
        add(entry)
    return b"".join(parts)


def pack_into(buffer: bytearray, entries: Sequence[bytes]) -> memoryview:
    """What :func:`pack` makes of ``entries``, written into ``buffer`` from its start
    (grown when short, never shrunk); a view of those octets, to be released before the
    buffer is packed again.  A sender packing batch after batch reuses one buffer: a new
    payload of hundreds of KiB each time is a large allocation whose pages the C
    allocator hands back to the system when it is freed and takes again (page faults)
    at the next one (client, 4 KiB pushes: ~0.8 faults a push)."""
    end = sum(map(len, entries)) + 4 * len(entries)
    if len(buffer) < end:
        buffer.extend(bytes(end - len(buffer)))
    pos = 0
    put_len = _LEN.pack_into
    for entry in entries:
        size = len(entry)
        put_len(buffer, pos, size)
        pos += 4
        buffer[pos : pos + size] = entry
        pos += size
    return memoryview(buffer)[:end]


def unpack(payload: bytes, max_entries: int) -> list[bytes]:
    """The entries of a batch payload; :class:`BatchError` when it cannot be split or
    holds more than ``max_entries``."""
    out: list[bytes] = []
    pos = 0
    end = len(payload)
    view = memoryview(payload)
    while pos < end:
        if end - pos < 4:
            raise BatchError(f"entry {len(out)}: length cut short at octet {pos}")
        (size,) = _unpack_len(payload, pos)
        pos += 4
        if size > end - pos:
            raise BatchError(f"entry {len(out)}: {size} octets announced, {end - pos} left")
        if len(out) >= max_entries:
            raise TooMany(f"batch of more than {max_entries} entries")
        out.append(bytes(view[pos : pos + size]))
        pos += size
    return out


def batch_frame(message_id: str, source: str, entries: Sequence[bytes], ack: bool) -> bytes:
    """The octets of a batch of ``entries`` (acknowledged once when ``ack``)."""
    return tmqp.encode_frame(
        message_type=_SERVER,
        pending_ack=ack,
        content_type=BATCH,
        message_id=message_id,
        source=source,
        payload=pack(entries),
    )[0]


def deliveries_frame(entries: Sequence[bytes]) -> bytes:
    """The octets of one message carrying several deliveries."""
    return _deliveries_encoder(DELIVERIES, "", "", pack(entries))[0]


def result_frame(
    message_id: str,
    target: str,
    refused: Sequence[tuple[int, str, str]],
    later: Sequence[int] = (),
) -> tmqp.Frame:
    """The one acknowledge of a batch: ``refused`` lists (index, nack reason, reason) of
    the pushes not taken, ``later`` the indexes of acknowledged pushes whose own
    acknowledge comes later, on its own (the queue answers only once consumers did)."""
    body: dict[str, object] = {}
    if refused:
        body["Refused"] = [list(r) for r in refused]
    if later:
        body["Later"] = list(later)
    payload = json.dumps(body, separators=(",", ":")).encode() if body else b""
    return tmqp.Frame(
        message_type=_ACK,
        content_type=BATCH,
        message_id=message_id,
        target=target,
        payload=payload,
    )


def result_of(frame: tmqp.Frame) -> tuple[list[tuple[int, str, str]], list[int]]:
    """The refused entries and the later-acknowledged indexes the acknowledge of a batch
    reports (ValueError: unreadable)."""
    if not frame.payload:
        return [], []
    value = json.loads(frame.payload)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    rows = value.get("Refused", [])
    later = value.get("Later", [])
    if not isinstance(rows, list) or not isinstance(later, list):
        raise ValueError("Refused and Later must be lists")
    refused: list[tuple[int, str, str]] = []
    for row in rows:
        if not (isinstance(row, list) and len(row) == 3 and type(row[0]) is int):
            raise ValueError(f"bad Refused entry {row!r}")
        refused.append((row[0], str(row[1]), str(row[2])))
    if not all(type(i) is int for i in later):
        raise ValueError("bad Later entry")
    return refused, later
