"""Snapshot progress: what a chunk binlog records so a restart resumes at the next chunk.

Invariant: the progress recorded with a chunk covers only a prefix of the table's chunks that
have all been emitted: `last_chunk_end` is the upper bound of chunk n-1 where chunks 0..n-1 are
all out, even when parallel windows close out of order. So a restart from any recorded progress
re-reads at most chunks that were in flight (re-emitting op=r rows of current values is
harmless) and never skips one.

`SnapshotState` is the in-process value; `encode`/`decode` map it to pb.SnapshotProgress (keys
as pb.Row of Datums through core.rowcodec; additional conditions as "db.table\\tfilter").
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from sluice.capture.snapshot.chunks import Chunk
from sluice.core import rowcodec
from sluice.core.errors import InvalidArgument
from sluice.proto import sluice_pb2 as pb

__all__ = ["SnapshotState", "encode", "decode", "PrefixTracker"]


@dataclasses.dataclass(frozen=True, slots=True)
class SnapshotState:
    snapshot_id: str
    tables: tuple[str, ...]                       # "db.table", in snapshot order
    mode: str = "signal-table"                    # "signal-table" | "read-only" | "initial"
    current_table: str = ""
    last_chunk_end: tuple[Any, ...] | None = None  # exclusive lower bound of the next chunk
    max_key: tuple[Any, ...] | None = None         # of current_table, taken at its start
    chunks_done: int = 0
    rows_done: int = 0
    finished: bool = False
    paused: bool = False
    conditions: tuple[tuple[str, str], ...] = ()   # (db.table, filter)
    surrogate_keys: tuple[tuple[str, str], ...] = ()

    def next_table(self) -> SnapshotState:
        """Move to the table after current_table (or finish)."""
        i = self.tables.index(self.current_table) + 1 if self.current_table else 0
        if i >= len(self.tables):
            return dataclasses.replace(self, current_table="", last_chunk_end=None, max_key=None,
                                       chunks_done=0, finished=True)
        return dataclasses.replace(self, current_table=self.tables[i], last_chunk_end=None,
                                   max_key=None, chunks_done=0)

    def condition(self, table: str) -> str:
        return " AND ".join(f"({f})" for t, f in self.conditions if t == table)

    def surrogate_key(self, table: str) -> str:
        return next((k for t, k in self.surrogate_keys if t == table), "")


def _key_row(key: Sequence[Any] | None) -> pb.Row | None:
    if key is None:
        return None
    return pb.Row(columns=[rowcodec.python_to_datum(v) for v in key])


def _key_tuple(row: pb.Row) -> tuple[Any, ...]:
    return tuple(rowcodec.datum_to_python(d) for d in row.columns)


def encode(state: SnapshotState) -> pb.SnapshotProgress:
    p = pb.SnapshotProgress(snapshot_id=state.snapshot_id, tables=list(state.tables),
                            current_table=state.current_table, chunks_done=state.chunks_done,
                            rows_done=state.rows_done, finished=state.finished,
                            paused=state.paused, mode=state.mode)
    for t, f in state.conditions:
        if "\t" in t:
            raise InvalidArgument(f"table name {t!r} contains a tab")
        p.additional_conditions.append(f"{t}\t{f}")
    # Surrogate keys travel with the conditions under a reserved prefix: the proto has no field
    # for them, and a resume must chunk by the same column.
    for t, k in state.surrogate_keys:
        p.additional_conditions.append(f"\x00surrogate-key\t{t}\t{k}")
    if state.last_chunk_end is not None:
        p.last_chunk_end.CopyFrom(_key_row(state.last_chunk_end))
    if state.max_key is not None:
        p.max_key.CopyFrom(_key_row(state.max_key))
    return p


def decode(p: pb.SnapshotProgress) -> SnapshotState:
    conds: list[tuple[str, str]] = []
    keys: list[tuple[str, str]] = []
    for c in p.additional_conditions:
        if c.startswith("\x00surrogate-key\t"):
            _, t, k = c.split("\t", 2)
            keys.append((t, k))
            continue
        t, tab, f = c.partition("\t")
        if not tab:
            raise InvalidArgument(f"snapshot {p.snapshot_id}: additional condition {c!r} has no "
                                  "'db.table<TAB>filter' form")
        conds.append((t, f))
    return SnapshotState(
        snapshot_id=p.snapshot_id, tables=tuple(p.tables), mode=p.mode or "signal-table",
        current_table=p.current_table,
        last_chunk_end=_key_tuple(p.last_chunk_end) if p.HasField("last_chunk_end") else None,
        max_key=_key_tuple(p.max_key) if p.HasField("max_key") else None,
        chunks_done=p.chunks_done, rows_done=p.rows_done, finished=p.finished, paused=p.paused,
        conditions=tuple(conds), surrogate_keys=tuple(keys))


class PrefixTracker:
    """Chunks of one table completing in any order -> the progress of their emitted prefix."""

    def __init__(self, state: SnapshotState) -> None:
        self.state = state
        self._done: dict[int, tuple[Chunk, int]] = {}

    def emitted(self, chunk: Chunk, rows: int) -> SnapshotState:
        """Chunk emitted (with `rows` rows); returns the state to record with it."""
        self._done[chunk.index] = (chunk, rows)
        s = self.state
        while s.chunks_done in self._done:
            c, n = self._done.pop(s.chunks_done)
            s = dataclasses.replace(s, last_chunk_end=c.upper, chunks_done=s.chunks_done + 1,
                                    rows_done=s.rows_done + n)
            if c.last:
                s = s.next_table()
                break
        self.state = s
        return s
