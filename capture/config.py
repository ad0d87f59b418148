"""`sluice capture` configuration (capture.toml, kebab-case keys; docs/capture.md lists them)."""
from __future__ import annotations

import dataclasses
import datetime as dt
import re

from sluice.core.errors import ConfigError
from sluice.core.etcd import check_endpoints
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
    # earliest | latest | gtid:D-S-N[,...] | timestamp:T (T: unix seconds or ISO-8601, UTC
    # unless it names a zone). Used at the first start only: afterwards the pumps' position.
    start_position: str = "latest"
    signal_table: str = ""           # "db.table": never captured as data
    # Snapshots (docs/snapshots.md): initial | initial_only | no_data | when_needed. no_data for
    # now, so a capture streams as before unless a snapshot is configured.
    snapshot_mode: str = "no_data"
    snapshot_chunk_size: int = 8192
    snapshot_parallelism: int = 1
    # Debezium's `read.only`: every snapshot reads chunks in consistent-snapshot transactions
    # and writes nothing to the source (no watermark rows; no signal table needed).
    snapshot_read_only: bool = False
    # "db.table" a MySQL sink writes in each transaction (its checkpoint table): transactions
    # touching it, and DDL starting with `/* sluice-apply */`, are skipped (loop prevention)
    mark_table: str = ""
    group_max_txns: int = 512
    group_max_bytes: int = 4 << 20
    group_max_wait_ms: int = 20
    # While the source is busy, a group goes out at most once per this many ms (at once when
    # group-max-txns/bytes is reached): every group costs TSO requests, two pump RPCs and work
    # in every process whatever its size. 0: no minimum.
    group_min_interval_ms: int = 200
    heartbeat_s: float = 1.0
    metrics_addr: str = ""
    security: SecurityConfig = dataclasses.field(default_factory=SecurityConfig)

    def start_timestamp_ms(self) -> int | None:
        """T of `start-position = "timestamp:T"` in milliseconds, else None."""
        sp = self.start_position
        if not sp.startswith("timestamp:"):
            return None
        text = sp[len("timestamp:"):].strip()
        try:
            return int(float(text) * 1000)
        except ValueError:
            pass
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.timezone.utc)
        return int(when.timestamp() * 1000)

    def validate(self, where: str) -> None:
        check_endpoints(self.etcd, f"{where}: key 'etcd'")
        sp = self.start_position
        ok = sp in ("earliest", "latest") or (sp.startswith("gtid:") and _GTID_LIST.fullmatch(sp[5:]))
        if not ok and sp.startswith("timestamp:"):
            try:
                ok = self.start_timestamp_ms() is not None
            except ValueError:
                ok = False
        if not ok:
            raise ConfigError(f"{where}: key 'start-position' is {sp!r}: want earliest, latest, "
                              "gtid:D-S-N[,D-S-N...] or timestamp:T (unix seconds or ISO-8601, "
                              "e.g. timestamp:2024-05-01T12:00:00Z)")
        for key in ("signal_table", "mark_table"):
            v = getattr(self, key)
            if v and v.count(".") != 1:
                raise ConfigError(f"{where}: key '{key.replace('_', '-')}' is {v!r}: want db.table")
        from sluice.capture.snapshot.modes import SnapshotMode, parse_mode
        mode = parse_mode(self.snapshot_mode, f"{where}: key 'snapshot-mode'")
        if mode is not SnapshotMode.NO_DATA and not self.signal_table \
                and not self.snapshot_read_only:
            raise ConfigError(f"{where}: key 'snapshot-mode' is {self.snapshot_mode!r}, which "
                              "needs a signal table for its watermarks: set 'signal-table' "
                              "(db.table) and create it, or set 'snapshot-read-only = true' "
                              "(docs/snapshots.md)")
        for key in ("group_max_txns", "group_max_bytes", "snapshot_chunk_size",
                    "snapshot_parallelism"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{where}: key '{key.replace('_', '-')}' must be >= 1")
        for key in ("group_max_wait_ms", "group_min_interval_ms"):
            name, ms = key.replace("_", "-"), getattr(self, key)
            if not 0 <= ms <= 10_000:
                raise ConfigError(f"{where}: key '{name}' must be in [0, 10000] ms, not {ms}")
