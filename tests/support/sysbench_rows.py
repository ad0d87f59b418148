"""sysbench `oltp_write_only`-shaped transactions for the drainer's MySQL-sink benchmarks.

Tables `sbtest1..N` as sysbench creates them (id INT primary key, k INT with a plain index,
c CHAR(120), pad CHAR(60)), pre-filled with `rows` rows each; every transaction carries
sysbench's four write statements, each on a random table: an update of k (index update), an
update of c (non-index update), a delete of a random id and the insert of that id back
(with fresh k, c, pad). `model` is the expected downstream content.
"""
from __future__ import annotations

import random
from typing import Any

from sluice.drainer.txn import Txn
from tests.support.rows import Table, col, prewrite_value, schema_txn, txn


def sbtest_tables(schema: str, tables: int = 4, base_id: int = 500) -> list[Table]:
    return [Table(base_id + i, schema, f"sbtest{i}", [
        col("id", "int(11)", nullable=False), col("k", "int(11)", nullable=False),
        col("c", "char(120)", nullable=False), col("pad", "char(60)", nullable=False)],
        primary=["id"]) for i in range(1, tables + 1)]


def _digits(rng: random.Random, groups: int) -> str:
    # sysbench's c/pad: groups of 11 digits joined by '-'.
    return "-".join(f"{rng.randrange(10**11):011d}" for _ in range(groups))


class SysbenchWorkload:
    def __init__(self, seed: int, schema: str, tables: int = 4, rows: int = 10000) -> None:
        self.rng = random.Random(seed)
        self.schema = schema
        self.tables = sbtest_tables(schema, tables)
        self.size = rows
        self.model: dict[str, dict[int, tuple[Any, ...]]] = {}
        for t in self.tables:
            self.model[t.name] = {i: (i, self.rng.randrange(rows), _digits(self.rng, 10),
                                      _digits(self.rng, 5)) for i in range(1, rows + 1)}
        self.rows = 0

    def initial_rows(self, t: Table) -> list[tuple[Any, ...]]:
        return sorted(self.model[t.name].values())

    def _pick(self) -> tuple[Table, dict[int, tuple[Any, ...]], int]:
        t = self.tables[self.rng.randrange(len(self.tables))]
        return t, self.model[t.name], self.rng.randint(1, self.size)

    @staticmethod
    def _row(r: tuple[Any, ...]) -> dict[str, Any]:
        return {"id": r[0], "k": r[1], "c": r[2], "pad": r[3]}

    def next_mutations(self) -> list:
        out = []
        t, m, i = self._pick()                       # UPDATE sbtest SET k=k+1 WHERE id=?
        old = m[i]
        m[i] = (i, old[1] + 1, old[2], old[3])
        out.append(t.mutation(t.update(self._row(old), self._row(m[i]))))
        t, m, i = self._pick()                       # UPDATE sbtest SET c=? WHERE id=?
        old = m[i]
        m[i] = (i, old[1], _digits(self.rng, 10), old[3])
        out.append(t.mutation(t.update(self._row(old), self._row(m[i]))))
        t, m, i = self._pick()                       # DELETE FROM sbtest WHERE id=?
        old = m.pop(i)
        out.append(t.mutation(t.delete(**self._row(old))))
        new = (i, self.rng.randrange(self.size), _digits(self.rng, 10), _digits(self.rng, 5))
        m[i] = new                                   # INSERT INTO sbtest VALUES (?, ?, ?, ?)
        out.append(t.mutation(t.insert(**self._row(new))))
        self.rows += 4
        return out

    def transactions(self, count: int, first_ts: int) -> list[Txn]:
        """A schema-snapshot transaction at first_ts, then `count` sysbench transactions."""
        out = [schema_txn(first_ts, *self.tables)]
        for n in range(1, count + 1):
            out.append(txn(prewrite_value(*self.next_mutations()), first_ts + n))
        return out

    def expected(self, t: Table) -> list[tuple[Any, ...]]:
        return sorted(self.model[t.name].values())
