"""File sink: transactions as JSON lines in Debezium's envelope (docs/file-sink.md).

Invariant: each transaction appears exactly once in the files after a crash. The sink's
checkpoint state is the (file, byte offset) reached at the last flush+fsync; on open it truncates
that file to that offset and deletes every later file, and the drainer resumes strictly after the
checkpoint's commit_ts, so what was written past the checkpoint is written again exactly once.

A transaction never spans two files: rotation (`max-file-size`) happens between transactions,
so a transaction larger than the limit makes one file larger than the limit.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from sluice.core import ts as _ts
from sluice.core.errors import ConfigError, CorruptRecord, InvalidArgument, SluiceError
from sluice.core.fsync import fsync_path
from sluice.core.rowcodec import row_to_dict
from sluice.drainer.sink import Checkpoint, Sink, SinkCheckpoint, sink_options
from sluice.drainer.txn import SchemaLookup, Txn
from sluice.proto import sluice_pb2 as pb
from sluice.core.log import kv

log = logging.getLogger(__name__)

VERSION = "sluice-0.1"
CONNECTOR = "sluice"
_NAME_RE = re.compile(r"^binlog-(\d{6,})\.jsonl$")
_WRITE_BUFFER = 1 << 20

# One shared encoder: json.dumps with keyword arguments builds a new encoder per call.
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

_DDL_CHANGE = {
    pb.CREATE_TABLE: "CREATE", pb.ALTER_TABLE: "ALTER", pb.DROP_TABLE: "DROP",
    pb.RENAME_TABLE: "RENAME", pb.TRUNCATE_TABLE: "TRUNCATE",
}
_TEMPORAL = frozenset({"datetime", "timestamp", "time"})
_DECIMAL = frozenset({"decimal", "numeric"})


@dataclasses.dataclass(frozen=True)
class FileSinkConfig:
    dir: str
    max_file_size: int = 256 * 1024 * 1024
    fsync: bool = True

    def __post_init__(self) -> None:
        if self.max_file_size <= 0:
            raise ConfigError(f"file sink: max-file-size must be positive, got {self.max_file_size}")


def file_name(seq: int) -> str:
    return f"binlog-{seq:06d}.jsonl"


def list_files(directory: str | Path) -> list[tuple[int, Path]]:
    """The sink's files in write order, as (sequence number, path)."""
    out = []
    for p in Path(directory).iterdir():
        m = _NAME_RE.match(p.name)
        if m and p.is_file():
            out.append((int(m.group(1)), p))
    return sorted(out)



def _quoted_id(db: str, table: str) -> str:
    return f'"{db}"."{table}"'


def _gtid_text(txn: Txn) -> str | None:
    src = txn.source
    if src is not None and src.gtid:
        return src.gtid
    pos = txn.position
    if pos is not None:
        if pos.gtids:
            return ",".join(f"{g.domain_id}-{g.server_id}-{g.seq_no}" for g in pos.gtids)
        if pos.mysql_gtid_set:
            return pos.mysql_gtid_set
    return None


def describe_table(info: pb.TableInfo) -> dict[str, Any]:
    """Debezium's tableChanges[].table for a TableInfo (hidden columns left out)."""
    pk: list[str] = []
    for index in info.indexes:
        if index.primary:
            pk = list(index.columns)
            break
    columns = []
    position = 0
    for c in info.columns:
        if c.hidden:
            continue
        position += 1
        dtype = c.data_type.lower()
        type_name = dtype.upper() + (" UNSIGNED" if c.unsigned else "")
        if dtype in _DECIMAL:
            length, scale = c.precision or None, c.scale
        elif dtype in _TEMPORAL:
            length, scale = c.scale or None, None  # Debezium reports fractional precision as length
        else:
            length, scale = c.length or None, None
        columns.append({
            "name": c.name, "typeName": type_name, "typeExpression": c.column_type or type_name,
            "length": length, "scale": scale, "optional": c.nullable, "position": position,
            "enumValues": list(c.elements) or None,
        })
    return {"primaryKeyColumnNames": pk, "columns": columns}


class FileSink(Sink):
    name = "file"

    def __init__(self, options: FileSinkConfig, schema: SchemaLookup, source_name: str = "sluice",
                 fence: Callable[[], None] | None = None) -> None:
        self._cfg = options
        # HA: raises StaleEpoch once this drainer may no longer write (checked before every write
        # and flush, so a drainer frozen past its lease writes at most the chunk it was in).
        self._fence = fence or (lambda: None)
        self._schema = schema
        self._source_name = source_name
        self._dir = Path(options.dir)
        self._file: BinaryIO | None = None
        self._seq = 0
        self._offset = 0
        self._applied_ts = 0
        self._durable = SinkCheckpoint(0, {})
        self._failed: BaseException | None = None
        self._lock = asyncio.Lock()

    @classmethod
    def from_options(cls, options: Any, **context: Any) -> FileSink:
        cfg = sink_options(cls.name, options)
        schema = context.get("schema")
        if schema is None:
            raise InvalidArgument("file sink needs the drainer's schema lookup (context 'schema')")
        return cls(cfg, schema, context.get("source_name") or "sluice", context.get("fence"))

    # -- lifecycle ----------------------------------------------------------------------------

    async def open(self, checkpoint: Checkpoint) -> None:
        async with self._lock:
            await asyncio.to_thread(self._open_sync, checkpoint)
            self._applied_ts = checkpoint.commit_ts
            self._durable = SinkCheckpoint(checkpoint.commit_ts, self._state())

    def _open_sync(self, cp: Checkpoint) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)
        existing = list_files(self._dir)
        state = cp.sink_state
        if state:
            name, offset = state.get("file"), state.get("offset")
            m = _NAME_RE.match(name) if isinstance(name, str) else None
            if m is None or not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                raise InvalidArgument(f"file sink: bad checkpoint sink_state {state!r}")
            seq = int(m.group(1))
            path = self._dir / name
            size = path.stat().st_size if path.exists() else None
            if (size or 0) < offset:
                raise CorruptRecord(str(path), offset,
                                    f"the checkpoint says {offset} bytes are durable but the file "
                                    f"{'is missing' if size is None else f'has {size}'}")
            for s, p in existing:
                if s > seq:
                    log.info("removing file written past the checkpoint", extra=kv(file=p.name, checkpoint_commit_ts=cp.commit_ts))
                    p.unlink()
            if size is not None and size > offset:
                log.info("truncating file to the checkpoint", extra=kv(file=name, size=size, to=offset, checkpoint_commit_ts=cp.commit_ts))
            self._open_file(seq, truncate_to=offset)
        else:
            seq = existing[-1][0] + 1 if existing else 1
            if existing:
                # Without sink state nothing in those files is known to be covered by the
                # checkpoint, so they are kept untouched and writing continues in a new file.
                log.warning("existing files but no file-sink state in the checkpoint; starting a "
                            "new file", extra=kv(dir=str(self._dir), file=file_name(seq)))
            self._open_file(seq, truncate_to=0)

    def _open_file(self, seq: int, truncate_to: int) -> None:
        path = self._dir / file_name(seq)
        f = open(path, "ab", buffering=_WRITE_BUFFER)
        try:
            f.truncate(truncate_to)
            f.seek(truncate_to)
            if self._cfg.fsync:
                os.fsync(f.fileno())
                # Makes a new file's entry, and files deleted on open, durable too.
                fsync_path(self._dir)
        except BaseException:
            f.close()
            raise
        self._file, self._seq, self._offset = f, seq, truncate_to

    async def close(self) -> None:
        async with self._lock:
            f, self._file = self._file, None
            if f is None:
                return
            try:
                if self._failed is None:
                    await asyncio.to_thread(self._sync_file, f)
                    self._durable = SinkCheckpoint(self._applied_ts, self._state(self._seq, self._offset))
            finally:
                await asyncio.to_thread(f.close)

    # -- writing ------------------------------------------------------------------------------

    async def apply(self, batch: list[Txn]) -> None:
        async with self._lock:
            self._check_usable()
            if not batch:
                return
            now_ms = int(time.time() * 1000)
            # Encoding reads the schema lookup, which the drainer mutates: do it on the loop.
            chunks = [self._encode_txn(txn, now_ms) for txn in batch]
            try:
                await asyncio.to_thread(self._write_sync, chunks)
            except BaseException as e:
                # Part of the batch may be in the file: only a reopen from the checkpoint is safe.
                self._failed = e
                raise
            self._applied_ts = batch[-1].commit_ts

    def _write_sync(self, chunks: list[bytes]) -> None:
        assert self._file is not None
        for chunk in chunks:
            if not chunk:
                continue
            if self._offset and self._offset + len(chunk) > self._cfg.max_file_size:
                self._rotate_sync()
            self._fence()
            self._file.write(chunk)
            self._offset += len(chunk)

    def _rotate_sync(self) -> None:
        assert self._file is not None
        # The next checkpoint lies in the new file, so the old one must be durable first.
        self._sync_file(self._file)
        self._file.close()
        self._file = None
        self._open_file(self._seq + 1, truncate_to=0)

    def _sync_file(self, f: BinaryIO) -> None:
        self._fence()
        f.flush()
        if self._cfg.fsync:
            os.fsync(f.fileno())

    async def flush(self) -> None:
        async with self._lock:
            self._check_usable()
            assert self._file is not None
            try:
                await asyncio.to_thread(self._sync_file, self._file)
            except BaseException as e:
                self._failed = e
                raise
            self._durable = SinkCheckpoint(self._applied_ts, self._state())

    def checkpoint(self) -> SinkCheckpoint:
        return self._durable

    def _state(self, seq: int | None = None, offset: int | None = None) -> dict[str, Any]:
        return {"file": file_name(self._seq if seq is None else seq),
                "offset": self._offset if offset is None else offset}

    def _check_usable(self) -> None:
        if self._failed is not None:
            raise SluiceError(f"file sink failed earlier ({self._failed!r}); reopen it from the "
                              f"drainer checkpoint")
        if self._file is None:
            raise SluiceError("file sink is not open")

    # -- encoding -----------------------------------------------------------------------------

    def _encode_txn(self, txn: Txn, now_ms: int) -> bytes:
        src_info = txn.source
        pos = txn.position
        cts = txn.commit_ts
        gtid = _gtid_text(txn)
        name = (src_info.name if src_info is not None and src_info.name else self._source_name)
        ts_ms = ((src_info.ts_ms if src_info is not None else 0)
                 or (pos.ts_ms if pos is not None else 0) or _ts.physical_ms(cts))
        file = ((src_info.file if src_info is not None else "")
                or (pos.file_name if pos is not None else "")) or None
        offset = ((src_info.pos if src_info is not None else 0)
                  or (pos.offset if pos is not None else 0))
        server_id = ((src_info.server_id if src_info is not None else 0)
                     or (pos.server_id if pos is not None else 0))

        def source(db: str, table: str | None, snapshot: str, row: int) -> dict[str, Any]:
            return {"version": VERSION, "connector": CONNECTOR, "name": name, "ts_ms": ts_ms,
                    "snapshot": snapshot, "db": db, "table": table, "commit_ts": cts,
                    "gtid": gtid, "file": file, "pos": offset, "server_id": server_id, "row": row}

        lines: list[str] = []
        for info in (txn.prewrite.schema_snapshots if txn.has_schema_snapshots else ()):
            lines.append(_encode({
                "source": source(info.schema_name, info.table_name, "true", 0),
                "databaseName": info.schema_name, "ddl": "",
                "tableChanges": [{"type": "CREATE", "id": _quoted_id(info.schema_name, info.table_name),
                                  "table": describe_table(info)}],
            }))
        ddl = txn.ddl
        if ddl is not None:
            lines.append(_encode({
                "source": source(ddl.schema_name, ddl.table_name or None, "false", 0),
                "databaseName": ddl.schema_name, "ddl": ddl.query,
                "tableChanges": self._table_changes(ddl, cts),
            }))

        events = txn.rows(self._schema)
        if events:
            txid = gtid or str(txn.start_ts)
            lines.append(_encode({"status": "BEGIN", "id": txid, "ts_ms": ts_ms, "event_count": None,
                                  "data_collections": None, "commit_ts": cts}))
            counts: dict[str, int] = {}
            snapshot_chunk = txn.prewrite.snapshot_chunk
            finished = txn.snapshot is not None and txn.snapshot.finished
            last = len(events) - 1
            for i, ev in enumerate(events):
                coll = f"{ev.schema}.{ev.table}"
                n = counts.get(coll, 0) + 1
                counts[coll] = n
                if snapshot_chunk or ev.op == "r":
                    snap = "last" if finished and i == last else "true"
                else:
                    snap = "false"
                info = ev.table_info
                lines.append(_encode({
                    "before": None if ev.before is None else row_to_dict(ev.before, info, json=True),
                    "after": None if ev.after is None else row_to_dict(ev.after, info, json=True),
                    "source": source(ev.schema, ev.table, snap, ev.seq),
                    "op": ev.op,
                    "ts_ms": now_ms,
                    "transaction": {"id": txid, "total_order": i + 1, "data_collection_order": n},
                }))
            lines.append(_encode({
                "status": "END", "id": txid, "ts_ms": ts_ms, "event_count": len(events),
                "data_collections": [{"data_collection": k, "event_count": v} for k, v in counts.items()],
                "commit_ts": cts,
            }))
        if not lines:
            return b""
        lines.append("")
        return "\n".join(lines).encode("utf-8")

    def _table_changes(self, ddl: pb.DDL, commit_ts: int) -> list[dict[str, Any]]:
        change = _DDL_CHANGE.get(ddl.tp)
        if change is None:  # database-level or OTHER: the statement text only
            return []
        item: dict[str, Any] = {"type": change, "id": _quoted_id(ddl.schema_name, ddl.table_name)}
        if change == "RENAME":
            item["previousId"] = _quoted_id(ddl.old_schema_name, ddl.old_table_name)
        if change == "DROP":
            item["table"] = None
        else:
            info = ddl.table_info if ddl.HasField("table_info") else (
                self._schema.table_at(ddl.table_id, commit_ts) if ddl.table_id else None)
            item["table"] = describe_table(info) if info is not None else None
        return [item]
