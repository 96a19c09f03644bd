"""broker.spark's options and row conversions (no Spark needed: pyarrow only)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from broker import tmqp
from broker.engine.tmqp_door import encode as encode_message
from broker.message import Message
from broker.protocol import MessageType
from broker.sequence import BrowseFormatError, decode_browse, encode_browse
from broker.spark.options import (
    DEFAULT_ROWS_PER_PARTITION,
    EARLIEST,
    LATEST,
    OptionError,
    ReadOptions,
    WriteOptions,
)

pa = pytest.importorskip("pyarrow")

from broker.spark.rows import arrow_schema, outgoing, page_batch  # noqa: E402

BASE = {"channel": "c", "queue": "7"}


def test_read_defaults_and_case_insensitive_names() -> None:
    o = ReadOptions.parse({"Channel": "c", "QUEUE": "7", "maxrowspertrigger": "500"})
    assert (o.connect.endpoint, o.connect.channel, o.connect.queue) == (
        "tcp://127.0.0.1:5680",
        "c",
        7,
    )
    assert o.starting == EARLIEST and o.max_rows_per_trigger == 500 and not o.release
    assert o.rows_per_partition == DEFAULT_ROWS_PER_PARTITION and o.browse_limit == 10_000
    assert ReadOptions.parse({**BASE, "startingOffsets": "LATEST"}).starting == LATEST
    assert ReadOptions.parse({**BASE, "startingOffsets": "42"}).starting == 42
    assert ReadOptions.parse({**BASE, "release": "True"}).release


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"queue": "1"}, "'channel' is required"),
        ({"channel": "c"}, "'queue' is required"),
        ({**BASE, "queue": "65536"}, "'queue' must be 0..65535"),
        ({**BASE, "queue": "one"}, "must be an integer"),
        ({**BASE, "endpoint": "127.0.0.1:5680"}, "'endpoint'"),
        ({**BASE, "serverKey": "s.key"}, "go together"),
        ({**BASE, "timeout": "0"}, "above 0"),
        ({**BASE, "maxRowsPerTrigger": "0"}, "'maxRowsPerTrigger' must be 1.."),
        ({**BASE, "browseLimit": "10001"}, "'browseLimit' must be 1..10000"),
        ({**BASE, "startingOffsets": "0"}, "'startingOffsets' must be 1.."),
        ({**BASE, "startingOffsets": "newest"}, "must be an integer"),
        ({**BASE, "release": "yes"}, "true or false"),
    ],
)
def test_bad_read_options_are_named(options: dict[str, str], says: str) -> None:
    with pytest.raises(OptionError, match=says):
        ReadOptions.parse(options)


def test_write_options_target_from_options_or_columns() -> None:
    assert WriteOptions.parse({}).connect.channel == ""
    assert WriteOptions.parse({}).connect.queue == -1
    o = WriteOptions.parse({**BASE, "maxInFlight": "10", "writeId": "job"})
    assert (o.connect.channel, o.connect.queue, o.max_in_flight, o.write_id) == ("c", 7, 10, "job")
    with pytest.raises(OptionError, match="writeId"):
        WriteOptions.parse({"writeId": "x" * 101})
    with pytest.raises(OptionError, match="maxInFlight"):
        WriteOptions.parse({"maxInFlight": "0"})


def test_rows_round_trip_through_arrow() -> None:
    stamp = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    micros = str(int(stamp.timestamp()) * 1_000_000 + stamp.microsecond)
    entries = [
        (5, Message("id-5", "p", "c", 7, headers=(("Content-Type", "text/csv"),
            ("Timestamp", micros), ("a", "1"), ("a", "2"), ("b", "")), payload=b"\0\xff")),
        (9, Message("id-9", "p", "c", 7, headers=(("timestamp", "not a number"),),
            payload=memoryview(b"view"))),
    ]  # fmt: skip
    payload = encode_browse((seq, encode_message(m)) for seq, m in entries)
    page = page_batch(payload, 9, "c", 7, arrow_schema())
    assert (page.last, page.complete) == (9, True)
    batch = page.batch
    assert batch.schema == arrow_schema()
    rows = batch.to_pylist()
    assert rows[0] == {
        "id": "id-5",
        "channel": "c",
        "queue": 7,
        "content_type": "text/csv",
        "headers": [("a", "1"), ("b", "")],  # a repeated name: its first value
        "payload": b"\0\xff",
        "sequence": 5,
        "timestamp": stamp,
    }
    assert rows[1]["timestamp"] is None and rows[1]["content_type"] is None
    assert rows[1]["payload"] == b"view" and rows[1]["headers"] == []
    out = list(outgoing(batch))
    written = (("Content-Type", "text/csv"), ("Timestamp", micros), ("a", "1"), ("b", ""))
    assert out[0] == ("id-5", "c", 7, b"\0\xff", written)
    assert out[1] == ("id-9", "c", 7, b"view", ())


def test_outgoing_takes_only_a_payload_and_strings() -> None:
    batch = pa.RecordBatch.from_pylist(
        [{"payload": "text"}, {"payload": None}],
        schema=pa.schema([("payload", pa.string())]),
    )
    assert list(outgoing(batch)) == [(None, None, None, b"text", ()), (None, None, None, b"", ())]
    headers = pa.RecordBatch.from_pylist(
        [{"payload": b"x", "headers": [("Content-Type", "from the map"), ("k", "v")],
          "content_type": None}],
        schema=pa.schema([("payload", pa.binary()),
                          ("headers", pa.map_(pa.string(), pa.string())),
                          ("content_type", pa.string())]),
    )  # fmt: skip
    # the content_type column owns Content-Type: a map entry of that name is dropped
    assert list(outgoing(headers)) == [(None, None, None, b"x", (("k", "v"),))]


def _expected_rows(payload: bytes, through: int, channel: str, queue: int) -> list[dict]:
    """The rows of a browse answer built the plain way: ``decode_browse``, one dict each."""
    rows = []
    for entry in decode_browse(payload):
        if entry.sequence > through:
            break
        m = entry.message
        content_type = stamp = None
        others: dict[str, str] = {}
        for key, value in m.headers:
            if key.lower() == "content-type":
                content_type = value if content_type is None else content_type
            elif key.lower() == "timestamp":
                if stamp is None and value.strip().isdigit() and len(value.strip()) <= 18:
                    stamp = datetime.fromtimestamp(int(value) / 1e6, UTC)
            else:
                others.setdefault(key, value)
        rows.append({
            "id": m.message_id, "channel": channel, "queue": queue,
            "content_type": content_type, "headers": list(others.items()),
            "payload": bytes(m.payload), "sequence": entry.sequence, "timestamp": stamp,
        })  # fmt: skip
    return rows


def test_page_batch_equals_the_plain_decoding_of_every_page() -> None:
    """Pages of rows with and without headers mixed (none, all, a few, at the ends), cut
    at every ``through``: the one-pass columns equal the row-by-row decoding."""
    import random

    rnd = random.Random(14)
    heads = [
        (("Content-Type", "a/b"),),
        (("Timestamp", "1700000000000001"), ("k", "v")),
        (("x", "1"), ("X", "2"), ("x", "3")),
        (("timestamp", "12x"), ("Timestamp", "7")),
    ]
    for case in range(60):
        n = rnd.choice((0, 1, 2, 5, 40))
        share = rnd.choice((0.0, 0.1, 1.0))
        seq = rnd.randint(1, 1000)
        entries = []
        for i in range(n):
            seq += rnd.choice((1, 1, 3))
            headers = rnd.choice(heads) if rnd.random() < share else ()
            body = bytes(rnd.randrange(256) for _ in range(rnd.choice((0, 1, 100, 300))))
            m = Message(f"id-{case}-{i}", "p", "ch", 3, headers=headers, payload=body)
            entries.append((seq, encode_message(m)))
        payload = encode_browse(entries)
        for through in sorted({0, seq, seq + 5, *(s for s, _ in entries[:3])}):
            page = page_batch(payload, through, "ch", 3, arrow_schema())
            want = _expected_rows(payload, through, "ch", 3)
            assert page.batch.schema == arrow_schema()
            assert page.batch.to_pylist() == want, (case, through)
            assert page.last == (want[-1]["sequence"] if want else 0)
            assert page.complete == (len(want) == n)


def test_page_batch_refuses_garbage() -> None:
    frame = tmqp.encode(tmqp.Frame(message_type=MessageType.QUEUE, payload=b"p"))[0]
    good = encode_browse([(1, frame), (2, frame)])
    assert page_batch(good, 2, "c", 1, arrow_schema()).batch.num_rows == 2
    for bad in (
        good[:-1],  # truncated frame
        good[:5],  # truncated entry header
        encode_browse([(2, frame), (1, frame)]),  # out of order
        encode_browse([(1, frame), (1, frame)]),  # repeated
        encode_browse([(1, b"\x00\x01garbage")]),  # not a frame
        encode_browse([(1, tmqp.encode(tmqp.Ping())[0])]),  # a frame, not a message
    ):
        with pytest.raises(BrowseFormatError):
            page_batch(bad, 10, "c", 1, arrow_schema())
