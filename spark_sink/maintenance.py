"""Iceberg's own maintenance procedures on the sink's tables, on a schedule.

`maintenance-every` batches, in the sink's commit thread (so never racing one of its commits):
per table, `rewrite_data_files` (bin-pack the small files each batch adds), `expire_snapshots`
(older than `snapshot-retention`, keeping the last `retain-snapshots`), `remove_orphan_files`
(files no snapshot references, older than the retention and at least 24 h: a crashed write's
leftovers), and the
branches of older epochs are dropped. A rewrite moves main; the sink's branch follows
(Publisher.resync), and readers in any JVM or pyiceberg see one snapshot or the next, never a
mix. Expired snapshots are gone for time travel: `--as-of` reaches back `snapshot-retention`.

A procedure that provably has nothing to do is not called (each is Spark jobs over the table's
metadata, seconds per table on a small machine): the proofs are at `_rewrite_may_act` and
`_orphans_possible`, and read only the table's metadata (already loaded) or, for orphans, the
files of its location. Snapshots expire through Iceberg's core API (`_expire`).
"""
from __future__ import annotations

import datetime as _dt
import logging
import time
from typing import TYPE_CHECKING, Any

from sluice.spark_sink.commit import Publisher
from sluice.spark_sink.tables import sql_str
from sluice.core.log import kv

if TYPE_CHECKING:
    from sluice.spark_sink.sink import SparkSink

log = logging.getLogger(__name__)

# Iceberg's remove_orphan_files refuses a cutoff younger than 24 h: files a concurrent commit is
# still writing (a takeover's new active, a rewrite) look orphaned until it lands. A shorter
# snapshot-retention applies to snapshots only.
ORPHAN_MIN_AGE_S = 86_400.0
# rewrite_data_files' min-input-files as the sink calls it.
MIN_INPUT_FILES = 5
# Iceberg's default write.target-file-size-bytes (TableProperties).
DEFAULT_TARGET_FILE_SIZE = 512 * 1024 * 1024


def maintain(sink: SparkSink, pub: Publisher) -> None:
    cat, cfg = pub.catalog, sink.cfg
    cutoff = _dt.datetime.now(_dt.timezone.utc) - _dt.timedelta(seconds=cfg.snapshot_retention)
    older = f"TIMESTAMP '{cutoff.strftime('%Y-%m-%d %H:%M:%S.%f')}'"
    orphan_cutoff = cutoff - _dt.timedelta(seconds=max(0.0, ORPHAN_MIN_AGE_S - cfg.snapshot_retention))
    orphans_older = f"TIMESTAMP '{orphan_cutoff.strftime('%Y-%m-%d %H:%M:%S.%f')}'"
    orphan_cutoff_ms = int(orphan_cutoff.timestamp() * 1000)
    t0 = time.monotonic()
    done = 0
    skipped = {"rewrite": 0, "orphans": 0}
    spent = {"rewrite": 0.0, "expire": 0.0, "orphans": 0.0}

    def timed(what: str, sql: str) -> None:
        t = time.monotonic()
        cat.sql(sql).collect()
        spent[what] += time.monotonic() - t
    # One load per table, here: the commit thread is the sink's only writer, so the handles stay
    # current through the loop (a takeover's commit shows in the head check below).
    ices = {t: _iceberg_table(cat, *t) for t in sorted(pub.heads)}
    shared = _shared_locations(ices)
    for (db, table), ice in ices.items():
        name = sql_str(cat.ident(db, table))   # fully qualified (see Publisher.publish)
        proc = f"{cat.name}.system"
        try:
            if ice is None or _rewrite_may_act(ice):
                # remove-dangling-deletes: the newest equality-delete file shares its batch's
                # data sequence number (one row delta, datafiles.py), so after the rewrite it
                # applies to no live data file yet stays listed, and pyiceberg refuses any table
                # with a live equality-delete file; the option drops delete files that apply to
                # nothing (an extra metadata commit, no data rewritten).
                timed("rewrite", f"CALL {proc}.rewrite_data_files(table => {name}, "
                      f"options => map('min-input-files', '{MIN_INPUT_FILES}', "
                      "'remove-dangling-deletes', 'true'))")
                if ice is not None:
                    ice.refresh()
            else:
                skipped["rewrite"] += 1
            if ice is None or _head_id(ice) != pub.heads[(db, table)].snapshot:
                pub.resync(db, table)   # main moved (the rewrite, or anyone else: checked there)
            if ice is None or _old_branches(ice, pub.branch):
                pub.drop_old_branches(db, table)
            if ice is None:
                timed("expire", f"CALL {proc}.expire_snapshots(table => {name}, "
                      f"older_than => {older}, retain_last => {cfg.retain_snapshots})")
            else:
                t1 = time.monotonic()
                _expire(ice, int(cutoff.timestamp() * 1000), cfg.retain_snapshots)
                spent["expire"] += time.monotonic() - t1
            if (db, table) in shared:
                skipped["orphans"] += 1
            elif ice is None or _orphans_possible(cat, ice, orphan_cutoff_ms):
                timed("orphans", f"CALL {proc}.remove_orphan_files(table => {name}, "
                      f"older_than => {orphans_older})")
            else:
                skipped["orphans"] += 1
            done += 1
        except Exception as e:
            if type(e).__name__ in ("Fenced", "OwnedByAnother"):
                raise
            # Maintenance failing never stops replication: logged, tried again next time.
            log.warning("spark maintenance failed for a table", extra=kv(table=f"{db}.{table}", error=str(e).splitlines()[0][:300]))
    log.info("spark maintenance done", extra=kv(tables=done, seconds=round(time.monotonic() - t0, 2),
                                                rewrites_skipped=skipped["rewrite"],
                                                orphan_scans_skipped=skipped["orphans"],
                                                **{f"{k}_s": round(v, 2) for k, v in spent.items()}))


def _shared_locations(ices: dict[tuple[str, str], Any]) -> set[tuple[str, str]]:
    """Tables whose location is, holds or lies in another table's. Their orphan scans would
    take the other table's live files for orphans and delete them, so they are never run (a
    warning says which). The sink gives each table it creates a location of its own
    (Catalog.create_table); tables created before that shared `<db>/<old name>` after a RENAME."""
    where = {t: str(ice.location()).rstrip("/") + "/" for t, ice in ices.items() if ice is not None}
    out = {t for t, loc in where.items()
           if any(o != t and (other.startswith(loc) or loc.startswith(other))
                  for o, other in where.items())}
    if out:
        log.warning("spark maintenance: tables share a location; their orphan files are not "
                    "removed", extra=kv(tables=sorted(f"{d}.{t}" for d, t in out)))
    return out


def _iceberg_table(cat: Any, db: str, table: str) -> Any:
    """The org.apache.iceberg.Table behind db.table (fresh metadata), or None when it cannot be
    loaded this way (then every procedure runs, as if no check existed)."""
    try:
        return cat.iceberg_table(db, table)
    except Exception as e:  # noqa: BLE001 - the checks are an optimisation only
        log.debug("spark maintenance: no table handle; running every procedure",
                  extra=kv(table=f"{db}.{table}", error=str(e).splitlines()[0][:200]))
        return None


def _expire(ice: Any, older_than_ms: int, retain_last: int) -> None:
    """expire_snapshots through Iceberg's core API: the same ExpireSnapshots operation the
    procedure wraps (snapshots older than the cutoff beyond the last `retain_last` leave the
    metadata, then the files only they reached are deleted), with the reachability computed
    in this driver instead of as Spark jobs over every manifest (seconds per table on a small
    machine, for tables whose manifests a driver reads in milliseconds: docs/spark.md,
    "Maintenance")."""
    ice.refresh()   # after the branch moves above (a commit retry would refresh too)
    ice.expireSnapshots().expireOlderThan(older_than_ms).retainLast(retain_last).commit()


def _head_id(ice: Any) -> int | None:
    s = ice.currentSnapshot()
    return int(s.snapshotId()) if s is not None else None


def _old_branches(ice: Any, ours: str) -> bool:
    return any(str(n).startswith("sluice_e") and str(n) != ours for n in ice.refs().keySet())


def _rewrite_may_act(ice: Any) -> bool:
    """Whether rewrite_data_files(min-input-files 5) could rewrite anything. It rewrites a file
    group when it has >= min-input-files files, or more content than the target file size, or a
    file too large (> 1.8 x target), or files with deletes past a threshold. With fewer than 5
    data files in the whole table, no delete file, and less than the target size in total,
    none of these can hold for any group (a group's files and bytes are a subset of the
    table's)."""
    s = ice.currentSnapshot()
    if s is None:
        return False     # an empty table: nothing to rewrite
    summary = s.summary()

    def total(key: str) -> int | None:
        v = summary.get(key)
        return int(v) if v is not None else None
    files, deletes, size = (total("total-data-files"), total("total-delete-files"),
                            total("total-files-size"))
    if files is None or deletes is None or size is None:
        return True      # a summary without totals: no proof, let the procedure decide
    target = int(ice.properties().getOrDefault("write.target-file-size-bytes",
                                               str(DEFAULT_TARGET_FILE_SIZE)))
    return files >= MIN_INPUT_FILES or deletes > 0 or size >= target


def _orphans_possible(cat: Any, ice: Any, cutoff_ms: int) -> bool:
    """Whether remove_orphan_files(older_than = cutoff) could delete anything. It deletes only
    files under the table's location last modified before the cutoff (and referenced by no
    snapshot); so if no file there is that old, it deletes nothing. The check lists the
    location and stops at the first old file: a table older than the cutoff usually shows one
    at once (then the procedure runs as before), a younger one holds at most the files written
    since the cutoff. (The table's own history cannot bound this: expired snapshots leave no
    trace, and a location may hold a dropped or renamed table's leftovers.)"""
    try:
        path = cat.java.HadoopPath(ice.location())
        fs = path.getFileSystem(cat.spark._jsc.hadoopConfiguration())
        if not fs.exists(path):
            return False
        it = fs.listFiles(path, True)
        while it.hasNext():
            if it.next().getModificationTime() < cutoff_ms:
                return True
        return False
    except Exception as e:  # noqa: BLE001 - no proof: the procedure runs
        log.debug("spark maintenance: could not list the table location",
                  extra=kv(location=str(ice.location()), error=str(e).splitlines()[0][:200]))
        return True
