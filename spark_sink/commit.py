"""The commit protocol (docs/spark.md): one catalog operation makes a batch visible everywhere.

1. every table's files of batch B go to epoch-unique directories, and each table's raw partition
   (_batch=B, _epoch=E) is registered — still invisible: the views join `_sluice_commits`;
2. the commit record (batch, commit_ts, per-producer positions, schema versions, epoch) is
   written to its own epoch-unique directory;
3. commit point: `ALTER TABLE _sluice_commits ADD PARTITION (batch=B)` — the metastore refuses
   an existing partition, so batch B commits at most once, for exactly one epoch.

Invariant: a batch is visible exactly when its commit record is in `_sluice_commits`, and only
the rows of the epoch that won it; recovery drops every raw partition and file of a
(batch, epoch) without a record, so after a crash nothing is duplicated and nothing half-written
is ever visible. Fencing: a writer opening with a higher epoch than the last record first
commits an empty fence batch, so a stalled older writer's pending batch can never win.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
from typing import TYPE_CHECKING, Any

from sluice.core import failpoint
from sluice.core.errors import FailedPrecondition, SluiceError, StaleEpoch
from sluice.spark_sink.catalog import PartitionAdder, PartitionExists
from sluice.spark_sink.layout import COMMITS, Files, Layout, q, sql_str

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

OWNER_PROPERTY = "sluice.owner"
_PART = re.compile(r"_batch=(\d+)/_epoch=(\d+)")
_DIR = re.compile(r"^([eb])(\d+)$")


class Fenced(StaleEpoch):
    """A newer epoch owns the Spark tables: this writer must stop (nothing of it is visible)."""


class CommitConflict(SluiceError):
    """Batch B was committed by another writer of the same epoch (two sinks on one epoch)."""


class OwnedByAnother(FailedPrecondition):
    """The Spark tables belong to another drainer name (epochs are counted per name)."""


@dataclasses.dataclass(frozen=True)
class CommitRecord:
    batch: int
    epoch: int
    commit_ts: int                       # last commit_ts in the batch (inclusive checkpoint)
    positions: dict[str, str]            # producer_id -> position text, as of this batch
    schema_versions: dict[str, int]      # table_id -> TableInfo.version in force
    rows: int = 0
    tables: tuple[int, ...] = ()
    fence: bool = False
    created_ms: int = 0

    def to_json(self) -> str:
        return json.dumps({
            "commit_ts": self.commit_ts, "epoch": self.epoch,
            "positions": json.dumps(self.positions, sort_keys=True),
            "schema_versions": json.dumps(self.schema_versions, sort_keys=True),
            "rows": self.rows, "tables": json.dumps(list(self.tables)), "fence": self.fence,
            "created_ms": self.created_ms}, separators=(",", ":")) + "\n"


COMMITS_COLUMNS = ("commit_ts BIGINT, epoch BIGINT, positions STRING, schema_versions STRING, "
                   "rows BIGINT, tables STRING, fence BOOLEAN, created_ms BIGINT, batch BIGINT")


class Committer:
    def __init__(self, spark: SparkSession, layout: Layout, files: Files,
                 partitions: PartitionAdder | None = None) -> None:
        self.spark, self.layout, self.files = spark, layout, files
        self.partitions = partitions or PartitionAdder(spark)

    def sql(self, text: str) -> Any:
        return self.spark.sql(text)

    def ensure_catalog(self, owner: str = "") -> None:
        self.sql(f"CREATE DATABASE IF NOT EXISTS {q(self.layout.meta)}")
        self.files.mkdirs(self.layout.commits_dir())
        self.sql(f"CREATE TABLE IF NOT EXISTS {self.layout.commits()} ({COMMITS_COLUMNS}) "
                 f"USING json PARTITIONED BY (batch) LOCATION '{self.layout.commits_dir()}'")
        if owner:
            self._claim(owner)

    def _claim(self, owner: str) -> None:
        """The tables' owner is the first drainer name that opened them. Epochs are counted per
        drainer name, so a second name's writer could share an epoch with the owner's and
        overwrite its uncommitted-looking files and records (one epoch, one writer is what the
        commit protocol assumes): refused before anything is written."""
        props = {r[0]: r[1] for r in self.sql(
            f"SHOW TBLPROPERTIES {self.layout.commits()}").collect()}
        have = props.get(OWNER_PROPERTY)
        if have is None:
            self.sql(f"ALTER TABLE {self.layout.commits()} SET TBLPROPERTIES "
                     f"('{OWNER_PROPERTY}' = {sql_str(owner)})")
        elif have != owner:
            raise OwnedByAnother(
                f"spark sink: the tables of meta database {self.layout.meta!r} under "
                f"{self.layout.root} belong to drainer {have!r}, not {owner!r}: give each drainer "
                "its own root and meta-database (or run this one under the owner's name)")

    def read(self) -> list[CommitRecord]:
        """Every commit record, by batch."""
        rows = self.sql(f"SELECT * FROM {self.layout.commits()}").collect()
        out = [CommitRecord(
            batch=r["batch"], epoch=r["epoch"], commit_ts=r["commit_ts"],
            positions=json.loads(r["positions"] or "{}"),
            schema_versions=json.loads(r["schema_versions"] or "{}"), rows=r["rows"] or 0,
            tables=tuple(json.loads(r["tables"] or "[]")), fence=bool(r["fence"]),
            created_ms=r["created_ms"] or 0) for r in rows]
        return sorted(out, key=lambda c: c.batch)

    def try_commit(self, rec: CommitRecord) -> bool:
        """Write the record and attempt the commit point; False when batch B is taken."""
        d = self.layout.commit_record_dir(rec.epoch, rec.batch)
        self.files.delete(d)
        self.files.write_bytes(f"{d}/record.json", rec.to_json().encode())
        failpoint.inject("spark-before-commit")
        try:
            self.partitions.add(self.layout.meta, COMMITS, {"batch": rec.batch}, d,
                                if_not_exists=False)
        except PartitionExists:
            # Our record directory stays (it may be the winner's when two writers share an
            # epoch); recovery removes it when it belongs to no commit.
            return False
        failpoint.inject("spark-after-commit")
        return True

    def commit(self, rec: CommitRecord) -> None:
        """The commit point of a data batch; Fenced (or CommitConflict) when someone else won."""
        if self.try_commit(rec):
            return
        winner = next((c for c in self.read() if c.batch == rec.batch), None)
        if winner is not None and winner.epoch > rec.epoch:
            raise Fenced(f"spark sink: batch {rec.batch} was committed by epoch {winner.epoch}; "
                         f"this drainer's epoch {rec.epoch} is fenced and stops (its batch stays "
                         "invisible and is removed by the next recovery)")
        raise CommitConflict(f"spark sink: batch {rec.batch} is already committed (epoch "
                             f"{winner.epoch if winner else '?'}), this writer has epoch "
                             f"{rec.epoch}: two drainers share one epoch")

    def open(self, epoch: int, owner: str = "") -> CommitRecord | None:
        """Claim (owner), fence (when epoch is new), then recover; returns the last committed
        record."""
        self.ensure_catalog(owner)
        while True:
            records = self.read()
            last = records[-1] if records else None
            top = max((r.epoch for r in records), default=0)
            if top > epoch:
                raise Fenced(f"spark sink: epoch {top} has committed to these tables; this "
                             f"drainer's epoch {epoch} is fenced")
            if last is None or last.epoch == epoch:
                break
            fence = CommitRecord(batch=last.batch + 1, epoch=epoch, commit_ts=last.commit_ts,
                                 positions=last.positions, schema_versions=last.schema_versions,
                                 fence=True, created_ms=int(time.time() * 1000))
            if self.try_commit(fence):
                log.info("fence batch committed", extra={"fields": {
                    "batch": fence.batch, "epoch": epoch, "previous_epoch": last.epoch}})
                records.append(fence)
                last = fence
                break
            # Another writer committed last.batch + 1 meanwhile: look again.
        self.recover(epoch, {(r.batch, r.epoch) for r in records})
        return last

    def raw_tables(self) -> list[str]:
        rows = self.sql(f"SHOW TABLES IN {q(self.layout.meta)}").collect()
        return sorted(r["tableName"] for r in rows
                      if re.fullmatch(r"t\d+_raw", r["tableName"]) and not r["isTemporary"])

    def recover(self, epoch: int, committed: set[tuple[int, int]]) -> int:
        """Drop raw partitions and files of uncommitted (batch, epoch <= ours); returns how many."""
        removed = 0
        for name in self.raw_tables():
            table_id = int(name[1:-4])
            for r in self.sql(f"SHOW PARTITIONS {q(self.layout.meta, name)}").collect():
                m = _PART.search(r[0])
                if m is None:
                    continue
                b, e = int(m.group(1)), int(m.group(2))
                if (b, e) in committed or e > epoch:
                    continue
                self.sql(f"ALTER TABLE {q(self.layout.meta, name)} DROP IF EXISTS PARTITION "
                         f"(`_batch`={b}, `_epoch`={e})")
                removed += 1
            removed += self._delete_uncommitted(f"{self.layout.root}/data/t{table_id}/raw",
                                                committed, epoch)
        removed += self._delete_uncommitted(f"{self.layout.root}/commits", committed, epoch)
        if removed:
            log.info("recovery removed uncommitted batches", extra={"fields": {
                "removed": removed, "epoch": epoch}})
        return removed

    def _delete_uncommitted(self, top: str, committed: set[tuple[int, int]], epoch: int) -> int:
        n = 0
        for ename, _ in self.files.list_dirs(top):
            m = _DIR.match(ename)
            if m is None or m.group(1) != "e" or int(m.group(2)) > epoch:
                continue
            e = int(m.group(2))
            for bname, _ in self.files.list_dirs(f"{top}/{ename}"):
                mb = _DIR.match(bname)
                if mb is None or mb.group(1) != "b" or (int(mb.group(2)), e) in committed:
                    continue
                self.files.delete(f"{top}/{ename}/{bname}")
                n += 1
        return n
