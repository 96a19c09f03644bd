"""The ``zerohub`` Python data source: one class Spark knows by name."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from broker.spark.options import OptionError, ReadOptions, WriteOptions
from broker.spark.reader import BatchReader, StreamReader
from broker.spark.rows import SCHEMA
from broker.spark.writer import BatchWriter, StreamWriter, check_columns


class ZerohubDataSource(DataSource):
    """A broker queue as a Spark source and sink (see ``broker.spark``)."""

    @classmethod
    def name(cls) -> str:
        return "zerohub"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(ReadOptions.parse(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(ReadOptions.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        self._check_write(schema, overwrite)
        return BatchWriter(WriteOptions.parse(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        self._check_write(schema, overwrite)
        return StreamWriter(WriteOptions.parse(self.options))

    @staticmethod
    def _check_write(schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise OptionError("zerohub sink: a queue is appended to (mode 'append' only)")
        check_columns(schema)
