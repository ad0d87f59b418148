"""kill -9 of the capture under load, at random moments and between a group's prewrites and its
commits: after each restart the capture resumes from the pumps' position, so in the end every
source transaction is in the pumps exactly once.

Start cluster (etcd, TSO, two pumps) and MariaDB, load the source continuously, kill and restart
the capture again and again, then let a last capture catch up and count the source GTIDs in what
the pumps serve (their own PullBinlogs).
"""
from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.support.capture import (PumpLog, SourceLoad, assert_exactly_once,
                                   assert_file_sink_matches, assert_source_order, gtid_of, gtid_pos,
                                   gtid_range, read_file_sink_txns, start_capture, wait_streaming)
from tests.support.binlogs import TS
from tests.support.cluster import Cluster
from tests.support.ctl import ctl_in
from tests.support.mariadb import MariaDBServer
from tests.support.procs import wait_until

pytestmark = pytest.mark.timeout(120)

FAILPOINT = "capture-between-prewrite-and-commit"
BEFORE_COMMIT_WRITE = "capture-before-commit-write"
LOAD_TXNS = 20_000   # source transactions committed while the capture is killed again and again


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, etcd_module) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    c = Cluster(tmp_path_factory.mktemp("capture-crash"), etcd_module.endpoint)
    try:
        c.start_tso()
        for p in ("pump-1", "pump-2"):
            c.start_pump(p, wait_online=False)
        for p in ("pump-1", "pump-2"):
            c.wait_pump_writable(c.pumps[p])
        yield c
    finally:
        c.stop()


@dataclass
class Loaded:
    """A source schema under a continuous load, and the pumps' content read from before it."""
    load: SourceLoad
    before: str                 # the source's GTID position before the load
    pump_log: PumpLog
    stop: threading.Event
    writer: threading.Thread

    def finish(self, db: MariaDBServer) -> list[str]:
        """Stop the load; the GTIDs it committed."""
        self.stop.set()
        self.writer.join(15)
        after = gtid_pos(db)
        self.load.close()
        return gtid_range(self.before, after)


def start_load(cluster: Cluster, db: MariaDBServer, schema: str, seed: int, pace_s: float) -> Loaded:
    load = SourceLoad(db, schema, seed=seed)
    load.create()
    before = gtid_pos(db)
    ts = TS(cluster.tso_addrs, cluster.cluster_id)
    pump_log = PumpLog(cluster, ts.get())
    ts.close()
    stop = threading.Event()
    writer = threading.Thread(target=load.run, args=(10**6, stop, pace_s), daemon=True)
    writer.start()
    return Loaded(load, before, pump_log, stop, writer)


@pytest.mark.timeout(300)
def test_capture_killed_repeatedly_commits_every_source_transaction_once(
        cluster: Cluster, mariadb_module: MariaDBServer) -> None:
    """A capture killed (kill -9, or exit(137) between a group's prewrites and its commits) and
    restarted, again and again during a load, leaves every source GTID in the pumps exactly once,
    in source order."""
    db = mariadb_module
    rng = random.Random(7)
    lo = start_load(cluster, db, "crash", 31, 0.0)
    before, pump_log = lo.before, lo.pump_log
    # The drainer's file sink must hold each source transaction once too (its own merge drops
    # nothing here: the capture never writes a transaction twice).
    drainer = cluster.start_drainer("d-capcrash", sink="file",
                                    **{"initial-commit-ts": pump_log.after["pump-1"]})
    exits = {"kill9": 0, "failpoint": 0}
    try:
        # At least 8 kills (4 at the failpoint), and on until the load committed 20k source
        # transactions (bounded: 24 kills).
        for i in range(24):
            if i >= 8 and i % 2 == 0 and len(gtid_range(before, gtid_pos(db))) >= LOAD_TXNS:
                break
            at_failpoint = i % 2 == 1
            # Alternately before commit_ts and just before the Commit write (the next group's
            # prewrites may then be in flight: two groups at once).
            fp = FAILPOINT if (i // 2) % 2 == 0 else BEFORE_COMMIT_WRITE
            env = {"SLUICE_FAILPOINTS": f"{fp}=exit(137)@{rng.randint(2, 6)}"} if at_failpoint else None
            cap = start_capture(cluster, db, "cap-crash", name=f"cap-crash-{i}", env=env,
                                **{"start-position": f"gtid:{before}"})
            if at_failpoint:
                wait_until(lambda: not cap.alive(), 30, 0.05, what="the capture to exit at the failpoint")
                assert cap.popen.returncode == 137, cap.log_text()[-3000:]  # type: ignore[union-attr]
                assert f"failpoint {fp} fired" in cap.log_text()
                exits["failpoint"] += 1
            else:
                wait_streaming(cap)
                time.sleep(rng.uniform(0.5, 2.5))   # a random moment while it writes groups
                assert cap.alive(), cap.log_text()[-3000:]
                cap.kill9()
                exits["kill9"] += 1
    finally:
        want = lo.finish(db)
    assert len(want) >= LOAD_TXNS, f"only {len(want)} source transactions during the kills"

    last = start_capture(cluster, db, "cap-crash", name="cap-crash-last",
                         **{"start-position": f"gtid:{before}"})

    def all_there() -> bool:
        return set(want) <= {gtid_of(t) for t in pump_log.txns("cap-crash")}
    pump_log.wait_for(all_there, 180, watch=(last,))
    txns = pump_log.txns("cap-crash")
    assert_exactly_once(txns, want)
    assert_source_order(txns)
    assert exits["kill9"] >= 4 and exits["failpoint"] >= 4 and exits["kill9"] == exits["failpoint"]
    # The exits between prewrite and commit left prewrites behind; the restarted capture
    # answered the pumps' TxnStatus for them (rolled back: their groups were re-read).
    texts = "".join(cluster.pumps[p].proc.log_text() for p in cluster.pumps)
    assert "producer cap-crash (TxnStatus)" in texts and "rolled back" in texts
    assert_file_sink_matches(drainer.out_dir, txns)
    in_files = Counter(t["id"] for t in read_file_sink_txns(drainer.out_dir))
    assert not [g for g in want if in_files[g] != 1], "a source GTID not exactly once in the files"
    last.stop()
    # Offline, not just stopped: a stopped drainer stays online, and a pump restarting later in
    # this module would wait for it (DESIGN §4).
    r = ctl_in(cluster.etcd, cluster.cluster_id, "offline-drainer", "d-capcrash", "--wait")
    assert r.code == 0, r
    assert drainer.proc.popen.wait(20) == 0  # type: ignore[union-attr]
    pump_log.close()


def test_capture_outlives_every_pump_lost_between_prewrites_and_commits(
        cluster: Cluster, mariadb_module: MariaDBServer) -> None:
    """Losing the pumps between a group's acknowledged prewrites and its commits does not end
    the capture: it restarts in-process (new epoch), waits with backoff while recovery cannot
    reach every non-offline pump, then resumes from the pumps' position once they are back.
    The orphaned prewrites are rolled back through the new epoch's TxnStatus, and every source
    GTID of the run is in the pumps exactly once, in source order."""
    db = mariadb_module
    lo = start_load(cluster, db, "lost", 41, 0.002)
    before, pump_log = lo.before, lo.pump_log
    # The 3rd group's commits wait 4 s after its prewrites were acknowledged: the pumps die then.
    cap = start_capture(cluster, db, "cap-lost", name="cap-lost",
                        env={"SLUICE_FAILPOINTS": f"{FAILPOINT}=1*sleep(4000)@3"},
                        **{"start-position": f"gtid:{before}"})
    try:
        wait_until(lambda: f"failpoint {FAILPOINT} fired" in cap.log_text(), 30, 0.02,
                   what="the group failpoint")
        for p in list(cluster.pumps.values()):
            p.proc.kill9()
        wait_until(lambda: "capture restarting" in cap.log_text(), 30, 0.1,
                   what="the capture to restart in-process")
        time.sleep(2)     # recovery finds no pump for a while: the capture keeps waiting
        assert cap.alive(), cap.log_text()[-3000:]
        for node_id in list(cluster.pumps):
            cluster.start_pump(node_id, wait_online=False)
        for p in cluster.pumps.values():
            cluster.wait_pump_writable(p)
        wait_until(lambda: cap.log_text().count("capture streaming") >= 2, 60, 0.2,
                   what="the restarted capture to stream again")
        time.sleep(1.0)
    finally:
        want = lo.finish(db)

    def all_there() -> bool:
        return set(want) <= {gtid_of(t) for t in pump_log.txns("cap-lost")}
    pump_log.wait_for(all_there, 60, watch=(cap,))
    txns = pump_log.txns("cap-lost")
    assert_exactly_once(txns, want)
    assert_source_order(txns)
    assert cap.alive(), cap.log_text()[-3000:]          # never exited
    texts = "".join(cluster.pumps[p].proc.log_text() for p in cluster.pumps)
    assert "producer cap-lost (TxnStatus)" in texts and "rolled back" in texts
    cap.stop()
    pump_log.close()
