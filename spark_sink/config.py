"""Spark sink configuration: the drainer's `[to]` table when `sink = "spark"` (kebab-case keys).

Every key has a default except `root` (where the sink's files live). The session keys (master,
metastore, spark-conf, ...) are shared with `sluice spark-sql`, which reads the same table so a
reader looks at the same catalog the sink writes.
"""
from __future__ import annotations

import dataclasses
import re

from sluice.core.errors import ConfigError

_HOSTPORT = re.compile(r"^[A-Za-z0-9_.-]+:\d{1,5}$")


@dataclasses.dataclass(frozen=True)
class SessionConfig:
    """How to build a SparkSession on the shared Hive metastore (Derby network server)."""

    master: str = "local[*]"
    # host:port of the Derby network server holding the Hive metastore ("" = Spark's default
    # embedded Derby, usable by one JVM only).
    metastore: str = "127.0.0.1:1527"
    metastore_db: str = "metastore_db"
    warehouse: str = ""                 # spark.sql.warehouse.dir ("" = Spark's default)
    app_name: str = "sluice"
    log_level: str = "WARN"
    shuffle_partitions: int = 4
    spark_conf: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.metastore and not _HOSTPORT.match(self.metastore):
            raise ConfigError(f"spark: metastore must be host:port of the Derby network server, "
                              f"got {self.metastore!r}")
        if self.shuffle_partitions <= 0:
            raise ConfigError(f"spark: shuffle-partitions must be positive, got "
                              f"{self.shuffle_partitions}")


@dataclasses.dataclass(frozen=True)
class SparkSinkConfig(SessionConfig):
    root: str = ""                      # directory (or Hadoop URI) for every file of the sink
    database: str = "{schema}"          # catalog database per source schema ({schema}, {source})
    meta_database: str = "sluice"       # commit table, raw and base tables
    batch_rows: int = 100_000           # commit a micro-batch at this many buffered rows
    batch_interval: float = 5.0         # ... or when the oldest buffered row is this old (s)
    compact_every: int = 0              # compact a table after this many committed batches (0: off)
    gc_grace: float = 600.0             # keep replaced files this long (s) for running readers
    merge_small_files: bool = True      # after a compaction, merge the batches it covers

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.root:
            raise ConfigError("[to] spark sink: missing required key 'root' (a directory for "
                              "the sink's files)")
        if self.batch_rows <= 0 or self.batch_interval <= 0:
            raise ConfigError("[to] spark sink: batch-rows and batch-interval must be positive")
        if "{schema}" not in self.database:
            raise ConfigError(f"[to] spark sink: database {self.database!r} must contain "
                              "'{schema}' (one catalog database per source schema)")
        if self.compact_every < 0 or self.gc_grace < 0:
            raise ConfigError("[to] spark sink: compact-every and gc-grace must be >= 0")
