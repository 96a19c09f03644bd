"""One SparkSession (local[2]) for every Spark test of a run (~5 s to start).

Spark tests are marked ``spark`` and left out by default; ``pytest -m spark`` runs them
(``.ci/run`` does).  Without pyspark, pyarrow or Java they skip with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from zerohub import sparkkit


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    try:
        sparkkit.require()
    except sparkkit.SparkUnavailable as exc:
        pytest.skip(str(exc))
    # local[2] with up to 3 attempts per task (local mode's default is 1: no retries; the
    # writer's retry test needs them)
    session = sparkkit.session(
        "local[2,3]",
        "zerohub-tests",
        **{
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.sql.streaming.stopTimeout": "30000",
        },
    )
    yield session
    session.stop()
