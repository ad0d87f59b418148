"""Iceberg's own maintenance procedures on the sink's tables, on a schedule.

`maintenance-every` batches, in the sink's commit thread (so never racing one of its commits):
per table, `rewrite_data_files` (bin-pack the small files each batch adds), `expire_snapshots`
(older than `snapshot-retention`, keeping the last `retain-snapshots`), `remove_orphan_files`
(files no snapshot references, older than the retention and at least 24 h: a crashed write's
leftovers), and the
branches of older epochs are dropped. A rewrite moves main; the sink's branch follows
(Publisher.resync), and readers in any JVM or pyiceberg see one snapshot or the next, never a
mix. Expired snapshots are gone for time travel: `--as-of` reaches back `snapshot-retention`.
"""
from __future__ import annotations

import datetime as _dt
import logging
import time
from typing import TYPE_CHECKING

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


def maintain(sink: SparkSink, pub: Publisher) -> None:
    cat, cfg = pub.catalog, sink.cfg
    cutoff = _dt.datetime.now(_dt.timezone.utc) - _dt.timedelta(seconds=cfg.snapshot_retention)
    older = f"TIMESTAMP '{cutoff.strftime('%Y-%m-%d %H:%M:%S.%f')}'"
    orphan_cutoff = cutoff - _dt.timedelta(seconds=max(0.0, ORPHAN_MIN_AGE_S - cfg.snapshot_retention))
    orphans_older = f"TIMESTAMP '{orphan_cutoff.strftime('%Y-%m-%d %H:%M:%S.%f')}'"
    t0 = time.monotonic()
    done = 0
    for (db, table) in sorted(pub.heads):
        name = sql_str(cat.ident(db, table))   # fully qualified (see Publisher.publish)
        proc = f"{cat.name}.system"
        try:
            cat.sql(f"CALL {proc}.rewrite_data_files(table => {name}, "
                    "options => map('min-input-files', '5'))").collect()
            pub.resync(db, table)
            pub.drop_old_branches(db, table)
            cat.sql(f"CALL {proc}.expire_snapshots(table => {name}, older_than => {older}, "
                    f"retain_last => {cfg.retain_snapshots})").collect()
            cat.sql(f"CALL {proc}.remove_orphan_files(table => {name}, older_than => {orphans_older})").collect()
            done += 1
        except Exception as e:
            if type(e).__name__ in ("Fenced", "OwnedByAnother"):
                raise
            # Maintenance failing never stops replication: logged, tried again next time.
            log.warning("spark maintenance failed for a table", extra=kv(table=f"{db}.{table}", error=str(e).splitlines()[0][:300]))
    log.info("spark maintenance done", extra=kv(tables=done, seconds=round(time.monotonic() - t0, 2)))
