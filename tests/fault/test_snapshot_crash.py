"""kill -9 of the capture in the middle of its initial snapshot, right after a streamed
transaction that followed a chunk: the restarted capture continues at the next chunk (it reads
only the chunks not committed) and the pumps' output equals the source.

Start cluster (etcd, TSO, two pumps) and MariaDB, a table of 4000 rows under a writer, the
capture snapshotting it in chunks of 200 (each chunk SELECT delayed by a failpoint so the kill
lands mid-snapshot), kill -9, restart, compare.
"""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.test_capture_snapshot import (Churn, chunk_reads, chunk_txns, fresh_log,
                                                     make_table, progress_of, wait_folded_equal,
                                                     wait_snapshot_finished)
from tests.support.capture import PUMPS, gtid_of, start_capture
from tests.support.cluster import Cluster, running_cluster
from tests.support.mariadb import MariaDBServer

pytestmark = pytest.mark.timeout(180)

ROWS, CHUNK = 4000, 200
FAILPOINT = "snapshot-before-chunk-select"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, etcd_module) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    with running_cluster(tmp_path_factory.mktemp("snapshot-crash"), etcd_module.endpoint, PUMPS) as c:
        yield c


def test_capture_killed_mid_snapshot_resumes_at_the_next_chunk(
        cluster: Cluster, mariadb_module: MariaDBServer) -> None:
    """Invariant (snapshotter): the pumps' committed prefix always holds a snapshot progress
    that never claims a chunk that is not committed, and a restart resumes at the next chunk
    (re-reading at most the chunks that were in flight)."""
    db = mariadb_module
    make_table(db, "crashsnap", "acct", ROWS)
    log = fresh_log(cluster)
    churn = Churn(db, "crashsnap", "acct", ROWS, seed=11).start()
    settings = {"snapshot-mode": "initial", "snapshot-chunk-size": CHUNK,
                "signal-table": "sluice.signals", "filter.include-databases": ["crashsnap"]}
    first = start_capture(cluster, db, "cap-snapcrash", name="cap-snapcrash-1",
                          env={"SLUICE_FAILPOINTS": f"{FAILPOINT}=sleep(250)"}, **settings)
    try:
        def chunk_then_streamed() -> bool:
            txns = log.txns("cap-snapcrash")
            ids = {id(t) for t in chunk_txns(txns)}
            idx = [i for i, t in enumerate(txns) if id(t) in ids]
            return len(idx) >= 4 and any(gtid_of(t) for t in txns[idx[-1] + 1:])
        log.wait_for(chunk_then_streamed, 60, watch=(first,),
                     what="4 chunks and a streamed transaction after the last one")
        first.kill9()
        log.pull(log.ts.get())
        txns = log.txns("cap-snapcrash")
        chunks = chunk_txns(txns)
        last_chunk = txns.index(chunks[-1])
        # What the pumps hold ends with streamed transactions after the last chunk: the
        # progress must come from GetProducerPosition's snapshot, not from the last position.
        assert any(gtid_of(t) for t in txns[last_chunk + 1:])
        recorded = progress_of(chunks[-1])
        assert recorded is not None and not recorded.finished
        resumed_at = recorded.chunks_done
        assert resumed_at >= 4
        read_before = len(chunk_reads(first))

        second = start_capture(cluster, db, "cap-snapcrash", name="cap-snapcrash-2", **settings)
        wait_snapshot_finished(log, "cap-snapcrash", second)
        churn.stop()
        wait_folded_equal(log, db, "cap-snapcrash", "crashsnap", "acct", (second,))
        reads = chunk_reads(second)
        indexes = [i for _, i, _, _ in reads]
        assert indexes and min(indexes) == resumed_at, \
            f"restart read chunks {indexes}, want from chunk {resumed_at} on (not from zero)"
        assert indexes == sorted(set(indexes)), "a chunk was read twice after the restart"
        total = max(indexes) + 1
        assert len(reads) == total - resumed_at
        assert read_before + len(reads) <= total + 2    # at most the chunks in flight re-read
        final = progress_of(chunk_txns(log.txns("cap-snapcrash"))[-1])
        assert final is not None and final.finished
        assert final.snapshot_id == recorded.snapshot_id
    finally:
        churn.stop_event.set()
        log.close()
