"""Partition registration on the sink's hot path, straight on the Hive metastore client.

`ALTER TABLE t ADD PARTITION (...) LOCATION '...'` as SQL also parses and analyzes the
statement, refreshes the table through the public catalog API and recomputes its size
statistics, and Spark's catalog layers each fetch the table again before the metastore fetches
it once more itself: measured on Derby, 156 JDBC statements per partition, every one a round
trip to the metastore server. Under load those round trips are what a batch waits for (a batch
registers one raw partition per table it touches, then its commit point). Here the partition is
built from the table's own storage descriptor (fetched once per table) and handed to the Hive
metastore client Spark's catalog wraps: 35–40 statements and five py4j calls. The session's
cached relation of the table is invalidated after, as the SQL command does.

Invariant: the result is the SQL statement's — the partition's values, qualified location and
storage are what `ALTER TABLE ... ADD PARTITION` stores (the test compares them); if the JVM
classes do not have the shapes this module was written against (another Spark or Hive
version), it says so once and runs the SQL instead. An existing partition is a no-op with
`if_not_exists` and PartitionExists without (the commit point relies on the refusal).
"""
from __future__ import annotations

import logging
import time
from typing import Any

from sluice.core.errors import SluiceError
from sluice.spark_sink.layout import q

log = logging.getLogger(__name__)


class PartitionExists(SluiceError):
    """ADD PARTITION without IF NOT EXISTS met an existing partition."""


def _already_exists(e: BaseException) -> bool:
    text = str(e)
    return "AlreadyExists" in text or "PARTITIONS_ALREADY_EXIST" in text


def _exists(db: str, table: str, spec: dict[str, int]) -> PartitionExists:
    return PartitionExists(f"partition {spec} of {db}.{table} exists")


class PartitionAdder:
    """`add(db, table, spec, location, if_not_exists=True)`: ADD PARTITION, on one session.

    Every py4j call is a round trip that needs the GIL back, which the drainer's decoding holds
    in the meantime: the metastore client, each table's storage descriptor and partition keys
    are looked up once, and an add makes five calls. Call from one thread at a time."""

    def __init__(self, spark: Any) -> None:
        self._spark = spark
        self._direct = True
        self._jvm: dict[str, Any] = {}
        self._tables: dict[tuple[str, str], tuple[Any, Any, list[str]]] = {}

    def add(self, db: str, table: str, spec: dict[str, int], location: str,
            if_not_exists: bool = True) -> None:
        if self._direct:
            from py4j.protocol import Py4JError, Py4JJavaError
            try:
                self._add_direct(db, table, spec, location, if_not_exists)
                return
            except Py4JJavaError as e:
                # The metastore's own answer: the SQL statement would meet it too.
                if _already_exists(e):
                    raise _exists(db, table, spec) from e
                raise
            except (Py4JError, TypeError, AttributeError) as e:
                # A method or class of another shape (a JavaPackage is not callable): fall back.
                log.warning("registering partitions on the metastore client failed (%s); "
                            "using ALTER TABLE statements", str(e).splitlines()[0])
                self._direct = False
        parts = ", ".join(f"{q(k)}={v}" for k, v in spec.items())
        try:
            self._spark.sql(f"ALTER TABLE {q(db, table)} ADD "
                            f"{'IF NOT EXISTS ' if if_not_exists else ''}PARTITION ({parts}) "
                            f"LOCATION '{location}'")
        except Exception as e:  # noqa: BLE001 - only the refusal of an existing one is ours
            if not if_not_exists and _already_exists(e):
                raise _exists(db, table, spec) from e
            raise

    def forget(self) -> None:
        """Look the tables up again (after a change to a table's definition)."""
        self._tables.clear()

    def _classes(self) -> dict[str, Any]:
        if not self._jvm:
            jvm = self._spark._jvm
            catalog = self._spark._jsparkSession.sessionState().catalog()
            # ExternalCatalogWithListener -> HiveExternalCatalog -> HiveClientImpl -> Hive
            hive = catalog.externalCatalog().unwrapped().client().client()
            utils = jvm.org.apache.spark.sql.catalyst.catalog.CatalogUtils
            # How the SQL command stores a location: qualified on the default file system
            # ("/x" -> "file:/x"); one prefix serves every absolute path without a scheme.
            root = utils.URIToString(catalog.makeQualifiedPath(utils.stringToURI("/")))
            self._jvm.update(
                catalog=catalog, msc=hive.getMSC(), api=jvm.org.apache.hadoop.hive.metastore.api,
                ident=jvm.org.apache.spark.sql.catalyst.TableIdentifier, some=jvm.scala.Some,
                prefix=root[:-1] if root.endswith("/") else None, utils=utils)
        return self._jvm

    def _qualified(self, location: str) -> str:
        c = self._jvm
        if location.startswith("/") and c["prefix"] is not None:
            return c["prefix"] + location
        u = c["utils"]
        return str(u.URIToString(c["catalog"].makeQualifiedPath(u.stringToURI(location))))

    def _add_direct(self, db: str, table: str, spec: dict[str, int], location: str,
                    if_not_exists: bool) -> None:
        c = self._classes()
        entry = self._tables.get((db, table))
        if entry is None:
            hive_table = c["msc"].getTable(db, table)
            keys = [k.getName() for k in hive_table.getPartitionKeys()]
            entry = self._tables[(db, table)] = (c["ident"](table, c["some"](db)),
                                                 hive_table.getSd(), keys)
        ident, table_sd, keys = entry
        if sorted(spec) != sorted(keys):
            raise SluiceError(f"partition spec {spec} does not name {db}.{table}'s partition "
                              f"columns {keys}")
        values = [str(spec[k]) for k in keys]
        # What Hive's Partition.createMetaPartitionObject builds for the SQL command: a deep
        # copy of the table's storage descriptor at the partition's location.
        sd = c["api"].StorageDescriptor(table_sd)
        sd.setLocation(self._qualified(location))
        part = c["api"].Partition(values, db, table, int(time.time()), 0, sd, {})
        c["msc"].add_partitions([part], if_not_exists, False)
        c["catalog"].refreshTable(ident)
