"""FILEMQ manifests made and compared on Spark (``filemq manifest --spark``).

The driver opens the first levels of the tree (``filemq.manifest.split_tree``) until it
has a few subtrees per core (``_SUBTREES_PER_CORE``); each Spark task then lists and
hashes its subtrees (``filemq.manifest.rows_of``), so listing and hashing both run in
parallel.  The files the driver met on the way are hashed by tasks too.  Every executor
must see ROOT at the same path (one machine, or a shared file system) and run an
interpreter with zerohub installed (``zerohub.sparkkit`` points local workers at this
one).

The manifest is written as Parquet by Spark (a folder of part files, one part here:
manifests are read whole); ``filemq.manifest.read`` reads either form.  Files that could
not be read are counted with an accumulator and reported by the command.
"""

from __future__ import annotations

import os
from typing import Any

from filemq.manifest import COLUMNS, ManifestError, ManifestRow, ManifestStats, rows_of, split_tree

__all__ = ["build_on_spark", "diff_on_spark"]

_SUBTREES_PER_CORE = 4  # the driver opens levels until it has this many subtrees per core
_FILES_PER_TASK = 256  # the loose files the driver found are hashed in slices this big


def _schema() -> Any:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    return StructType(
        [
            StructField("path", StringType(), False),
            StructField("size", LongType(), False),
            StructField("mtime_ns", LongType(), False),
            StructField("sha1", StringType(), False),
            StructField("xxh3", StringType(), False),
        ]
    )


def build_on_spark(spark: Any, root: str | os.PathLike[str], out: str) -> ManifestStats:
    """List and hash ``root`` on ``spark``; write the manifest at ``out`` (a new path)."""
    root_s = os.path.abspath(os.fspath(root))
    if os.path.exists(out) or os.path.islink(out):
        raise ManifestError(f"{out}: already exists")
    cores = max(1, int(spark.sparkContext.defaultParallelism))
    files, subtrees = split_tree(root_s, cores * _SUBTREES_PER_CORE)
    work: list[tuple[tuple[str, ...], tuple[str, ...]]] = [((sub,), ()) for sub in subtrees]
    for at in range(0, len(files), _FILES_PER_TASK):
        work.append(((), tuple(files[at : at + _FILES_PER_TASK])))
    sc = spark.sparkContext
    unreadable = sc.accumulator(0)

    def hash_share(share: tuple[tuple[str, ...], tuple[str, ...]]) -> Any:
        subs, loose = share
        for row in rows_of(root_s, subs, loose):
            if isinstance(row, ManifestRow):
                yield (row.path, row.size, row.mtime_ns, row.sha1, row.xxh3)
            else:
                unreadable.add(1)

    slices = max(1, min(len(work), cores * _SUBTREES_PER_CORE))
    rdd = sc.parallelize(work, slices).flatMap(hash_share) if work else sc.emptyRDD()
    frame = spark.createDataFrame(rdd, _schema()).cache()
    try:
        frame.orderBy("path").coalesce(1).write.parquet(out)
        totals = frame.agg({"size": "sum", "path": "count"}).collect()[0]
    finally:
        frame.unpersist()
    files_n = int(totals["count(path)"])
    octets = int(totals["sum(size)"] or 0)
    return ManifestStats(files_n, octets, int(unreadable.value))


def diff_on_spark(spark: Any, a: str, b: str) -> Any:
    """A DataFrame of (change, path) from manifest ``a`` to ``b``, sorted by path.

    The same classes as ``filemq.manifest.classify``: added, removed, changed (size,
    SHA-1 or xxh3 differ), touched (only the mtime differs).
    """
    from pyspark.sql import functions as F

    for path in (a, b):
        if not os.path.exists(path):
            raise ManifestError(f"{path}: no such manifest")
    left = spark.read.parquet(a).select(*[F.col(c).alias(f"a_{c}") for c in COLUMNS])
    right = spark.read.parquet(b).select(*[F.col(c).alias(f"b_{c}") for c in COLUMNS])
    joined = left.join(right, left["a_path"] == right["b_path"], "full_outer")
    content_differs = (
        (F.col("a_size") != F.col("b_size"))
        | (F.col("a_sha1") != F.col("b_sha1"))
        | (F.col("a_xxh3") != F.col("b_xxh3"))
    )
    change = (
        F.when(F.col("a_path").isNull(), F.lit("added"))
        .when(F.col("b_path").isNull(), F.lit("removed"))
        .when(content_differs, F.lit("changed"))
        .when(F.col("a_mtime_ns") != F.col("b_mtime_ns"), F.lit("touched"))
    )
    return (
        joined.select(
            change.alias("change"), F.coalesce(F.col("a_path"), F.col("b_path")).alias("path")
        )
        .where(F.col("change").isNotNull())
        .orderBy("path")
    )
