"""Drainer configuration (`drainer.toml`, kebab-case keys; defaults like TiDB-Binlog's drainer).

One sink per drainer: `sink` names it (file, grpc, mysql, spark) and the `[to]` table holds its
options, as TiDB-Binlog's `[syncer.to]` does. Run several named drainers for several sinks.
`[filter]` holds the replication filters (drainer/filter.py); `ha = true` runs this instance as
an active/standby member of the drainers sharing its name (drainer/ha.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sluice.core.errors import ConfigError
from sluice.core.etcd import check_endpoints
from sluice.core.tls import SecurityConfig
from sluice.drainer.filter import FilterConfig, TxnFilter
from sluice.drainer.sink import sink_options


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
    status_poll_interval: float = 0.5     # how soon a change of its own (watched) status is acted on
    txn_batch: int = 2048                 # transactions per sink apply (never splits one)
    reader_queue: int = 20000             # merge-buffered transactions per pump (back-pressure)
    reconnect_max_backoff: float = 2.0    # pump stream reconnect backoff cap, seconds
    skip_corrupt: bool = False            # skip undecodable transactions instead of stopping
    dedupe_window: int = 4096
    # A sink that forwards stored binlogs (grpc) gets plain pump responses merged as Arrow
    # columns (drainer/columnar.py); false: per-transaction tuples, as for the other sinks.
    columnar_merge: bool = True
    source_name: str = "sluice"           # Debezium topic prefix when a producer sets none
    metrics_addr: str = ""
    # HA (DESIGN §6): several instances with the same name, one active; the lease TTL is
    # alive-ttl and the active stops itself at alive-ttl - ha-margin without acknowledged
    # keepalives. false: single instance, exactly as before (an epoch is still taken).
    ha: bool = False
    ha_margin: float = 0.5                # seconds
    sink: str = "file"
    to: dict[str, Any] = field(default_factory=dict)
    filter: FilterConfig = field(default_factory=FilterConfig)
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
        if self.ha:
            if self.alive_ttl < 2:
                raise ConfigError(f"alive-ttl must be >= 2 with ha = true (it is the leader lease "
                                  f"TTL), got {self.alive_ttl}")
            # Keepalives go out every TTL/3; the margin must leave room for one late ack.
            if not 0 < self.ha_margin < self.alive_ttl / 2:
                raise ConfigError(f"ha-margin must be > 0 and < alive-ttl / 2 "
                                  f"({self.alive_ttl / 2:g}), got {self.ha_margin}")

    def validate(self, where: str) -> None:
        """Everything a drainer can check before its first network call, so a typo is reported
        as a typo (exit 2) even with etcd down: the endpoints, the filter, and the sink's `[to]`
        table through the sink's own config class (drainer/sink.py SINK_CONFIGS)."""
        check_endpoints(self.etcd, f"{where}: key 'etcd'")
        try:
            active = TxnFilter(self.filter).active
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
        if self.sink == "grpc" and active:
            raise ConfigError(f"{where}: [filter] is set but the grpc sink forwards binlogs as "
                              "stored: filter in its consumers, or drop the [filter] table")
        try:
            sink_options(self.sink, self.to, where)
        except ConfigError as e:
            text = str(e)
            raise ConfigError(text if text.startswith(where) else
                              f"{where}: key 'sink': {text}") from None

    def resolved_name(self) -> str:
        return self.name or "drainer-" + (self.advertise_addr or self.addr).replace(":", "-")

    def resolved_advertise(self) -> str:
        return self.advertise_addr or self.addr
