"""The ``zerohub`` source: a broker queue read by sequence number, without consuming it.

Offsets are the queue's sequence numbers (``broker.sequence``): an offset
``{"seq": N}`` means "every message numbered N or less is processed".  A micro-batch
from offset S to offset E reads the messages the queue holds numbered S+1..E, cut into
Spark partitions of ``rowsPerPartition`` sequence numbers; each task browses its range
(pages of ``browseLimit`` messages at most, or as many as the broker's reply size holds;
the next one asked for while the last one is handed to Spark) and yields pyarrow record
batches.  Reading changes nothing in the queue: a restarted query reads again from the
offset its checkpoint holds, so each message reaches the sink once when the sink is
idempotent (Spark's file sink, the ``zerohub`` sink on a ``UseMessageId`` queue).

What a query can read is what the queue *holds*: waiting messages, deliveries in flight,
and on a queue with the ``Retain`` option consumed ones too (until released or pushed
out past ``RetainLimit``).  A queue that consumers also take from must have ``Retain``,
or the query misses what they consumed first.  With ``release=true`` Spark's commit of
a micro-batch releases its messages (``AllowRelease`` on the queue): the broker then
forgets what the query has durably processed.  (Spark commits a micro-batch when it
plans the next one, so the last one before a stop is released by the next run.)

Admission control: ``maxRowsPerTrigger`` caps the sequence numbers of one micro-batch
(``latestOffset(start, limit)`` with Spark's ``ReadMaxRows``; a trigger that asks for
everything, such as ``availableNow``, gets everything).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from broker.client.admin import operation_frame
from broker.client.blocking import Client
from broker.protocol import Header, Operation
from broker.sequence import SequenceBounds
from broker.spark.connect import open_client
from broker.spark.options import EARLIEST, LATEST, ConnectOptions, ReadOptions
from broker.spark.rows import arrow_schema, page_batch

log = logging.getLogger(__name__)


class SequenceRange(InputPartition):
    """One Spark partition: the queue's sequence numbers ``first`` through ``last``."""

    def __init__(self, first: int, last: int) -> None:
        super().__init__((first, last))
        self.first = first
        self.last = last


def split(first: int, last: int, per_partition: int) -> list[SequenceRange]:
    """``first..last`` cut into ranges of at most ``per_partition`` numbers."""
    return [
        SequenceRange(at, min(at + per_partition - 1, last))
        for at in range(first, last + 1, per_partition)
    ]


def _ask(client: Client, connect: ConnectOptions, cursor: int, limit: int) -> Future[Any]:
    """Send one browse request (``Client.browse``'s frame) without waiting for its answer."""
    frame = operation_frame(
        client.new_id(), Operation.QUEUE_BROWSE, connect.channel, queue_id=connect.queue,
        response=True,
    )  # fmt: skip
    asked = ((Header.FROM_SEQ, str(cursor)), (Header.LIMIT, str(limit)))
    return client.request_frame(frame.replace(headers=(*frame.headers, *asked)))


def read_range(options: ReadOptions, first: int, last: int) -> Iterator[Any]:
    """Record batches of the held messages numbered ``first..last``, in order.

    Pipelined: the next page is asked for before this one is turned into a record batch
    and handed to Spark, so the broker (its own process) reads and encodes it meanwhile.

    Sized to the broker's reply budget (``max_reply_size``): an answer of several
    messages cut short by it tells how many octets the broker sends; later pages ask for
    as many messages as fit in that many octets at the last page's mean size, so the
    broker does not read messages from its index that it then leaves out of the answer.
    """
    connect = options.connect
    schema = arrow_schema()
    most = options.browse_limit
    step = most  # messages to ask for at a time
    budget = 0  # the most octets an answer was cut to (0: none cut yet)
    client = open_client(connect, threaded=False)
    try:
        wanted = min(step, last - first + 1)
        asked: Future[Any] | None = _ask(client, connect, first, wanted)
        while asked is not None:
            payload = asked.result().payload
            page = page_batch(payload, last, connect.channel, connect.queue, schema)
            if not page.last:
                return  # nothing more held in the range
            rows = page.batch.num_rows
            if page.complete and 1 < rows < wanted:  # cut to the budget (or all it holds)
                budget = max(budget, len(payload))  # (one message alone may exceed it)
            if budget:
                step = max(1, min(most, budget * rows // len(payload)))
            cursor = page.last + 1
            more = cursor <= last and page.complete  # else: the range's end seen
            asked = None
            if more:
                wanted = min(step, last - cursor + 1)
                asked = _ask(client, connect, cursor, wanted)
            yield page.batch
    finally:
        client.close()


class _Driver:
    """The driver side's client (opened on first use; never pickled to the tasks)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._client: Client | None = None
        #: the newest sequence number the broker has given, as last asked (0: not asked)
        self.newest = 0

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None
        return state

    def client(self) -> Client:
        if self._client is None:
            self._client = open_client(self.options.connect)
        return self._client

    def bounds(self) -> SequenceBounds:
        c = self.options.connect
        bounds: SequenceBounds = self.client().queue_bounds(c.channel, c.queue)
        self.newest = max(self.newest, bounds.last)
        return bounds

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


class BatchReader(DataSourceReader):
    """``spark.read.format("zerohub")``: what the queue holds when the query is planned
    (from ``startingOffsets`` on, when it is a sequence number)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        driver = _Driver(self.options)
        try:
            bounds = driver.bounds()
        finally:
            driver.close()
        first = bounds.first
        if isinstance(self.options.starting, int):
            first = max(first, self.options.starting)
        elif self.options.starting == LATEST:
            first = bounds.last + 1
        return split(first, bounds.last, self.options.rows_per_partition)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, SequenceRange)
        yield from read_range(self.options, partition.first, partition.last)


class StreamReader(_Driver, DataSourceStreamReader):
    """``spark.readStream.format("zerohub")``: see the module docstring."""

    def initialOffset(self) -> dict[str, int]:
        bounds = self.bounds()
        starting = self.options.starting
        if starting == EARLIEST:
            return {"seq": bounds.first - 1}
        if starting == LATEST:
            return {"seq": bounds.last}
        assert isinstance(starting, int)
        return {"seq": starting - 1}

    def getDefaultReadLimit(self) -> ReadLimit:
        most = self.options.max_rows_per_trigger
        return ReadAllAvailable() if most is None else ReadMaxRows(most)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        """The end of the next micro-batch.  With a row limit that the newest number
        already known covers (a backlog being worked through), no round trip to the
        broker: sequence numbers are never taken back."""
        begin = int(start["seq"])
        if isinstance(limit, ReadMaxRows) and begin + limit.max_rows <= self.newest:
            return {"seq": begin + limit.max_rows}
        end = self.bounds().last
        if isinstance(limit, ReadMaxRows):
            end = min(end, begin + limit.max_rows)
        return {"seq": max(begin, end)}

    def reportLatestOffset(self) -> dict[str, int]:
        """The newest sequence number known (Spark reports it each trigger, after
        ``latestOffset``; asked from the broker only when nothing is known yet)."""
        return {"seq": self.newest or self.bounds().last}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        return split(int(start["seq"]) + 1, int(end["seq"]), self.options.rows_per_partition)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, SequenceRange)
        yield from read_range(self.options, partition.first, partition.last)

    def commit(self, end: dict[str, int]) -> None:
        if self.options.release:
            c = self.options.connect
            released = self.client().release(c.channel, c.queue, int(end["seq"]))
            log.debug("zerohub source: released %d messages through %s", released, end["seq"])

    def stop(self) -> None:
        self.close()
