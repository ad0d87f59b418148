"""Where the rows of some keys are in a current table: the (data file, position) pairs a
position-delete file names, found by the driver without a Spark job (docs/spark.md "Direct
writes").

`current-state = "delete"` removes the keys a batch changes before appending their last images.
A Spark `DELETE ... WHERE key IN (...)` did it with a job that scans the table every batch (most
of the Spark drainer's CPU). Here the driver plans the branch's live data files through the
Iceberg API, reads only their KEY columns with pyarrow (by field id, so renamed columns are
found), and keeps them in a cache by file: data files are immutable, so after the first batch
only the files written since are read. The positions of the batch's keys become one
position-delete file, committed with the last images in one row delta (datafiles.Target).

Invariants:
- A position names a row of a live data file of the branch as of `snapshot_id`; the commit
  validates from that snapshot that every referenced file still exists (maintenance may have
  rewritten it: the commit then fails and is retried with fresh positions).
- Every live row whose key is among the batch's keys is named. Rows already deleted (by an
  older position or equality delete) may be named again: deleting a deleted row changes nothing
  a reader sees, and it spares reading the table's delete files.
- Keys compare as the table's current type: a file's column (an older, narrower type after a
  promotion) is cast up to it; a key type pyarrow cannot compare exactly (float, double) or a
  file outside the local filesystem makes `find` return None and the caller uses Spark's DELETE.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import threading
from typing import Any

from sluice.core.log import kv

log = logging.getLogger(__name__)

FIELD_ID = b"PARQUET:field_id"
FILE_PATH_ID, POS_ID = 2147483546, 2147483545   # the spec's reserved position-delete fields
_INEXACT = ("float", "double", "halffloat")
DEFAULT_CACHE_BYTES = 256 << 20


@dataclasses.dataclass(frozen=True)
class Positions:
    """The rows to delete: `rows` (an Arrow table file_path, pos sorted as the spec requires),
    the files they are in, and the snapshot the files were planned at."""

    rows: Any
    files: list[str]
    snapshot_id: int | None


class KeyCache:
    """Key columns of data files, by (file, field ids): least recently used out first past
    `max_bytes`. Shared by the threads that write a batch's tables at once."""

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._items: collections.OrderedDict[tuple[str, tuple[int, ...]], Any] = \
            collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.reads = 0      # files read (the rest came from the cache)
        self.hits = 0

    def get(self, path: str, ids: tuple[int, ...]) -> Any | None:
        with self._lock:
            t = self._items.get((path, ids))
            if t is not None:
                self._items.move_to_end((path, ids))
                self.hits += 1
            return t

    def retain(self, prefix: str, live: set[str]) -> None:
        """Drop the files under prefix (one table's data) that are not in live: a rewrite or
        expiry removed them, and they are never read again (paths are never reused)."""
        with self._lock:
            for key in [k for k in self._items if k[0].startswith(prefix) and k[0] not in live]:
                self._bytes -= self._items.pop(key).nbytes

    def put(self, path: str, ids: tuple[int, ...], table: Any) -> None:
        with self._lock:
            self.reads += 1
            key = (path, ids)
            if key in self._items:
                return
            self._items[key] = table
            self._bytes += table.nbytes
            while self._bytes > self.max_bytes and len(self._items) > 1:
                _, old = self._items.popitem(last=False)
                self._bytes -= old.nbytes


def local_path(location: str) -> str | None:
    """The local file of an Iceberg file location, or None (another filesystem)."""
    if location.startswith("file://"):
        return location[len("file://"):]
    if location.startswith("file:"):
        return location[len("file:"):]
    if location.startswith("/"):
        return location
    return None


def live_files(ice: Any, branch: str) -> tuple[list[str], int | None]:
    """The data files of the branch's head snapshot (every data file once) and its id."""
    ref = ice.refs().get(branch)
    snap = ice.snapshot(branch) if ref is not None else ice.currentSnapshot()
    if snap is None:
        return [], None
    scan = ice.newScan().useSnapshot(snap.snapshotId())
    tasks = scan.planFiles()
    out: list[str] = []
    seen: set[str] = set()
    try:
        it = tasks.iterator()
        while it.hasNext():
            loc = str(it.next().file().location())
            if loc not in seen:
                seen.add(loc)
                out.append(loc)
    finally:
        tasks.close()
    return out, int(snap.snapshotId())


def _key_columns(path: str, ids: tuple[int, ...], cache: KeyCache) -> Any | None:
    """The file's columns of these field ids (None when the file lacks one: rows written before
    that column existed hold NULL there, which no key equals)."""
    t = cache.get(path, ids)
    if t is not None:
        return t if t.num_columns else None
    import pyarrow as pa
    import pyarrow.parquet as pq
    f = pq.ParquetFile(path)
    by_id = {}
    for field in f.schema_arrow:
        md = field.metadata or {}
        if FIELD_ID in md:
            by_id[int(md[FIELD_ID])] = field.name
    if not all(i in by_id for i in ids):
        cache.put(path, ids, pa.table({}))
        return None
    t = f.read(columns=[by_id[i] for i in ids])
    t = pa.Table.from_arrays([t.column(j).combine_chunks() for j in range(len(ids))],
                             names=[f"k{j}" for j in range(len(ids))])
    cache.put(path, ids, t)
    return t


def comparable(types: list[Any]) -> bool:
    """Whether keys of these Arrow types compare exactly in pyarrow (as the DELETE compares)."""
    return not any(str(t) in _INEXACT for t in types)


def find(ice: Any, branch: str, keys: Any, ids: tuple[int, ...], cache: KeyCache,
         table: str = "") -> Positions | None:
    """The positions of every live row of the branch whose key is a row of `keys` (an Arrow
    table of the key columns in the table's current types, in `ids` order); None when this
    cannot be done exactly here (the caller deletes through Spark)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    if not comparable([c.type for c in keys.columns]):
        return None
    files, snapshot_id = live_files(ice, branch)
    local = [local_path(f) for f in files]
    if any(p is None for p in local):
        log.debug("spark sink: data files outside the local filesystem; DELETE through Spark",
                  extra=kv(table=table))
        return None
    root = local_path(str(ice.location()))
    if root is not None:
        cache.retain(root.rstrip("/") + "/", {p for p in local if p is not None})
    want = pa.Table.from_arrays([keys.column(j).combine_chunks() for j in range(len(ids))],
                                names=[f"k{j}" for j in range(len(ids))])
    paths: list[str] = []
    positions: list[Any] = []
    for loc, path in zip(files, local):
        assert path is not None
        cols = _key_columns(path, ids, cache)
        if cols is None or not cols.num_rows:
            continue
        try:
            cols = pa.Table.from_arrays(
                [cols.column(j).cast(want.column(j).type) for j in range(len(ids))],
                names=want.column_names)
            if len(ids) == 1:
                hit = pc.indices_nonzero(pc.is_in(cols.column(0), value_set=want.column(0)))
            else:
                idx = cols.append_column("_pos", pa.array(range(cols.num_rows), pa.int64()))
                hit = idx.join(want, keys=want.column_names, join_type="inner") \
                    .column("_pos").combine_chunks()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            log.debug("spark sink: keys not comparable in pyarrow; DELETE through Spark",
                      extra=kv(table=table, reason=str(e)))
            return None
        if len(hit):
            paths.append(loc)
            positions.append(hit.take(pc.sort_indices(hit)) if len(ids) > 1 else hit)
    # The spec orders a position-delete file by file_path, then pos.
    order = sorted(range(len(paths)), key=paths.__getitem__)
    paths, positions = [paths[i] for i in order], [positions[i] for i in order]
    rows = pa.table({
        "file_path": pa.array([p for p, h in zip(paths, positions) for _ in range(len(h))],
                              pa.string()),
        "pos": pa.concat_arrays([h.cast(pa.int64()) for h in positions])
        if positions else pa.array([], pa.int64())})
    return Positions(rows, paths, snapshot_id)
