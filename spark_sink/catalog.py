"""Partition registration on the sink's hot path, through Spark's session catalog.

`ALTER TABLE t ADD IF NOT EXISTS PARTITION (...) LOCATION '...'` as SQL also parses and analyzes
the statement, refreshes the table through the public catalog API and recomputes its size
statistics; called on the session catalog it does only the metastore work: 53 ms instead of
148 ms per partition on this machine, and the gap grows with the load (a batch registers one
raw partition per table it touches). Same effect: `SessionCatalog.createPartitions` qualifies
the location as the SQL command does, and the table's cached relation is invalidated after.

Invariant: the result is the SQL statement's — if the JVM classes do not have the shapes this
module was written against (another Spark version), it says so once and runs the SQL instead.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from sluice.spark_sink.layout import q

log = logging.getLogger(__name__)


class PartitionAdder:
    """`add(db, table, spec, location)`: ADD IF NOT EXISTS PARTITION, on one session.

    Every py4j call is a round trip that needs the GIL back, which the drainer's decoding holds
    in the meantime: JVM classes and each table's identifier and storage format are looked up
    once, and an add makes 8 calls."""

    def __init__(self, spark: Any) -> None:
        self._spark = spark
        self._direct = True
        self._jvm: dict[str, Any] = {}
        self._tables: dict[tuple[str, str], tuple[Any, list[Any]]] = {}

    def add(self, db: str, table: str, spec: dict[str, int], location: str) -> None:
        if self._direct:
            from py4j.protocol import Py4JError, Py4JJavaError
            try:
                self._add_direct(db, table, spec, location)
                return
            except Py4JJavaError:
                raise   # the metastore's own failure: the SQL statement would meet it too
            except (Py4JError, TypeError, AttributeError) as e:
                # A method or class of another shape (a JavaPackage is not callable): fall back.
                log.warning("registering partitions through the session catalog failed (%s); "
                            "using ALTER TABLE statements", str(e).splitlines()[0])
                self._direct = False
        parts = ", ".join(f"{q(k)}={v}" for k, v in spec.items())
        self._spark.sql(f"ALTER TABLE {q(db, table)} ADD IF NOT EXISTS PARTITION ({parts}) "
                        f"LOCATION '{location}'")

    def forget(self) -> None:
        """Look the tables up again (after a change to a table's definition)."""
        self._tables.clear()

    def _classes(self) -> dict[str, Any]:
        if not self._jvm:
            jvm = self._spark._jvm
            cat = jvm.org.apache.spark.sql.catalyst.catalog
            self._jvm.update(
                catalog=self._spark._jsparkSession.sessionState().catalog(),
                ident=jvm.org.apache.spark.sql.catalyst.TableIdentifier, some=jvm.scala.Some,
                uri=cat.CatalogUtils.stringToURI, partition=cat.CatalogTablePartition,
                none=jvm.scala.Option.empty(), no_params=jvm.PythonUtils.toScalaMap({}),
                map=jvm.PythonUtils.toScalaMap, seq=jvm.PythonUtils.toSeq)
        return self._jvm

    def _add_direct(self, db: str, table: str, spec: dict[str, int], location: str) -> None:
        c = self._classes()
        entry = self._tables.get((db, table))
        if entry is None:
            ident = c["ident"](table, c["some"](db))
            storage = c["catalog"].getTableMetadata(ident).storage()
            # CatalogStorageFormat(locationUri, inputFormat, outputFormat, serde, compressed,
            # properties, <one more field in Spark 4>): copied with the partition's location.
            fields = [storage.productElement(i) for i in range(storage.productArity())]
            entry = self._tables[(db, table)] = (ident, [storage, *fields])
        ident, (storage, *fields) = entry
        part_storage = storage.copy(c["some"](c["uri"](location)), *fields[1:])
        part = c["partition"](c["map"]({k: str(v) for k, v in spec.items()}), part_storage,
                              c["no_params"], int(time.time() * 1000), -1, c["none"])
        c["catalog"].createPartitions(ident, c["seq"]([part]), True)
        c["catalog"].refreshTable(ident)
