"""What a reconciled chunk becomes, and the source position it is emitted at (DESIGN §2.9).

Invariant: a chunk is emitted right after the source transaction A whose state it equals (the
high-watermark transaction in signal-table mode; the last transaction before the consistent
snapshot's binlog position in read-only mode) at A's position with sub_seq
SNAPSHOT_SUB_SEQ + n (n = chunks already emitted after A). So it orders after A (sub_seq 0, or
the small sub_seqs the writer gives a multi-table DDL) and before the next transaction (a greater
offset), and it carries A's GTID state, so resuming from a chunk's position resumes after A.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from sluice.capture.snapshot.chunks import Chunk
from sluice.capture.snapshot.keys import SnapshotTable, key_of_row
from sluice.proto import sluice_pb2 as pb

__all__ = ["SNAPSHOT_SUB_SEQ", "ChunkEmission", "Stamper", "changed_keys", "rows_by_key"]

SNAPSHOT_SUB_SEQ = 1 << 32
"""First sub_seq of snapshot chunks: above any per-statement sub_seq the writer assigns."""


@dataclasses.dataclass(frozen=True, slots=True)
class ChunkEmission:
    """Rows to emit as op=r (one pump transaction) at `position`."""

    window_id: str
    shape: SnapshotTable
    chunk: Chunk
    rows: tuple[pb.Row, ...]
    position: pb.Position
    dropped: int                   # rows dropped because the binlog changed their key meanwhile

    def mutation(self, table_id: int, table_version: int) -> pb.TableMutation:
        """The chunk as a TableMutation of READ changes (the capture supplies id and version)."""
        spec = self.shape.key
        return pb.TableMutation(table_id=table_id, schema_name=spec.db, table_name=spec.table,
                                table_version=table_version,
                                changes=[pb.RowChange(tp=pb.READ, after=r) for r in self.rows])


class Stamper:
    """Positions for chunks: after the last transaction seen, numbered per anchor."""

    def __init__(self, start: pb.Position | None = None) -> None:
        self.anchor = pb.Position()
        self.n = 0
        if start is not None:
            self.anchor.CopyFrom(start)
            # Resuming from a chunk's own position: continue its numbering after the same anchor.
            if start.sub_seq >= SNAPSHOT_SUB_SEQ:
                self.n = start.sub_seq - SNAPSHOT_SUB_SEQ + 1
            self.anchor.sub_seq = 0

    def passed(self, position: pb.Position) -> None:
        """A transaction at `position` was emitted: the next chunk anchors on it. The anchor is
        that message itself, not a copy (`stamp` copies it): a transaction's position is never
        changed once read, and a copy per transaction was a measurable part of the capture's CPU."""
        a = self.anchor
        if position is a:
            return
        if position.file_seq != a.file_seq or position.offset != a.offset \
                or position.gtids != a.gtids:   # element-wise, without two lists per call
            self.n = 0
        self.anchor = position

    def stamp(self) -> pb.Position:
        p = pb.Position()
        p.CopyFrom(self.anchor)
        p.sub_seq = SNAPSHOT_SUB_SEQ + self.n
        self.n += 1
        return p


def changed_keys(mutation: pb.TableMutation, shape: SnapshotTable) -> list[tuple[Any, ...]]:
    """Every key a binlog mutation touches: inserted, deleted, updated (before and after)."""
    out: list[tuple[Any, ...]] = []
    for ch in mutation.changes:
        if ch.HasField("before"):
            out.append(key_of_row(ch.before, shape))
        if ch.HasField("after") and ch.tp != pb.DELETE:
            out.append(key_of_row(ch.after, shape))
    return out


def rows_by_key(rows: Sequence[pb.Row], shape: SnapshotTable) -> dict[tuple[Any, ...], pb.Row]:
    return {key_of_row(r, shape): r for r in rows}
