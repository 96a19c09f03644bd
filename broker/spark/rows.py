"""The rows of the ``zerohub`` data source: its schema and the conversions to and from
broker messages, as pyarrow columns (Spark reads Arrow record batches several times
faster than Python tuples).

Schema (:data:`SCHEMA`)::

    id            string               the message id
    channel       string
    queue         int                  the queue id in the channel
    content_type  string               the message's ``Content-Type`` header (null: none)
    headers       map<string,string>   every other header (first one of a repeated name)
    payload       binary
    sequence      bigint               the queue's sequence number (reading; ignored when
                                       writing: the broker numbers what it accepts)
    timestamp     timestamp            the ``Timestamp`` header: microseconds since the
                                       epoch, UTC (null: none or not a number)

A TMQP queue frame's own ``content_type`` field is the queue id, so the content type
and the timestamp travel as headers; the writer sets them from their columns (a
``headers`` entry of the same name gives way to the column).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from broker import tmqp
from broker.message import Headers
from broker.sequence import ENTRY, BrowseFormatError

__all__ = [
    "CONTENT_TYPE",
    "SCHEMA",
    "TIMESTAMP",
    "WRITABLE",
    "Outgoing",
    "Page",
    "arrow_schema",
    "outgoing",
    "page_batch",
]

SCHEMA = (
    "id string, channel string, queue int, content_type string, "
    "headers map<string,string>, payload binary, sequence bigint, timestamp timestamp"
)
CONTENT_TYPE = "Content-Type"
TIMESTAMP = "Timestamp"
_SPECIAL = frozenset((CONTENT_TYPE.lower(), TIMESTAMP.lower()))
#: The columns a written DataFrame may have (``payload`` is required).
WRITABLE = frozenset(
    ("id", "channel", "queue", "content_type", "headers", "payload", "sequence", "timestamp")
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("id", pa.string()),
            ("channel", pa.string()),
            ("queue", pa.int32()),
            ("content_type", pa.string()),
            ("headers", pa.map_(pa.string(), pa.string())),
            ("payload", pa.binary()),
            ("sequence", pa.int64()),
            ("timestamp", pa.timestamp("us", tz="UTC")),
        ]
    )


def _micros(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    if not text.isdigit() or len(text) > 18:
        return None
    return int(text)


def _special(
    headers: Headers,
) -> tuple[str | None, int | None, list[tuple[str, str]]]:
    """A message's headers as the row has them: the content type, the timestamp and
    every other header (the first of a repeated name)."""
    content_type = stamp = None
    others: list[tuple[str, str]] = []
    seen: set[str] = set()
    for key, value in headers:
        lower = key.lower()
        if lower in _SPECIAL:
            if lower == "content-type":
                content_type = value if content_type is None else content_type
            elif stamp is None:
                stamp = _micros(value)
        elif key not in seen:
            seen.add(key)
            others.append((key, value))
    return content_type, stamp, others


@dataclass(frozen=True, slots=True)
class Page:
    """One browse answer read as a record batch (:func:`page_batch`)."""

    #: pyarrow RecordBatch of the entries numbered ``through`` or less (maybe 0 rows)
    batch: Any
    #: the sequence number of its last row (0: no row)
    last: int
    #: True when every entry of the answer was numbered ``through`` or less
    complete: bool


def page_batch(payload: bytes, through: int, channel: str, queue: int, schema: Any) -> Page:
    """The rows of a browse answer (``broker.sequence``'s payload) numbered ``through``
    or less, as a RecordBatch of ``schema`` (:func:`arrow_schema`), in one pass.

    No per-row objects beyond the frame the codec decodes: each column is a list of
    plain values handed to pyarrow once; the headers map, content type and timestamp
    columns are built from the few rows that have headers (none: empty maps, nulls).
    Raises :class:`~broker.sequence.BrowseFormatError` as ``decode_browse`` does."""
    import pyarrow as pa

    unpack = ENTRY.unpack_from
    head = ENTRY.size
    decode, frame_type = tmqp.decode, tmqp.Frame
    ids: list[str] = []
    payloads: list[bytes] = []
    sequences: list[int] = []
    headed: list[tuple[int, Headers]] = []  # (row, headers) of the rows that have any
    pos, end, last = 0, len(payload), 0
    complete = True
    while pos < end:
        if end - pos < head:
            raise BrowseFormatError(f"browse answer ends inside an entry header at {pos}")
        seq, size = unpack(payload, pos)
        pos += head
        if size > end - pos:
            raise BrowseFormatError(f"browse entry {seq} claims {size} octets, {end - pos} left")
        if seq <= last:
            raise BrowseFormatError(f"browse entries out of order ({seq} after {last})")
        if seq > through:
            complete = False
            break
        last = seq
        try:
            frame = decode((payload[pos : pos + size],))
        except tmqp.DecodeError as exc:
            raise BrowseFormatError(f"browse entry {seq} is not a TMQP frame: {exc}") from None
        if type(frame) is not frame_type:
            raise BrowseFormatError(f"browse entry {seq} is not a message frame")
        pos += size
        if frame.headers:
            headed.append((len(ids), frame.headers))
        ids.append(frame.message_id)
        payloads.append(frame.payload)
        sequences.append(seq)
    n = len(ids)
    string, stamp_type = pa.string(), pa.timestamp("us", tz="UTC")
    map_type = pa.map_(string, string)
    if headed:
        content_types: list[str | None] = [None] * n
        stamps: list[int | None] = [None] * n
        counts = [0] * n
        keys: list[str] = []
        values: list[str] = []
        for row, headers in headed:
            content_types[row], stamps[row], others = _special(headers)
            counts[row] = len(others)
            for key, value in others:
                keys.append(key)
                values.append(value)
        offsets = [0] * (n + 1)
        total = 0
        for row, count in enumerate(counts, 1):
            total += count
            offsets[row] = total
        types_column = pa.array(content_types, string)
        stamps_column = pa.array(stamps, stamp_type)
        maps = pa.MapArray.from_arrays(
            pa.array(offsets, pa.int32()),
            pa.array(keys, string),
            pa.array(values, string),
            type=map_type,
        )
    else:
        types_column = pa.nulls(n, string)
        stamps_column = pa.nulls(n, stamp_type)
        maps = pa.MapArray.from_arrays(
            pa.repeat(pa.scalar(0, pa.int32()), n + 1),
            pa.array((), string),
            pa.array((), string),
            type=map_type,
        )
    columns = [
        pa.array(ids, string),
        pa.repeat(pa.scalar(channel, string), n),
        pa.repeat(pa.scalar(queue, pa.int32()), n),
        types_column,
        maps,
        pa.array(payloads, pa.binary()),
        pa.array(sequences, pa.int64()),
        stamps_column,
    ]
    return Page(pa.RecordBatch.from_arrays(columns, schema=schema), last, complete)


Outgoing = tuple[str | None, str | None, int | None, bytes, tuple[tuple[str, str], ...]]
"""One message to push: (id or None, channel or None, queue or None, payload, headers)."""


def outgoing(batch: Any) -> Iterator[Outgoing]:
    """The messages of a pyarrow RecordBatch with (some of) the :data:`WRITABLE` columns."""
    names = set(batch.schema.names)
    n = batch.num_rows

    def column(name: str) -> list[Any]:
        return batch.column(name).to_pylist() if name in names else [None] * n

    ids, channels, queues = column("id"), column("channel"), column("queue")
    content_types, header_maps = column("content_type"), column("headers")
    payloads, stamps = column("payload"), column("timestamp")
    for i in range(n):
        head: list[tuple[str, str]] = []
        if content_types[i] is not None:
            head.append((CONTENT_TYPE, str(content_types[i])))
        stamp = stamps[i]
        if stamp is not None:
            if stamp.tzinfo is None:
                stamp = stamp.replace(tzinfo=UTC)
            delta = stamp - _EPOCH
            micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
            head.append((TIMESTAMP, str(micros)))
        for key, value in header_maps[i] or ():
            if key is not None and key.lower() not in _SPECIAL and value is not None:
                head.append((str(key), str(value)))
        payload = payloads[i]
        if payload is None:
            payload = b""
        elif isinstance(payload, str):
            payload = payload.encode()
        yield ids[i], channels[i], queues[i], payload, tuple(head)
