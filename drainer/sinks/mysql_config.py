"""The MySQL sink's configuration ([sink.mysql] in the drainer config, docs/config.md)."""
from __future__ import annotations

import dataclasses

from sluice.core.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class MySQLSinkConfig:
    host: str = "127.0.0.1"
    port: int = 3306
    user: str = "root"
    password: str = ""
    # 4, not TiDB-Binlog's 16: on 2 cores 4 workers applied the benchmark's rows with ~40% less
    # CPU (Python and mariadbd) than 16 (docs/mysql-sink.md, Throughput).
    worker_count: int = 4
    txn_batch: int = 20
    txn_batch_backlog: int = 500
    safe_mode: bool = False
    checkpoint_schema: str = "sluice"
    name: str = ""
    disable_binlog: bool = False
    read_committed: bool = True
    sql_mode: str = "STRICT_TRANS_TABLES,NO_AUTO_VALUE_ON_ZERO,NO_ENGINE_SUBSTITUTION"
    max_retries: int = 8
    retry_backoff_ms: int = 50
    retry_backoff_max_ms: int = 2000
    dispatched_upper_lead_ms: int = 3000
    connect_timeout: float = 5.0
    lock_wait_timeout: int = 10
    takeover_timeout: float = 30.0
    queue_size: int = 1024
    # Create missing databases and tables (CREATE ... IF NOT EXISTS, shape from the schema
    # history) before their first row or DDL; never alters an existing table.
    create_tables: bool = True

    def __post_init__(self) -> None:
        for key, value, low in (("worker-count", self.worker_count, 1), ("txn-batch", self.txn_batch, 1),
                                ("txn-batch-backlog", self.txn_batch_backlog, 1),
                                ("max-retries", self.max_retries, 0), ("queue-size", self.queue_size, 1),
                                ("lock-wait-timeout", self.lock_wait_timeout, 1),
                                ("dispatched-upper-lead-ms", self.dispatched_upper_lead_ms, 0)):
            if value < low:
                raise ConfigError(f"mysql sink: {key} must be >= {low}, got {value}")
        if not self.checkpoint_schema:
            raise ConfigError("mysql sink: checkpoint-schema must not be empty")
