"""The ``zerohub`` sink: Spark rows pushed into a broker queue, acknowledged, idempotent.

Each Spark task opens one client and pushes its rows in order with producer acks
(``maxInFlight`` pushes awaiting their acknowledge at once); the task succeeds only
when the broker has acknowledged every row (a negative acknowledge or a lost connection
fails the task, and Spark runs it again).

Idempotent message ids: a row without an ``id`` gets ``STEM:BATCH:PARTITION:ROW`` --
STEM is the streaming query's id (the same after a restart from its checkpoint) or, for
a batch write, the ``writeId`` option (default: one random id per write, shared by every
attempt of its tasks); BATCH the micro-batch id (0 for a batch write); ROW the row's
place in its partition.  A retried task, or a micro-batch Spark runs again after a
restart, pushes the same ids again; on a queue with ``UseMessageId`` the broker keeps one
message per id, so nothing is duplicated.  (Rows keep their place on a retry when the
partition's contents are computed deterministically, as from a replayable source; else
give each row an ``id``.)

Commit and abort: a message is in the queue once the broker acknowledged it, before
Spark's commit; the driver's ``commit`` only logs what was written, and ``abort`` cannot
take pushed messages back: it logs how many may stay.  Exactly once end to end is: the
source's offsets in the checkpoint + these ids + a queue that drops repeated ids.
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from broker.spark.connect import open_client
from broker.spark.options import OptionError, WriteOptions
from broker.spark.rows import WRITABLE, outgoing

log = logging.getLogger(__name__)

#: TaskContext local properties Spark sets for the tasks of a streaming query.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


@dataclass(frozen=True)
class Pushed(WriterCommitMessage):
    """What one task pushed (acknowledged by the broker)."""

    partition: int
    rows: int


def check_columns(schema: Any) -> None:
    """OptionError unless the DataFrame's columns can be written (on the driver)."""
    names = list(schema.names)
    unknown = [name for name in names if name not in WRITABLE]
    if unknown:
        raise OptionError(
            f"zerohub sink: unknown columns {unknown} (it writes {sorted(WRITABLE)})"
        )
    if "payload" not in names:
        raise OptionError("zerohub sink: the DataFrame needs a 'payload' column")


def push_partition(options: WriteOptions, stem: str, batch: int, batches: Iterator[Any]) -> Pushed:
    """Push every row of this task's record ``batches``; the rows pushed and acknowledged."""
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    connect = options.connect
    client = open_client(connect)
    rows = 0
    pending: deque[Future[Any]] = deque()
    try:
        for record_batch in batches:
            for mid, row_channel, row_queue, payload, headers in outgoing(record_batch):
                channel = connect.channel or row_channel
                queue = connect.queue if connect.queue >= 0 else row_queue
                if not channel or queue is None:
                    raise OptionError(
                        "zerohub sink: a row without a channel or queue (set the options "
                        "'channel' and 'queue', or the columns)"
                    )
                future = client.push_async(
                    channel,
                    queue,
                    payload,
                    headers=headers or None,
                    message_id=mid or f"{stem}:{batch}:{partition}:{rows}",
                )
                pending.append(future)
                rows += 1
                if len(pending) >= options.max_in_flight:
                    pending.popleft().result()
        while pending:
            pending.popleft().result()
    finally:
        client.close()
    return Pushed(partition, rows)


def _total(messages: list[Any]) -> int:
    return sum(m.rows for m in messages if isinstance(m, Pushed))


class BatchWriter(DataSourceArrowWriter):
    """``df.write.format("zerohub")``: append to a queue."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        self.stem = options.write_id or uuid.uuid4().hex  # on the driver: every attempt's

    def write(self, iterator: Iterator[Any]) -> Pushed:
        return push_partition(self.options, self.stem, 0, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info("zerohub sink: write %s: %d messages pushed", self.stem, _total(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning(
            "zerohub sink: write %s aborted: %d messages already pushed stay in the queue "
            "(a retry with writeId=%s pushes the same ids)",
            self.stem,
            _total(messages),
            self.stem,
        )


class StreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("zerohub")``: each micro-batch appended to a queue."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> Pushed:
        from pyspark import TaskContext

        context = TaskContext.get()
        query = context.getLocalProperty(QUERY_ID_PROPERTY) if context else None
        batch = context.getLocalProperty(BATCH_ID_PROPERTY) if context else None
        stem = self.options.write_id or query
        if stem is None or batch is None:
            raise OptionError("zerohub sink: not in a streaming query's task (no query id)")
        return push_partition(self.options, stem, int(batch), iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.info("zerohub sink: micro-batch %d: %d messages pushed", batchId, _total(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning(
            "zerohub sink: micro-batch %d aborted: %d messages already pushed stay in the "
            "queue (its retry pushes the same ids)",
            batchId,
            _total(messages),
        )
