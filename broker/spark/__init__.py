"""The broker as a Spark source and sink (PySpark's Python Data Source API, pyspark 4.3+).

Install the ``spark`` extra (``pip install 'zerohub[spark]'``: pyspark and pyarrow) and
have a Java 17+ runtime.  Then::

    from broker.spark import register
    from zerohub.sparkkit import session

    spark = session("local[2]")          # Spark's Python workers use this interpreter
    register(spark)                      # the data source "zerohub"
    df = (spark.readStream.format("zerohub")
          .option("endpoint", "tcp://127.0.0.1:5680")
          .option("channel", "orders").option("queue", "1")
          .option("maxRowsPerTrigger", "50000")
          .load())
    (df.writeStream.format("zerohub").option("channel", "copies").option("queue", "1")
       .option("checkpointLocation", "/tmp/ckpt").start())

``spark.read`` / ``df.write`` work the same way (batch).  PySpark also finds the source
without ``register`` (its discovery of ``pyspark_*`` modules: ``pyspark_zerohub``).

Schema, conversions: ``broker.spark.rows``; options and their defaults:
``broker.spark.options``; the source (offsets = the queue's sequence numbers, read
without consuming, ``release`` on commit): ``broker.spark.reader``; the sink (producer
acks, idempotent message ids, commit/abort): ``broker.spark.writer``.

Exactly once, end to end: the source's offsets live in the query's checkpoint (as with
Spark's Kafka source), a restarted query reads from there again without having consumed
anything, and the sink's ids are the same when a task or micro-batch runs again, so a
queue with ``UseMessageId`` keeps one copy (``tests/spark`` checks both).
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]


def register(spark: Any) -> None:
    """Register the ``zerohub`` data source with ``spark`` (a SparkSession)."""
    from zerohub import sparkkit

    sparkkit.require()
    sparkkit.use_this_python()
    from broker.spark.source import ZerohubDataSource

    spark.dataSource.register(ZerohubDataSource)
