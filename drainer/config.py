"""Drainer configuration (`drainer.toml`, kebab-case keys; defaults like TiDB-Binlog's drainer).

One sink per drainer: `sink` names it (file, grpc, mysql, spark) and the `[to]` table holds its
options, as TiDB-Binlog's `[syncer.to]` does. Run several named drainers for several sinks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sluice.core.errors import ConfigError
from sluice.core.tls import SecurityConfig


@dataclass
class DrainerConfig:
    cluster_id: int = 1
    name: str = ""                        # node id; default: drainer-<host>-<port>
    addr: str = "127.0.0.1:8249"          # Cistern.Notify and Drainer.PullBinlogs
    advertise_addr: str = ""
    etcd: str = "127.0.0.1:2379"
    tso: list[str] = field(default_factory=list)   # TSO addresses; empty: leader from etcd
    # Where a drainer without a saved checkpoint starts: -1 = now (a fresh TSO ts),
    # 0 = everything the pumps still hold, else that ts (exclusive: checkpoints are inclusive).
    initial_commit_ts: int = -1
    checkpoint_interval: float = 3.0      # seconds between checkpoint saves
    alive_ttl: int = 5                    # lease TTL of the alive key, seconds
    status_poll_interval: float = 0.5     # how often the drainer reads its own status
    txn_batch: int = 2048                 # transactions per sink apply (never splits one)
    reader_queue: int = 20000             # merge-buffered transactions per pump (back-pressure)
    reconnect_max_backoff: float = 2.0    # pump stream reconnect backoff cap, seconds
    skip_corrupt: bool = False            # skip undecodable transactions instead of stopping
    dedupe_window: int = 4096
    source_name: str = "sluice"           # Debezium topic prefix when a producer sets none
    metrics_addr: str = ""
    sink: str = "file"
    to: dict[str, Any] = field(default_factory=dict)
    security: SecurityConfig = field(default_factory=SecurityConfig)

    def __post_init__(self) -> None:
        if self.initial_commit_ts < -1:
            raise ConfigError(f"initial-commit-ts must be -1 (now), 0 or a ts, got {self.initial_commit_ts}")
        for key, value in (("checkpoint-interval", self.checkpoint_interval),
                           ("status-poll-interval", self.status_poll_interval),
                           ("reconnect-max-backoff", self.reconnect_max_backoff)):
            if value <= 0:
                raise ConfigError(f"{key} must be > 0, got {value}")
        for key, n in (("txn-batch", self.txn_batch), ("reader-queue", self.reader_queue),
                       ("alive-ttl", self.alive_ttl), ("dedupe-window", self.dedupe_window)):
            if n < 1:
                raise ConfigError(f"{key} must be >= 1, got {n}")

    def resolved_name(self) -> str:
        return self.name or "drainer-" + (self.advertise_addr or self.addr).replace(":", "-")

    def resolved_advertise(self) -> str:
        return self.advertise_addr or self.addr
