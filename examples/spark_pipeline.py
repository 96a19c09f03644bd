"""FILEMQ file events -> a broker queue -> Spark structured streaming -> a broker queue.

    python examples/spark_pipeline.py        # one command, everything on loopback, local[2]

Needs the spark extra (``pip install 'zerohub[spark]'``) and Java 17.  In this process:

1. a FILEMQ server publishes a temporary folder and a subscriber mirrors it; every file
   the mirror applies (``MirrorEvent``, as ``filemq subscribe --json`` prints it) is pushed
   into the broker queue ``files/1`` (producer acks, the event's JSON as payload);
2. a Spark streaming query reads ``files/1`` (``format("zerohub")``, offsets = the
   queue's sequence numbers, kept in a checkpoint), parses the events' JSON and, per
   micro-batch, counts files and octets per file extension;
3. each micro-batch's aggregate is written to the queue ``stats/1`` with
   ``writeId = "stats-<batch id>"``: a micro-batch Spark runs again after a failure
   pushes the same message ids, which the queue (``UseMessageId``) keeps once.

The demo writes a few files into the published folder, waits until ``stats/1`` holds an
aggregate for every file, prints them and stops.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

from broker.client.blocking import Client
from broker.engine.engine import Engine
from broker.server.server import Server, ServerOptions
from broker.spark import register
from filemq.events import EventKind, MirrorEvent
from filemq.live import LiveFileServer
from filemq.server import Mount
from filemq.subscriber import Subscriber
from zerohub.sparkkit import session

EVENT_SCHEMA = "kind string, name string, size long, sha1 string, time double"
FILES = {
    "reports/mon.csv": b"day,value\nmon,1\n",
    "reports/tue.csv": b"day,value\ntue,2\n",
    "logs/app.log": b"started\n" * 100,
    "logs/db.log": b"ok\n" * 10,
    "readme.txt": b"what this folder holds\n",
}


def stats_job(spark: Any, endpoint: str, checkpoint: Path) -> Any:
    """The streaming query: file events in, one aggregate message per extension out."""
    from pyspark.sql import functions as F

    events = (
        spark.readStream.format("zerohub")
        .option("endpoint", endpoint)
        .option("channel", "files")
        .option("queue", "1")
        .load()
    )
    files = (
        events.select(F.from_json(F.col("payload").cast("string"), EVENT_SCHEMA).alias("e"))
        .where(F.col("e.kind") == "create")
        .select(
            F.regexp_extract("e.name", r"\.([^./]+)$", 1).alias("extension"),
            F.col("e.size").alias("size"),
        )
    )

    def publish(batch: Any, batch_id: int) -> None:
        if batch.isEmpty():
            return  # nothing arrived in this trigger: no write job
        totals = batch.groupBy("extension").agg(
            F.count("*").alias("files"), F.sum("size").alias("octets")
        )
        out = totals.select(
            F.to_json(F.struct(F.lit(batch_id).alias("batch"), "extension", "files", "octets"))
            .cast("binary")
            .alias("payload"),
            F.lit("application/json").alias("content_type"),
        )
        out.write.format("zerohub").option("endpoint", endpoint).option("channel", "stats").option(
            "queue", "1"
        ).option("writeId", f"stats-{batch_id}").mode("append").save()

    return (
        files.writeStream.foreachBatch(publish)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="1 second")
        .start()
    )


def main() -> None:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    with tempfile.TemporaryDirectory(prefix="spark-pipeline-") as name:
        tmp = Path(name)
        published, mirror = tmp / "published", tmp / "mirror"
        published.mkdir()
        broker = Server(Engine(), ServerOptions(endpoint="tcp://127.0.0.1:*"), context=context)
        with broker, Client(broker.endpoint or "", context=context, timeout=30) as client:
            endpoint = broker.endpoint or ""
            client.create_queue("files", 1, {"Status": "Push"})
            client.create_queue("stats", 1, {"Status": "Push", "UseMessageId": True})

            def to_broker(event: MirrorEvent) -> None:  # the subscriber's thread
                if event.kind is EventKind.CREATE:
                    client.push("files", 1, event.to_json(), ack=True)

            spark = session("local[2]", "spark-pipeline")
            register(spark)
            query = stats_job(spark, endpoint, tmp / "checkpoint")
            files = LiveFileServer(context, [Mount(published, "/")], endpoint="tcp://127.0.0.1:*")
            try:
                with files:
                    subscriber = Subscriber(files.endpoint, mirror, context=context,
                                            index_path=None, on_event=to_broker)  # fmt: skip
                    with subscriber:
                        for rel, data in FILES.items():
                            (published / rel).parent.mkdir(parents=True, exist_ok=True)
                            (published / rel).write_bytes(data)
                        counted = _wait_for_stats(client, len(FILES))
                query.processAllAvailable()  # stop between micro-batches, not in one
            finally:
                query.stop()
                spark.stop()
        print(f"{'batch':>5}  {'extension':<10} {'files':>5} {'octets':>7}")
        for stat in counted:
            print(f"{stat['batch']:>5}  {stat['extension']:<10} {stat['files']:>5} "
                  f"{stat['octets']:>7}")  # fmt: skip
    context.term()


def _wait_for_stats(client: Client, files: int, timeout: float = 180.0) -> list[dict[str, Any]]:
    """The aggregates in stats/1 once they count ``files`` files (or at the deadline)."""
    deadline = time.monotonic() + timeout
    stats: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        stats = [json.loads(bytes(b.message.payload)) for b in client.browse("stats", 1, 0)]
        if sum(s["files"] for s in stats) >= files:
            break
        time.sleep(0.5)
    return stats


if __name__ == "__main__":
    main()
