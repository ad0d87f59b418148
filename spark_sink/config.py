"""Spark sink configuration: the drainer's `[to]` table when `sink = "spark"` (kebab-case keys).

The session keys (master, catalog, warehouse, spark-conf, ...) are shared with `sluice spark-sql`,
`sluice ctl verify --spark-config` and any reader: they read the same `[to]` table, so they look
at the catalog the sink writes. Only `warehouse` is required.
"""
from __future__ import annotations

import dataclasses
import os
import re

from sluice.core.errors import ConfigError

CATALOG_TYPES = ("jdbc", "hive", "rest", "hadoop")
ON_UNMAPPABLE = ("stop", "skip-table", "as-string")
CURRENT_STATE_METHODS = ("delete", "equality-deletes")   # writer.CURRENT_STATE_METHODS
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclasses.dataclass(frozen=True)
class SessionConfig:
    """How to build a SparkSession with the Iceberg runtime and the sink's catalog."""

    master: str = "local[*]"           # Spark master: local[N], spark://host:port, yarn, ...
    # Where table data and metadata files live: a directory or any Hadoop URI.
    warehouse: str = ""
    catalog: str = "sluice"             # the Spark catalog name (spark.sql.catalog.<catalog>)
    catalog_type: str = "jdbc"          # jdbc | hive | rest | hadoop
    # jdbc: "" = an SQLite file `catalog.db` in a local warehouse (no server; several JVMs
    # share it); else jdbc:postgresql://..., jdbc:mariadb://... hive: thrift://host:port.
    # rest: http(s)://host:port/...
    catalog_uri: str = ""
    # Extra catalog properties (spark.sql.catalog.<catalog>.<key>), e.g. jdbc.user, jdbc.password.
    catalog_properties: dict[str, str] = dataclasses.field(default_factory=dict)
    app_name: str = "sluice"            # spark.app.name
    log_level: str = "WARN"             # the JVM's log level (known-noisy loggers: ERROR)
    shuffle_partitions: int = 4         # spark.sql.shuffle.partitions (MERGE, maintenance)
    spark_conf: dict[str, str] = dataclasses.field(default_factory=dict)  # any Spark setting (wins)

    def __post_init__(self) -> None:
        if not self.warehouse and self.catalog_type in ("jdbc", "hadoop"):
            raise ConfigError("spark: missing required key 'warehouse' (a directory or URI for "
                              "the Iceberg tables' files)")
        if self.catalog_type not in CATALOG_TYPES:
            raise ConfigError(f"spark: catalog-type must be one of {', '.join(CATALOG_TYPES)}, "
                              f"got {self.catalog_type!r}")
        if not _NAME.match(self.catalog):
            raise ConfigError(f"spark: catalog must be a plain identifier, got {self.catalog!r}")
        if self.catalog_type == "jdbc" and not self.catalog_uri and "://" in self.warehouse \
                and not self.warehouse.startswith("file:"):
            raise ConfigError("spark: the embedded SQLite catalog needs a local warehouse; give "
                              "catalog-uri (jdbc:postgresql://..., jdbc:mariadb://...) for "
                              f"warehouse {self.warehouse!r}")
        if self.catalog_type in ("hive", "rest") and not self.catalog_uri:
            raise ConfigError(f"spark: catalog-type {self.catalog_type!r} needs catalog-uri")
        if self.shuffle_partitions <= 0:
            raise ConfigError(f"spark: shuffle-partitions must be positive, got "
                              f"{self.shuffle_partitions}")

    @property
    def warehouse_uri(self) -> str:
        w = self.warehouse
        if w and "://" not in w and not w.startswith("file:"):
            w = "file://" + os.path.abspath(w)
        return w

    @property
    def sqlite_path(self) -> str | None:
        """The embedded catalog's SQLite file, or None for another catalog."""
        if self.catalog_type != "jdbc":
            return None
        if self.catalog_uri:
            return self.catalog_uri[len("jdbc:sqlite:"):].split("?")[0] \
                if self.catalog_uri.startswith("jdbc:sqlite:") else None
        w = self.warehouse_uri
        return os.path.join(w[len("file://"):] if w.startswith("file://") else w[5:], "catalog.db")

    @property
    def jdbc_uri(self) -> str:
        if self.catalog_uri:
            return self.catalog_uri
        # WAL lets readers in other JVMs (and pyiceberg) read while the sink commits; the busy
        # timeout makes concurrent committers wait for the file lock instead of failing.
        return f"jdbc:sqlite:{self.sqlite_path}?journal_mode=WAL&busy_timeout=30000"


@dataclasses.dataclass(frozen=True)
class SparkSinkConfig(SessionConfig):
    database: str = "{schema}"          # catalog namespace per source schema ({schema}, {source})
    meta_database: str = "sluice"       # the `_sluice_commits` marker table
    batch_rows: int = 100_000           # commit a micro-batch at this many buffered changes
    batch_interval: float = 5.0         # ... or when the oldest buffered change is this old (s)
    # How the current tables take a DELETE or MERGE: merge-on-read writes the changed rows and
    # position deletes (cost follows the batch); copy-on-write rewrites every data file a
    # changed key is in (cost follows the table). docs/spark.md has the measurement behind the
    # default.
    write_mode: str = "merge-on-read"
    # How a keyed current table drops the rows of the keys a batch changes before the append
    # of their last images: delete (position deletes of their rows, found by the driver in the
    # data files' key columns and committed with the images through the Iceberg API, no Spark
    # job; every Iceberg reader reads the result) or equality-deletes (an equality-delete file,
    # no lookup; pyiceberg 0.12 cannot read such a table until maintenance's rewrite folds the
    # deletes in: docs/spark.md "Current-state methods").
    current_state: str = "delete"
    # Iceberg maintenance (rewrite data files, expire snapshots, remove orphan files) after this
    # many committed batches (0: off); snapshots younger than snapshot-retention seconds, and
    # the last retain-snapshots of each table, are kept for time travel and running readers.
    maintenance_every: int = 100
    snapshot_retention: float = 86_400.0  # seconds a snapshot is kept (time travel, --as-of)
    retain_snapshots: int = 100         # ... and at least this many per table
    # A schema change the tables cannot follow: stop (name table, column, DDL), skip-table (the
    # table's changes are dropped from then on, logged), as-string (the column becomes STRING).
    on_unmappable: str = "stop"
    # Per-table overrides of on-unmappable: {"db.table" = "skip-table"}.
    table_on_unmappable: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.batch_rows <= 0 or self.batch_interval <= 0:
            raise ConfigError("[to] spark sink: batch-rows and batch-interval must be positive")
        if "{schema}" not in self.database:
            raise ConfigError(f"[to] spark sink: database {self.database!r} must contain "
                              "'{schema}' (one catalog namespace per source schema)")
        if self.write_mode not in ("merge-on-read", "copy-on-write"):
            raise ConfigError(f"[to] spark sink: write-mode must be merge-on-read or "
                              f"copy-on-write, got {self.write_mode!r}")
        if self.current_state not in CURRENT_STATE_METHODS:
            raise ConfigError(f"[to] spark sink: current-state must be one of "
                              f"{', '.join(CURRENT_STATE_METHODS)}, got {self.current_state!r}")
        if self.maintenance_every < 0 or self.snapshot_retention < 0 or self.retain_snapshots < 1:
            raise ConfigError("[to] spark sink: maintenance-every and snapshot-retention must be "
                              ">= 0, retain-snapshots >= 1")
        for where, v in [("on-unmappable", self.on_unmappable),
                         *((f"table-on-unmappable.{k}", v)
                           for k, v in self.table_on_unmappable.items())]:
            if v not in ON_UNMAPPABLE:
                raise ConfigError(f"[to] spark sink: {where} must be one of "
                                  f"{', '.join(ON_UNMAPPABLE)}, got {v!r}")

    def unmappable_policy(self, db: str, table: str) -> str:
        return self.table_on_unmappable.get(f"{db}.{table}", self.on_unmappable)
