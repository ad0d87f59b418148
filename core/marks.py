"""How Sluice marks its own writes to a database, so that a capture of that database skips them
(loop prevention in bidirectional setups, like TiDB-Binlog's mark table).

- Every transaction the MySQL sink commits writes a row of its checkpoint table
  (`<checkpoint-schema>.sluice_checkpoint`): a capture configured with that table as its
  `mark-table` drops every source transaction touching it, whole.
- Every statement the sink runs outside such a transaction (DDL) starts with `APPLY_MARK`: the
  capture applies it to its table shapes but does not emit it.
"""
from __future__ import annotations

APPLY_MARK = "/* sluice-apply */"

__all__ = ["APPLY_MARK"]
