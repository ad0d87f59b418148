"""Splitting a table into key-range chunks, lazily (Flink CDC's splitter, our own code).

Invariant: the chunks of one table partition its key space up to the max key taken at snapshot
start (chunk i covers `lower < key <= upper`, chunk i+1's lower is chunk i's upper), so every row
whose key is <= that max key is in exactly one chunk. Chunks are computed one at a time, and a
splitter built from a SnapshotProgress continues after its last chunk. The `even` and `query`
strategies: docs/snapshots.md ("Chunks").
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from sluice.capture.snapshot.keys import KeySpec, after, at_most
from sluice.core.table import quote_ident
from sluice.core.errors import InvalidArgument
from sluice.core.log import kv

log = logging.getLogger(__name__)

__all__ = ["Chunk", "ChunkSplitter", "SplitOptions", "max_key", "min_key"]


@dataclasses.dataclass(frozen=True, slots=True)
class SplitOptions:
    chunk_size: int = 8192
    factor_lower: float = 0.05      # Flink CDC's distribution-factor bounds
    factor_upper: float = 1000.0

    def __post_init__(self) -> None:
        if self.chunk_size < 1:
            raise InvalidArgument(f"snapshot chunk-size must be >= 1, got {self.chunk_size}")
        if not 0 < self.factor_lower <= 1 <= self.factor_upper:
            raise InvalidArgument("snapshot distribution factor bounds must satisfy "
                                  f"0 < lower <= 1 <= upper, got {self.factor_lower}, "
                                  f"{self.factor_upper}")


@dataclasses.dataclass(frozen=True, slots=True)
class Chunk:
    """Rows with `lower < key <= upper` (no lower bound: from the start; upper is never open)."""

    table: str                      # "db.table"
    index: int                      # 0-based, counting chunks done before a resume
    lower: tuple[Any, ...] | None
    upper: tuple[Any, ...]
    last: bool                      # ends at the table's max key

    def where(self, spec: KeySpec) -> tuple[str, list[Any]]:
        """The chunk's WHERE condition (without the word WHERE) and its parameters."""
        parts: list[str] = []
        params: list[Any] = []
        if self.lower is not None:
            sql, p = after(spec, self.lower)
            parts.append(sql)
            params += p
        sql, p = at_most(spec, self.upper)
        parts.append(sql)
        params += p
        return " AND ".join(parts), params


def _edge_key(conn: Any, spec: KeySpec, desc: bool, condition: str) -> tuple[Any, ...] | None:
    order = ", ".join(quote_ident(c) + (" DESC" if desc else "") for c in spec.columns)
    where = f" WHERE {condition}" if condition else ""
    with conn.cursor() as cur:
        cur.execute(f"SELECT {spec.sql_columns} FROM {spec.sql_table}{where} "
                    f"ORDER BY {order} LIMIT 1")
        row = cur.fetchone()
    return tuple(row) if row is not None else None


def max_key(conn: Any, spec: KeySpec) -> tuple[Any, ...] | None:
    """The greatest key now (None: empty table): one index dive, no lock beyond a read."""
    return _edge_key(conn, spec, True, "")


def min_key(conn: Any, spec: KeySpec) -> tuple[Any, ...] | None:
    return _edge_key(conn, spec, False, "")


def estimated_rows(conn: Any, spec: KeySpec) -> int:
    # InnoDB's estimate (no COUNT(*) scan); 0 for a table never analysed, which means "unknown".
    with conn.cursor() as cur:
        cur.execute("SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA=%s "
                    "AND TABLE_NAME=%s", (spec.db, spec.table))
        row = cur.fetchone()
    return int(row[0] or 0) if row else 0


class ChunkSplitter:
    """The chunks of one table, one at a time (`next_chunk`, or iterate).

    `max_key` is taken at snapshot start and kept in the SnapshotProgress; pass it (and the
    progress's last chunk end and chunk count) to resume. `queries` counts the statements the
    splitter itself ran, so a test can prove a resume does not start from zero.
    """

    def __init__(self, conn: Any, spec: KeySpec, options: SplitOptions | None = None, *,
                 max_key_at_start: Sequence[Any] | None = None, resume_after: Sequence[Any] | None = None,
                 chunks_done: int = 0, finished: bool = False) -> None:
        self.conn = conn
        self.spec = spec
        self.options = options or SplitOptions()
        self.queries = 0
        self.strategy = ""
        self.step = 0
        self._lower: tuple[Any, ...] | None = tuple(resume_after) if resume_after is not None else None
        self._index = chunks_done
        self._done = finished
        if max_key_at_start is None:
            self.queries += 1
            mk = max_key(conn, spec)
        else:
            mk = tuple(max_key_at_start)
        self.max_key: tuple[Any, ...] | None = mk
        # Python orders only integer keys like MySQL does (strings follow the column collation).
        if mk is None or (spec.integer and self._lower is not None and self._lower >= mk):
            self._done = True
        if not self._done:
            self._choose()
        log.info("snapshot chunks planned", extra=kv(table=spec.qualified, key=",".join(spec.columns), strategy=self.strategy or "-", step=self.step, max_key=mk, resume_after=self._lower, chunks_done=chunks_done))

    # -- strategy -----------------------------------------------------------------------------

    def _choose(self) -> None:
        self.strategy = "query"
        if not self.spec.integer:
            return
        assert self.max_key is not None
        if self._lower is None:
            self.queries += 1
            lo = min_key(self.conn, self.spec)
            low = lo[0] if lo is not None else self.max_key[0]
        else:
            low = self._lower[0] + 1
        self.queries += 1
        rows = estimated_rows(self.conn, self.spec)
        span = self.max_key[0] - low + 1
        if rows <= 0 or span <= 0:
            return
        factor = span / rows
        o = self.options
        if o.factor_lower <= factor <= o.factor_upper:
            self.strategy = "even"
            # A dense key whose rows fill the range: ~chunk_size rows per step of chunk_size*factor.
            self.step = max(1, int(o.chunk_size * max(factor, 1.0)))
            if self._lower is None:
                # Start just below the minimum so the first chunk's arithmetic has a lower bound
                # while the chunk itself stays unbounded below (rows < min may appear later).
                self._even_next = low - 1 + self.step
            else:
                self._even_next = self._lower[0] + self.step
        else:
            log.info("snapshot key too sparse or too dense for even chunks; using query bounds",
                     extra=kv(table=self.spec.qualified, factor=round(factor, 3), bounds=[o.factor_lower, o.factor_upper]))

    def _next_upper_query(self) -> tuple[Any, ...] | None:
        spec = self.spec
        assert self.max_key is not None
        # Bounded by the max key in SQL: keys are compared in the column collation there, which
        # Python cannot reproduce for strings.
        conds, params = [], []
        if self._lower is not None:
            sql, p = after(spec, self._lower)
            conds.append(sql)
            params += p
        sql, p = at_most(spec, self.max_key)
        conds.append(sql)
        params += p
        where = " WHERE " + " AND ".join(conds)
        order = ", ".join(quote_ident(c) for c in spec.columns)
        self.queries += 1
        with self.conn.cursor() as cur:
            cur.execute(f"SELECT {spec.sql_columns} FROM {spec.sql_table}{where} ORDER BY {order} "
                        f"LIMIT 1 OFFSET {self.options.chunk_size - 1}", params)
            row = cur.fetchone()
        return tuple(row) if row is not None else None

    # -- chunks -------------------------------------------------------------------------------

    def next_chunk(self) -> Chunk | None:
        if self._done:
            return None
        assert self.max_key is not None
        upper: tuple[Any, ...] | None
        if self.strategy == "even":
            upper = (self._even_next,)
            self._even_next += self.step
            if upper >= self.max_key:
                upper = None
        else:
            # A stored key equal to the max key is that very row (the key is unique).
            upper = self._next_upper_query()
            if upper == self.max_key:
                upper = None
        last = upper is None
        if upper is None:
            upper = self.max_key
        chunk = Chunk(table=self.spec.qualified, index=self._index, lower=self._lower,
                      upper=upper, last=last)
        self._lower = upper
        self._index += 1
        self._done = last
        return chunk

    def __iter__(self) -> Iterator[Chunk]:
        while (c := self.next_chunk()) is not None:
            yield c

    @property
    def finished(self) -> bool:
        return self._done
