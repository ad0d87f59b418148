"""Exactly-once, fenced commits to Iceberg tables: write on the sink's branch, then publish.

Invariants: the checkpoint is in the commit (every data snapshot's summary names drainer, epoch,
batch and its highest commit_ts, so a restart skips exactly what a table holds); every publish is
a compare-and-set on main's head (fast-forward from the branch `sluice_e<epoch>`); an opened sink
fences older epochs with an empty snapshot before it reads its skip points; tables belong to one
drainer name (OwnedByAnother). The protocol in full: docs/spark.md ("Exactly once, fencing, and
the commit protocol").
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from sluice.core.errors import FailedPrecondition, SluiceError
from sluice.spark_sink.catalog import Catalog, Head, Summary
from sluice.core.log import kv

log = logging.getLogger(__name__)


class Fenced(FailedPrecondition):
    """A newer epoch of this drainer committed to the sink's tables: this instance must stop."""


class OwnedByAnother(FailedPrecondition):
    """The tables belong to another drainer name."""


class LostRace(SluiceError):
    """main moved under the sink's branch (not fenced): re-read the skip point and write again."""


@dataclasses.dataclass
class TableHead:
    snapshot: int          # main's head as the sink last saw or made it (its branch is there)
    commit_ts: int         # skip point: every transaction with commit_ts <= it is in the table
    batch: int


class Publisher:
    def __init__(self, catalog: Catalog, drainer: str, epoch: int) -> None:
        self.catalog = catalog
        self.drainer = drainer
        self.epoch = epoch
        self.branch = f"sluice_e{epoch}"
        self.heads: dict[tuple[str, str], TableHead] = {}

    def _check(self, db: str, table: str, head: Head) -> None:
        top = head.top
        if top is None:
            return
        who, epoch = top
        if who and self.drainer and who != self.drainer:
            raise OwnedByAnother(
                f"spark sink: table {db}.{table} belongs to drainer '{who}', not '{self.drainer}': "
                "give each drainer its own tables (another `database` / warehouse), or run the "
                "same drainer name")
        if epoch > self.epoch:
            raise Fenced(f"spark sink: table {db}.{table} has a commit of epoch {epoch} > ours "
                         f"({self.epoch}): another instance of drainer '{self.drainer}' took over")

    def open_table(self, db: str, table: str) -> TableHead:
        """Fence the table for our epoch, put our branch at its head, read its skip point."""
        cat = self.catalog
        self._check(db, table, cat.head(db, table))
        # An empty append on main through the Iceberg API (what a Spark append of no rows
        # commits, without its job): a snapshot carrying only our epoch.
        fence = cat.iceberg_table(db, table).newAppend()
        for k, v in {"sluice.drainer": self.drainer, "sluice.epoch": str(self.epoch),
                     "sluice.fence": "true"}.items():
            fence = fence.set(k, v)
        fence.commit()
        head = cat.head(db, table)
        self._check(db, table, head)
        assert head.snapshot is not None
        self._move_branch(db, table, head.snapshot)
        s = head.summary
        th = self.heads[(db, table)] = TableHead(head.snapshot, s.commit_ts if s else 0,
                                                  s.batch if s else 0)
        return th

    def _move_branch(self, db: str, table: str, snapshot: int) -> None:
        self.catalog.sql(f"ALTER TABLE {self.catalog.ident(db, table)} CREATE OR REPLACE BRANCH "
                         f"`{self.branch}` AS OF VERSION {snapshot}")

    def forget(self, db: str, table: str) -> None:
        self.heads.pop((db, table), None)

    def rename(self, db: str, table: str, new_db: str, new_table: str) -> None:
        th = self.heads.pop((db, table), None)
        if th is not None:
            self.heads[(new_db, new_table)] = th

    def publish(self, db: str, table: str, summary: Summary, write: Callable[[str], Any]) -> None:
        """write(branch identifier) on our branch, then fast-forward main to it (the CAS).
        Raises Fenced / OwnedByAnother, or LostRace after moving the branch to the new head."""
        self.write(db, table, summary, write)
        self.fast_forward(db, table, summary)

    def write(self, db: str, table: str, summary: Summary, write: Callable[[str], Any]) -> None:
        """write(branch identifier) on our branch, every commit carrying summary; main does not
        move. Safe on several threads at once for different tables (the commit properties are
        the calling thread's)."""
        cat = self.catalog
        with cat.commit_properties(summary.props()):
            write(cat.ident(db, table, self.branch))

    def fast_forward(self, db: str, table: str, summary: Summary) -> None:
        """Move main to our branch (the CAS; every commit written since the last publish becomes
        visible at once). Raises Fenced / OwnedByAnother, or LostRace after moving the branch to
        the new head."""
        cat = self.catalog
        th = self.heads[(db, table)]
        try:
            # What the fast_forward procedure runs, through the Iceberg API (no Spark SQL to
            # parse and plan per table and batch): the commit re-checks, on the metadata it
            # commits against, that main's head is an ancestor of our branch.
            ice = cat.iceberg_table(db, table)
            ice.manageSnapshots().fastForwardBranch("main", self.branch).commit()
        except Exception as e:
            if "not an ancestor" not in str(e):
                raise
            self.resync(db, table, lost=True)
            raise LostRace(f"spark sink: table {db}.{table}: main moved under the sink's branch; "
                           f"skip point now {self.heads[(db, table)].commit_ts}") from None
        th.snapshot = int(ice.refs().get("main").snapshotId())
        th.commit_ts = summary.commit_ts
        th.batch = summary.batch

    def resync(self, db: str, table: str, lost: bool = False) -> TableHead:
        """After someone else moved main (a lost race, or maintenance): check who, re-read the
        skip point and put our branch at the new head."""
        head = self.catalog.head(db, table)
        self._check(db, table, head)
        if head.snapshot is None:
            raise SluiceError(f"spark sink: table {db}.{table} has no snapshot")
        th = self.heads.get((db, table))
        s = head.summary
        if lost:
            log.warning("spark commit lost a race on main; retrying", extra=kv(table=f"{db}.{table}", head=head.snapshot, skip_commit_ts=s.commit_ts if s else 0))
        self._move_branch(db, table, head.snapshot)
        th = self.heads[(db, table)] = TableHead(head.snapshot, s.commit_ts if s else 0,
                                                  s.batch if s else 0)
        return th

    def drop_old_branches(self, db: str, table: str) -> None:
        rows = self.catalog.sql(f"SELECT name FROM {self.catalog.ident(db, table)}.refs "
                                f"WHERE type = 'BRANCH'").collect()
        for (name,) in rows:
            if name.startswith("sluice_e") and name != self.branch:
                self.catalog.sql(f"ALTER TABLE {self.catalog.ident(db, table)} DROP BRANCH IF "
                                 f"EXISTS `{name}`")
