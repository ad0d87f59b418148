"""Which transactions, tables and row changes a drainer replicates (TiDB-Binlog's syncer filters).

Invariant: the filter only removes. A transaction comes out whole, or without the row changes
and schema snapshots of filtered tables or of ignored DML types, or not at all; nothing is reordered or altered, and
schema effects are never filtered — call it after SchemaHistory.apply(txn), so a table ignored
today still decodes if a rule changes.

Rules (docs/mysql-sink.md, "Filters"):
- `ignore-txn-commit-ts`: drop these transactions entirely.
- A table is replicated unless its database is in `ignore-db` or it matches `ignore-table`;
  when `do-db` or `do-table` is set, it must also be in `do-db` or match `do-table`.
- `ignore-dml`: per table pattern, drop row changes of the listed types
  (`insert`, `update`, `delete`; a snapshot read counts as `insert`).
- Names are exact and case-sensitive ("shop", "shop.orders"); a pattern starting with `~` is a
  regular expression searched in the name (anchor it with ^ and $) ("~^shop\\.order_\\d+$", "~^test_").
- DDL on a table follows the table rule (RENAME: the new name); CREATE/DROP DATABASE is kept
  unless the database is ignored, or do-rules exist and none can match in it (do-db lists
  other databases and no do-table is set).
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from sluice.core.errors import ConfigError
from sluice.drainer.txn import Txn
from sluice.proto import sluice_pb2 as pb

DML_TYPES = ("insert", "update", "delete")
_TYPE_OF = {pb.INSERT: "insert", pb.READ: "insert", pb.UPDATE: "update", pb.DELETE: "delete"}


@dataclasses.dataclass(frozen=True)
class IgnoreDML:
    table: str                                  # "db.table" or "~regex"
    types: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class FilterConfig:
    do_db: list[str] = dataclasses.field(default_factory=list)
    do_table: list[str] = dataclasses.field(default_factory=list)
    ignore_db: list[str] = dataclasses.field(default_factory=list)
    ignore_table: list[str] = dataclasses.field(default_factory=list)
    ignore_txn_commit_ts: list[int] = dataclasses.field(default_factory=list)
    ignore_dml: list[IgnoreDML] = dataclasses.field(default_factory=list)


class _Names:
    """Exact names and ~regex patterns."""

    def __init__(self, patterns: Iterable[str], key: str) -> None:
        self.exact: set[str] = set()
        self.regexes: list[re.Pattern[str]] = []
        for p in patterns:
            if p.startswith("~"):
                try:
                    self.regexes.append(re.compile(p[1:]))
                except re.error as e:
                    raise ConfigError(f"[filter] {key}: bad regular expression {p[1:]!r}: {e}") from None
            elif p:
                self.exact.add(p)
            else:
                raise ConfigError(f"[filter] {key}: empty name")

    def __bool__(self) -> bool:
        return bool(self.exact or self.regexes)

    def match(self, name: str) -> bool:
        return name in self.exact or any(r.search(name) for r in self.regexes)


class TxnFilter:
    def __init__(self, cfg: FilterConfig | None = None) -> None:
        cfg = cfg or FilterConfig()
        self._do_db = _Names(cfg.do_db, "do-db")
        self._do_table = _Names(cfg.do_table, "do-table")
        self._ignore_db = _Names(cfg.ignore_db, "ignore-db")
        self._ignore_table = _Names(cfg.ignore_table, "ignore-table")
        self._ignore_ts = frozenset(int(t) for t in cfg.ignore_txn_commit_ts)
        self._ignore_dml: list[tuple[_Names, frozenset[str]]] = []
        for i, rule in enumerate(cfg.ignore_dml):
            bad = [t for t in rule.types if t not in DML_TYPES]
            if bad or not rule.types:
                raise ConfigError(f"[filter] ignore-dml[{i}]: types must be some of "
                                  f"{', '.join(DML_TYPES)}, got {rule.types!r}")
            self._ignore_dml.append((_Names([rule.table], f"ignore-dml[{i}].table"),
                                     frozenset(rule.types)))
        self._cache: dict[tuple[str, str], bool] = {}
        self.active = bool(self._do_db or self._do_table or self._ignore_db or self._ignore_table
                           or self._ignore_ts or self._ignore_dml)

    # -- decisions ----------------------------------------------------------------------------

    def allows_table(self, schema: str, table: str) -> bool:
        key = (schema, table)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._decide(schema, table)
            if len(self._cache) > 100_000:
                self._cache.clear()
            self._cache[key] = hit
        return hit

    def _decide(self, schema: str, table: str) -> bool:
        qualified = f"{schema}.{table}"
        if self._ignore_db.match(schema) or self._ignore_table.match(qualified):
            return False
        if self._do_db or self._do_table:
            return self._do_db.match(schema) or self._do_table.match(qualified)
        return True

    def allows_database(self, schema: str) -> bool:
        if self._ignore_db.match(schema):
            return False
        if self._do_table:
            return True  # a do-table pattern may name a table in it
        return not self._do_db or self._do_db.match(schema)

    def ignores_dml(self, schema: str, table: str, tp: int) -> bool:
        kind = _TYPE_OF.get(tp)
        if kind is None or not self._ignore_dml:
            return False
        qualified = f"{schema}.{table}"
        return any(kind in types and names.match(qualified) for names, types in self._ignore_dml)

    def allows_ddl(self, ddl: pb.DDL) -> bool:
        if ddl.tp in (pb.CREATE_DATABASE, pb.DROP_DATABASE) or not ddl.table_name:
            return self.allows_database(ddl.schema_name)
        return self.allows_table(ddl.schema_name, ddl.table_name)

    # -- transactions -------------------------------------------------------------------------

    def filter(self, txn: Txn) -> Txn | None:
        """The transaction with filtered parts removed, the same object when nothing is
        filtered, or None when nothing replicable is left (its schema effects still count)."""
        if not self.active:
            return txn
        if txn.commit_ts in self._ignore_ts:
            return None
        value = txn.prewrite
        ddl_kept = value.HasField("ddl") and self.allows_ddl(value.ddl)
        changed = value.HasField("ddl") and not ddl_kept
        kept: list[pb.TableMutation] = []
        for m in value.mutations:
            if not self.allows_table(m.schema_name, m.table_name):
                changed = True
                continue
            if self._ignore_dml and any(self.ignores_dml(m.schema_name, m.table_name, c.tp)
                                        for c in m.changes):
                trimmed = pb.TableMutation()
                trimmed.CopyFrom(m)
                del trimmed.changes[:]
                trimmed.changes.extend(c for c in m.changes
                                       if not self.ignores_dml(m.schema_name, m.table_name, c.tp))
                changed = True
                if trimmed.changes:
                    kept.append(trimmed)
                continue
            kept.append(m)
        # Declared shapes go to the sinks too (the MySQL sink creates those tables): only the
        # replicated tables' (the schema history has every table's already).
        snaps = [s for s in value.schema_snapshots if self.allows_table(s.schema_name, s.table_name)]
        changed = changed or len(snaps) != len(value.schema_snapshots)
        if not changed:
            return txn
        if not kept and not ddl_kept and not snaps:
            return None
        new_value = pb.PrewriteValue()
        new_value.CopyFrom(value)
        del new_value.mutations[:]
        new_value.mutations.extend(kept)
        del new_value.schema_snapshots[:]
        new_value.schema_snapshots.extend(snaps)
        if not ddl_kept:
            new_value.ClearField("ddl")
        return txn.with_prewrite(new_value)
