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

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from broker.sequence import Browsed

__all__ = [
    "CONTENT_TYPE",
    "SCHEMA",
    "TIMESTAMP",
    "WRITABLE",
    "Outgoing",
    "arrow_schema",
    "browsed_batch",
    "outgoing",
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


def browsed_batch(entries: Sequence[Browsed], channel: str, queue: int, schema: Any) -> Any:
    """A pyarrow RecordBatch of ``entries`` (read from ``channel``/``queue``)."""
    import pyarrow as pa

    ids: list[str] = []
    content_types: list[str | None] = []
    headers: list[list[tuple[str, str]]] = []
    payloads: list[bytes] = []
    sequences: list[int] = []
    stamps: list[int | None] = []
    for entry in entries:
        m = entry.message
        ids.append(m.message_id)
        payloads.append(bytes(m.payload))
        sequences.append(entry.sequence)
        content_type = stamp = None
        others: list[tuple[str, str]] = []
        if m.headers:
            seen: set[str] = set()
            for key, value in m.headers:
                lower = key.lower()
                if lower in _SPECIAL:
                    if lower == "content-type":
                        content_type = value if content_type is None else content_type
                    elif stamp is None:
                        stamp = _micros(value)
                elif key not in seen:
                    seen.add(key)
                    others.append((key, value))
        content_types.append(content_type)
        headers.append(others)
        stamps.append(stamp)
    n = len(ids)
    columns = [
        pa.array(ids, pa.string()),
        pa.array([channel] * n, pa.string()),
        pa.array([queue] * n, pa.int32()),
        pa.array(content_types, pa.string()),
        pa.array(headers, pa.map_(pa.string(), pa.string())),
        pa.array(payloads, pa.binary()),
        pa.array(sequences, pa.int64()),
        pa.array(stamps, pa.timestamp("us", tz="UTC")),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


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
