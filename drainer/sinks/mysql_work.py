"""The units of work apply() hands to the sink's thread, in commit_ts order."""
from __future__ import annotations

import dataclasses

from sluice.drainer.translator import RowChange
from sluice.proto import sluice_pb2 as pb


@dataclasses.dataclass(frozen=True, slots=True)
class _DDLWork:
    commit_ts: int
    ddl: pb.DDL
    statements: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class _RowsWork:
    commit_ts: int
    changes: tuple[RowChange, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class _CreateWork:
    """Databases and tables to create if missing (create-tables), before what follows them."""
    commit_ts: int
    databases: tuple[str, ...]
    tables: tuple[pb.TableInfo, ...]     # the shape in force at commit_ts
    declared: bool = False               # from schema snapshots (not rows, not a DDL's target)
