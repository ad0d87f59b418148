"""`sluice capture` configuration (capture.toml, kebab-case keys; docs/capture.md lists them)."""
from __future__ import annotations

import dataclasses
import re

from sluice.core.errors import ConfigError
from sluice.core.tls import SecurityConfig

_GTID_LIST = re.compile(r"\d+-\d+-\d+(,\d+-\d+-\d+)*")


@dataclasses.dataclass
class SourceConfig:
    host: str = "127.0.0.1"
    port: int = 3306
    user: str = "sluice"
    password: str = ""
    server_id: int = 10001        # the capture's replica server id (unique in the topology)
    name: str = ""                # logical source name (table ids, SourceInfo); default host:port

    def resolved_name(self) -> str:
        return self.name or f"{self.host}:{self.port}"

    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def connection(self) -> dict[str, object]:
        return {"host": self.host, "port": self.port, "user": self.user, "password": self.password}


@dataclasses.dataclass
class FilterConfig:
    include_databases: list[str] = dataclasses.field(default_factory=list)
    exclude_databases: list[str] = dataclasses.field(default_factory=list)
    include_tables: list[str] = dataclasses.field(default_factory=list)   # regex on "db.table"
    exclude_tables: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class CaptureConfig:
    source: SourceConfig = dataclasses.field(default_factory=SourceConfig)
    filter: FilterConfig = dataclasses.field(default_factory=FilterConfig)
    producer_id: str = "capture-1"
    cluster_id: int = 1
    etcd: str = "127.0.0.1:2379"
    tso: list[str] = dataclasses.field(default_factory=list)   # empty: leader from etcd
    addr: str = "127.0.0.1:0"        # TxnStatus listen address
    start_position: str = "latest"   # earliest | latest | gtid:D-S-N[,...] (first start only)
    signal_table: str = ""           # "db.table": never captured as data
    mark_table: str = ""             # "db.table" the MySQL sink writes to mark its own writes
    group_max_txns: int = 256
    group_max_bytes: int = 4 << 20
    group_max_wait_ms: int = 20
    heartbeat_s: float = 1.0
    metrics_addr: str = ""
    security: SecurityConfig = dataclasses.field(default_factory=SecurityConfig)

    def validate(self, where: str) -> None:
        sp = self.start_position
        if sp not in ("earliest", "latest") and not (sp.startswith("gtid:") and _GTID_LIST.fullmatch(sp[5:])):
            raise ConfigError(f"{where}: key 'start-position' is {sp!r}: want earliest, latest or "
                              "gtid:D-S-N[,D-S-N...]")
        for key in ("signal_table", "mark_table"):
            v = getattr(self, key)
            if v and v.count(".") != 1:
                raise ConfigError(f"{where}: key '{key.replace('_', '-')}' is {v!r}: want db.table")
        for key in ("group_max_txns", "group_max_bytes"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{where}: key '{key.replace('_', '-')}' must be >= 1")
