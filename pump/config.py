"""Pump configuration (`pump.toml`, kebab-case keys; defaults like TiDB-Binlog's pump)."""
from __future__ import annotations

from dataclasses import dataclass, field

from sluice.core.errors import ConfigError
from sluice.core.etcd import check_endpoints
from sluice.core.tls import SecurityConfig

from .storage.options import StorageConfig

__all__ = ["PumpConfig", "StorageConfig"]


@dataclass
class PumpConfig:
    cluster_id: int = 1
    node_id: str = ""                    # default: pump-<host>-<port>
    addr: str = "127.0.0.1:8250"
    advertise_addr: str = ""
    data_dir: str = "data.pump"
    etcd: str = "127.0.0.1:2379"
    tso: list[str] = field(default_factory=list)   # TSO addresses; empty: leader from etcd
    heartbeat_interval: float = 3.0      # fake binlog when no commit moved the watermark for this long (s)
    pull_heartbeat_interval: float = 1.0  # ... this long while a drainer pulls
    alive_ttl: int = 5                   # lease TTL of the alive key, seconds
    txn_timeout: float = 15.0            # ask the producer about a prewrite older than this
    gc_retention: float = 7 * 86400.0    # seconds of binlogs kept beyond drainer checkpoints
    gc_interval: float = 60.0
    gc_force: bool = False               # ignore drainer checkpoints (loses data they need)
    score: int = 100                     # routing weight for the client's `score` strategy
    replicas: int = 1                    # cluster-wide copies of each binlog (must match etcd)
    metrics_addr: str = ""
    storage: StorageConfig = field(default_factory=StorageConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)

    def validate(self, where: str) -> None:
        """What a pump checks before any side effect (data dir, etcd)."""
        check_endpoints(self.etcd, f"{where}: key 'etcd'")
        if self.replicas < 1:
            raise ConfigError(f"{where}: key 'replicas' is {self.replicas}: must be >= 1")

    def resolved_node_id(self) -> str:
        return self.node_id or "pump-" + (self.advertise_addr or self.addr).replace(":", "-")

    def resolved_advertise(self) -> str:
        return self.advertise_addr or self.addr
