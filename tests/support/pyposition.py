"""core/position.py's former `format_position` (before the Spark sink's per-transaction use made
it read each field once), kept only as the oracle of tests/unit/test_position.py's differential
test."""
from __future__ import annotations

from sluice.core.position import _file_seq_of, _has_file, is_empty
from sluice.proto import sluice_pb2 as pb


def py_format_position(pos: pb.Position | None) -> str:
    """Human form, e.g. "mysql-bin.000042:1234#0 gtid=0-1-99"; `parse_position` reads it back.

    Tokens: `<file>:<offset>#<sub_seq>` (file is file_name, or the zero-padded file_seq when there
    is no name), `gtid=d-s-n,...`, `mysql-gtid=<set>`, and only when set: `file-seq=` (a file_name
    whose suffix does not give file_seq), `sub-seq=` (no file coordinates), `server-id=`, `ts-ms=`,
    `gen=` (the rewind generation).
    An empty position is "empty".
    """
    if is_empty(pos):
        return "empty"
    assert pos is not None
    parts: list[str] = []
    extra: list[str] = []
    if _has_file(pos):
        name = pos.file_name or f"{pos.file_seq:06d}"
        if pos.file_name and _file_seq_of(pos.file_name) != pos.file_seq:
            extra.append(f"file-seq={pos.file_seq}")
        parts.append(f"{name}:{pos.offset}#{pos.sub_seq}")
    else:
        if pos.file_name:
            extra.append(f"file={pos.file_name}")
        if pos.sub_seq:
            extra.append(f"sub-seq={pos.sub_seq}")
    if pos.gtids:
        parts.append("gtid=" + ",".join(f"{g.domain_id}-{g.server_id}-{g.seq_no}"
                                        for g in pos.gtids))
    if pos.mysql_gtid_set:
        parts.append("mysql-gtid=" + "".join(pos.mysql_gtid_set.split()))
    if pos.server_id:
        extra.append(f"server-id={pos.server_id}")
    if pos.ts_ms:
        extra.append(f"ts-ms={pos.ts_ms}")
    if pos.generation:
        extra.append(f"gen={pos.generation}")
    return " ".join(parts + extra)
