"""PySpark's data source discovery finds ``zerohub`` here (modules named ``pyspark_*``
holding a ``DefaultSource``); ``broker.spark.register`` does the same explicitly."""

from broker.spark.source import ZerohubDataSource as DefaultSource

__all__ = ["DefaultSource"]
