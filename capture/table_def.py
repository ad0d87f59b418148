"""A table's shape as DDL describes it (`TableDef`), and what ALTER operations do to it
(`apply_alter`): the model the schema tracker keeps beside the binlog's TableMaps.
"""
from __future__ import annotations

import dataclasses

from sluice.proto import sluice_pb2 as pb


@dataclasses.dataclass
class TableDef:
    """A table shape as DDL describes it (mutable while ALTERs are applied)."""

    columns: list[pb.ColumnInfo]
    indexes: list[pb.IndexInfo]
    charset: str = ""
    collation: str = ""

    def copy(self) -> TableDef:
        return TableDef([_copy(c) for c in self.columns], [_copy(i) for i in self.indexes], self.charset,
                        self.collation)

    def column(self, name: str) -> pb.ColumnInfo | None:
        low = name.lower()
        return next((c for c in self.columns if c.name.lower() == low), None)


def _copy(m):  # type: ignore[no-untyped-def]
    n = type(m)()
    n.CopyFrom(m)
    return n


def apply_alter(tdef: TableDef, ops: tuple[tuple, ...]) -> TableDef:
    """The shape after ALTER ops; raises KeyError when an op names a column the shape lacks.

    Idempotent for additions: ADD of a column or key the shape already has replaces it, so a
    statement replayed against a model that already reflects it leaves the model unchanged.
    """
    t = tdef.copy()

    def index_of(name: str) -> int:
        low = name.lower()
        for i, c in enumerate(t.columns):
            if c.name.lower() == low:
                return i
        raise KeyError(name)

    def place(col: pb.ColumnInfo, where: tuple[str, str] | None, default: int) -> None:
        if where is None:
            t.columns.insert(default, col)
        elif where[0] == "first":
            t.columns.insert(0, col)
        else:
            t.columns.insert(index_of(where[1]) + 1, col)

    def set_pk(name: str) -> None:
        t.indexes[:] = [i for i in t.indexes if not i.primary]
        t.indexes.insert(0, pb.IndexInfo(name="PRIMARY", columns=[name], primary=True, unique=True))

    def add_unique(idx: pb.IndexInfo) -> None:
        t.indexes[:] = [i for i in t.indexes if i.primary or i.name.lower() != idx.name.lower()]
        t.indexes.append(idx)

    for op in ops:
        kind = op[0]
        if kind == "add":
            _, col, where, primary, unique = op
            try:
                # Already there: the model is newer than this statement (seeded from SHOW CREATE
                # TABLE after a restart behind the source). Re-applying must not duplicate it.
                existing = index_of(col.name)
            except KeyError:
                place(col, where, len(t.columns))
            else:
                del t.columns[existing]
                place(col, where, existing)
            if primary:
                set_pk(col.name)
            elif unique:
                add_unique(pb.IndexInfo(name=col.name, columns=[col.name], unique=True))
        elif kind == "drop":
            i = index_of(op[1])
            name = t.columns[i].name.lower()
            del t.columns[i]
            for idx in list(t.indexes):
                if any(c.lower() == name for c in idx.columns):
                    kept = [c for c in idx.columns if c.lower() != name]
                    if kept:
                        del idx.columns[:]
                        idx.columns.extend(kept)
                    else:
                        t.indexes.remove(idx)
        elif kind == "modify":
            _, old, col, where, primary, unique = op
            i = index_of(old)
            old_name = t.columns[i].name
            del t.columns[i]
            place(col, where, i)
            if old_name != col.name:
                for idx in t.indexes:
                    cols = [col.name if c.lower() == old_name.lower() else c for c in idx.columns]
                    del idx.columns[:]
                    idx.columns.extend(cols)
            if primary:
                set_pk(col.name)
        elif kind == "rename_col":
            i = index_of(op[1])
            old_name = t.columns[i].name
            t.columns[i].name = op[2]
            for idx in t.indexes:
                cols = [op[2] if c.lower() == old_name.lower() else c for c in idx.columns]
                del idx.columns[:]
                idx.columns.extend(cols)
        elif kind == "add_index":
            for idx in op[1]:
                if idx.primary:
                    t.indexes[:] = [i for i in t.indexes if not i.primary]
                    t.indexes.insert(0, idx)
                elif idx.unique:
                    add_unique(idx)
        elif kind == "drop_pk":
            t.indexes[:] = [i for i in t.indexes if not i.primary]
        elif kind == "drop_index":
            t.indexes[:] = [i for i in t.indexes if i.name.lower() != op[1].lower() or i.primary]
        elif kind == "rename_index":
            for idx in t.indexes:
                if idx.name.lower() == op[1].lower():
                    idx.name = op[2]
    return t
