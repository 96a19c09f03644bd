"""broker.spark's options and row conversions (no Spark needed: pyarrow only)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from broker.message import Message
from broker.sequence import Browsed
from broker.spark.options import (
    DEFAULT_ROWS_PER_PARTITION,
    EARLIEST,
    LATEST,
    OptionError,
    ReadOptions,
    WriteOptions,
)

pa = pytest.importorskip("pyarrow")

from broker.spark.rows import arrow_schema, browsed_batch, outgoing  # noqa: E402

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
        Browsed(5, Message("id-5", "p", "c", 7, headers=(("Content-Type", "text/csv"),
                ("Timestamp", micros), ("a", "1"), ("a", "2"), ("b", "")), payload=b"\0\xff")),
        Browsed(9, Message("id-9", "p", "c", 7, headers=(("timestamp", "not a number"),),
                payload=memoryview(b"view"))),
    ]  # fmt: skip
    batch = browsed_batch(entries, "c", 7, arrow_schema())
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
