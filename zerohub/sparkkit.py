"""Starting Spark for zerohub's jobs (``filemq manifest --spark``, ``broker.spark``).

PySpark and pyarrow come with the ``spark`` extra (``pip install 'zerohub[spark]'``);
Spark itself needs a Java 17+ runtime (``java`` on PATH or ``JAVA_HOME``).  Two traps this
module takes away from users (measured with pyspark 4.3):

* Spark's Python workers start the ``python3`` found on PATH, not the interpreter that
  runs the driver: every Python data source call and every Python function then fails
  (or runs without zerohub installed).  :func:`use_this_python` points
  ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON`` at ``sys.executable`` unless the user
  set them.
* The Python Data Source API needs pyarrow, which ``pip install pyspark`` does not pull
  in: :func:`require` says so in one line instead of a worker's traceback.

Nothing here imports pyspark at module load: ``filemq`` and ``broker`` stay usable
without the extra.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from typing import Any

__all__ = [
    "DEFAULT_MASTER",
    "START_ATTEMPTS",
    "SparkUnavailable",
    "processing",
    "require",
    "runner_too_late",
    "session",
    "use_this_python",
]

#: The master a command uses when none is given: every core of this machine.
DEFAULT_MASTER = "local[*]"


class SparkUnavailable(RuntimeError):
    """PySpark, pyarrow or Java is missing (the message says how to get it)."""


def require() -> None:
    """Raise SparkUnavailable unless pyspark, pyarrow and a Java runtime are there."""
    missing = [name for name in ("pyspark", "pyarrow") if not _importable(name)]
    if missing:
        raise SparkUnavailable(
            f"{' and '.join(missing)} not installed: pip install 'zerohub[spark]'"
        )
    java_home = os.environ.get("JAVA_HOME")
    if not shutil.which("java") and not (
        java_home and os.path.exists(os.path.join(java_home, "bin", "java"))
    ):
        raise SparkUnavailable("no Java runtime (Spark needs Java 17+): install openjdk-17")


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def use_this_python() -> None:
    """Make Spark's Python workers run this interpreter (unless the user chose one)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def session(master: str = DEFAULT_MASTER, app_name: str = "zerohub", **conf: str) -> Any:
    """A SparkSession on ``master`` (created, or the running one), set up for zerohub.

    ``conf``: extra Spark settings (``spark.sql.shuffle.partitions="4"``...).  The web UI
    is off unless a setting turns it on.
    """
    require()
    use_this_python()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    settings = {"spark.ui.enabled": "false", **conf}
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


#: Starts of one streaming query at most in :func:`processing`.
START_ATTEMPTS = 5


def runner_too_late(exc: BaseException) -> bool:
    """Whether ``exc`` is Spark giving up on a Python runner connecting back.  Spark starts
    a streaming Python data source's runner as a fresh process that must connect back
    within 10 s (fixed in Spark): on an overloaded machine it may not, and the query
    fails before reading anything."""
    return "connect back" in str(exc)


def processing(
    start: Callable[[], Any], attempts: int = START_ATTEMPTS
) -> tuple[Any, list[dict[str, Any]]]:
    """Start a streaming query (``start()`` returns it) and wait until it has processed
    everything available; when Spark's Python runner came up too late, stop it and start
    it again (from its checkpoint, when it has one), ``attempts`` times at most.  Any
    other failure is raised at once.  Returns the query, still running (the caller stops
    it), and the progress reports of earlier attempts' micro-batches that read rows."""
    earlier: list[dict[str, Any]] = []
    for _ in range(attempts):
        query = start()
        try:
            query.processAllAvailable()
            return query, earlier
        except Exception as exc:
            query.stop()
            if not runner_too_late(exc):
                raise
        earlier += [p for p in query.recentProgress if p["numInputRows"]]
    raise RuntimeError(f"Spark's Python runner did not connect back in {attempts} starts")
