"""The drainer process with real etcd, TSO and three pump processes: merge, discovery, states.

One cluster (etcd, TSO, pumps) per module; each test runs its own drainer (its own name) from an
initial ts taken at the test's start, with its own tables, so tests do not see each other's data.
"""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.core.etcd import Etcd
from sluice.core.registry import NodeKind, NodeState, Registry
from sluice.drainer.checkpoint import read_checkpoint
from sluice.proto import sluice_pb2 as pb
from tests.support.binlogs import commit, prewrite
from tests.support.cluster import (CLUSTER_ID, Cluster, TxnWriter, check_exactly_once, fresh_ts,
                                   read_file_sink, running_cluster, table_info)
from tests.support.ctl import ctl_in
from tests.support.procs import wait_until

pytestmark = pytest.mark.timeout(120)

PUMPS = ["pump-1", "pump-2", "pump-3"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, etcd_module) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    with running_cluster(tmp_path_factory.mktemp("drainer"), etcd_module.endpoint, PUMPS) as c:
        yield c


@pytest.fixture(scope="module")
def registry(cluster: Cluster) -> Iterator[Registry]:
    etcd = Etcd(cluster.etcd)
    yield Registry(etcd, CLUSTER_ID)
    etcd.close()


_table_ids = iter(range(1000, 100000, 10))


def writer_for(cluster: Cluster, db: str, tables: int = 3, seed: int = 1) -> TxnWriter:
    base = next(_table_ids)
    return TxnWriter(cluster, [table_info(base + i, db, f"t{i}") for i in range(tables)], seed=seed)


def wait_sink_has(cluster: Cluster, name: str, writer: TxnWriter, timeout: float = 60) -> None:
    out = cluster.drainers[name].out_dir
    proc = cluster.drainers[name].proc
    want = {a.commit_ts for a in writer.acked if a.rows}

    def done() -> bool:
        if not proc.alive():
            raise AssertionError(f"{name} exited:\n{proc.log_text()[-3000:]}")
        return want <= {t["commit_ts"] for t in read_file_sink(out)}
    wait_until(done, timeout, 0.2, what=f"{name}'s file sink to hold {len(want)} transactions")


def test_three_pumps_random_load_lands_exactly_once_in_commit_order(cluster: Cluster,
                                                                    retired: list[str]) -> None:
    """Emit the smallest commit_ts only when every pump in the merge has a watermark >= it: the
    file sink holds every acknowledged transaction exactly once, in commit order, with its
    start_ts, commit_ts and rows."""
    t0 = fresh_ts(cluster)
    w = writer_for(cluster, "load", tables=4)
    retired.append("d-load")
    cluster.start_drainer("d-load", **{"initial-commit-ts": t0})
    w.declare("pump-1")
    w.write(30_000, PUMPS, group=1000)
    wait_sink_has(cluster, "d-load", w, timeout=90)
    got = check_exactly_once(cluster.drainers["d-load"].out_dir, w.acked)
    assert len(got) == 30_000
    w.close()


def retire(cluster: Cluster, registry: Registry, name: str) -> None:
    """Take a test's drainer offline (closing -> offline, process exits 0), so later pump
    starts in this module do not wait for a drainer that is online but not alive."""
    h = cluster.drainers[name]
    info = registry.get(NodeKind.DRAINER, name)
    if h.proc.alive() and info is not None and info.state != NodeState.OFFLINE:
        registry.set_state(NodeKind.DRAINER, name, NodeState.CLOSING)
        wait_until(lambda: not h.proc.alive(), 20, what=f"{name} to go offline and exit")
        assert h.proc.popen.returncode == 0, h.proc.log_text()[-2000:]
    elif info is not None and info.state != NodeState.OFFLINE:
        registry.set_state(NodeKind.DRAINER, name, NodeState.OFFLINE, force=True)


@pytest.fixture
def retired(cluster: Cluster, registry: Registry) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for n in names:
        retire(cluster, registry, n)


def sink_commit_ts(cluster: Cluster, name: str) -> set[int]:
    return {t["commit_ts"] for t in read_file_sink(cluster.drainers[name].out_dir)}


def test_delayed_pump_holds_the_merge_then_order_is_exact(cluster: Cluster, retired: list[str]) -> None:
    """Emit the smallest commit_ts only when every pump in the merge has a watermark >= it:
    while one pump's stream is held back nothing is emitted, then the order is exact."""
    t0 = fresh_ts(cluster)
    w = writer_for(cluster, "delay", seed=2)
    w.declare("pump-1")
    w.write(600, ["pump-1", "pump-2"], group=200)
    pump1_last = max(a.commit_ts for a in w.acked if a.pump == "pump-1")
    retired.append("d-delay")
    d = cluster.start_drainer("d-delay", env={"SLUICE_FAILPOINTS": "drainer-reader-recv-pump-2=1*sleep(4000)"},
                              **{"initial-commit-ts": t0})
    # pump-1's stream is read to its end while pump-2's first response is held back ...
    wait_until(lambda: d.metric('sluice_drainer_pump_watermark{pump="pump-1"}') >= pump1_last, 10,
               what="pump-1 read to its end")
    assert d.metric('sluice_drainer_merge_holding{pump="pump-2"}') == 1
    # ... and nothing was emitted: pump-2's watermark is still the start.
    assert read_file_sink(d.out_dir) == []
    wait_sink_has(cluster, "d-delay", w)
    check_exactly_once(d.out_dir, w.acked)
    w.close()


def test_a_slow_sink_holds_the_pump_readers_back(cluster: Cluster, retired: list[str]) -> None:
    """Bounded queues: a reader takes a pump's next response only while the merge holds fewer
    than `reader-queue` of that pump's transactions, so a slow sink throttles the pump stream
    (at most one response beyond the bound is held) instead of growing the drainer's memory;
    everything still lands exactly once, in order."""
    from sluice.core.rowcodec import python_to_datum
    from sluice.pump.service import PULL_MESSAGE_BYTES
    t0 = fresh_ts(cluster)
    w = writer_for(cluster, "bp", tables=1, seed=9)
    t = w.tables[0]
    w.declare("pump-1")
    big = "x" * 4000   # ~4 KB per transaction: a full 2 MiB response holds ~500 of them
    values = [pb.PrewriteValue(schema_version=1, mutations=[pb.TableMutation(
        table_id=t.table_id, schema_name=t.schema_name, table_name=t.table_name, table_version=1,
        changes=[pb.RowChange(tp=pb.INSERT, after=pb.Row(columns=[
            python_to_datum(i), python_to_datum(big)]))])]) for i in range(6000)]
    acked = w.write_values(values, ["pump-1"], group=250)
    retired.append("d-bp")
    queue = 100
    d = cluster.start_drainer("d-bp", env={"SLUICE_FAILPOINTS": "drainer-after-apply=sleep(100)"},
                              **{"initial-commit-ts": t0, "reader-queue": queue, "txn-batch": 50})
    last = max(a.commit_ts for a in acked)
    peak, deadline = 0.0, time.monotonic() + 3
    while time.monotonic() < deadline:
        peak = max(peak, d.metric('sluice_drainer_pump_pending_txns{pump="pump-1"}'))
        time.sleep(0.02)
    per_response = PULL_MESSAGE_BYTES // 4000 + 1
    assert 0 < peak <= queue + per_response, peak
    # Three seconds in, the reader is still far from the end of what the pump holds.
    assert d.metric('sluice_drainer_pump_watermark{pump="pump-1"}') < last
    want = sorted(a.commit_ts for a in acked)

    def landed() -> list[int]:
        return [x["commit_ts"] for x in read_file_sink(d.out_dir) if x["rows"]]
    wait_until(lambda: len(landed()) >= len(want), 60, 0.2,
               what="the slow drainer to apply every transaction")
    assert landed() == want
    w.close()


def write_copies(w: TxnWriter) -> int:
    """The same transaction (same start_ts, commit_ts, content) on pump-2 and pump-3, acked
    once; its start_ts."""
    from tests.support.cluster import Acked
    value, table, rows = w._random_txn()
    s = w.ts.get()
    for p in ("pump-2", "pump-3"):
        w._write(p, [prewrite(s, value.SerializeToString(), producer=w.producer)])
    c = w.ts.get()
    for p in ("pump-2", "pump-3"):
        w._write(p, [commit(s, c, producer=w.producer)])
    w.acked.append(Acked(s, c, "pump-2", table, rows))
    return s


def test_failover_copies_of_one_start_ts_are_emitted_once(cluster: Cluster, retired: list[str]) -> None:
    """One transaction, one commit_ts: a later copy of an emitted start_ts (failover copy on
    another pump) is dropped."""
    t0 = fresh_ts(cluster)
    w = writer_for(cluster, "copies", seed=3)
    retired.append("d-copies")
    d = cluster.start_drainer("d-copies", **{"initial-commit-ts": t0})
    w.declare("pump-1")
    w.write(50, PUMPS, group=50)
    s = write_copies(w)
    w.write(50, PUMPS, group=50)
    wait_sink_has(cluster, "d-copies", w)
    got = check_exactly_once(d.out_dir, w.acked)
    assert sum(t["id"] == str(s) for t in got) == 1
    wait_until(lambda: d.metric("sluice_drainer_duplicates_dropped") >= 1, 5,
               what="the dropped copy to be counted")
    w.close()


def test_failover_copies_are_emitted_once_by_a_drainer_merging_in_columns(
        cluster: Cluster, retired: list[str]) -> None:
    """The same through the grpc sink, whose drainer merges plain responses in columns
    (drainer/columnar.py): the batch holding both copies takes the Merger's rules."""
    from tests.support.cluster import drainer_pull
    t0 = fresh_ts(cluster)
    w = writer_for(cluster, "copies-col", seed=5)
    retired.append("d-copies-col")
    d = cluster.start_drainer("d-copies-col", sink="grpc", **{"initial-commit-ts": t0,
                                                             "to.consumers": ["c1"]})
    w.declare("pump-1")
    w.write(200, PUMPS, group=50)
    s = write_copies(w)
    w.write(200, PUMPS, group=50)
    want = {a.commit_ts for a in w.acked}
    commits = [b for b in drainer_pull(d.addr, t0, want) if b.tp == pb.COMMIT]
    cts = [b.commit_ts for b in commits]
    assert cts == sorted(cts) and len(cts) == len(set(cts))
    assert [b.start_ts for b in commits].count(s) == 1
    assert set(cts) >= want
    wait_until(lambda: d.metric("sluice_drainer_duplicates_dropped") >= 1, 5,
               what="the dropped copy to be counted")
    d.proc.stop()
    log = d.proc.log_text()
    assert "merges plain pump responses in columns" in log
    assert "tuple route taken" in log
    w.close()


def test_crashed_pump_stalls_the_merge_and_loses_nothing(cluster: Cluster, retired: list[str],
                                                         registry: Registry) -> None:
    """A pump leaves the merge only by state, never because its heartbeat stopped: kill -9 a
    pump while the drainer lags, wait past its alive TTL, restart it — nothing is lost."""
    t0 = fresh_ts(cluster)
    w = writer_for(cluster, "crash", seed=4)
    retired.append("d-crash")
    # pump-3's stream is slowed so the drainer lags behind it when it dies.
    d = cluster.start_drainer("d-crash", env={"SLUICE_FAILPOINTS": "drainer-reader-recv-pump-3=sleep(300)"},
                              **{"initial-commit-ts": t0})
    w.declare("pump-1")
    w.write(1500, PUMPS, group=500)
    cluster.pumps["pump-3"].proc.kill9()
    w.forget("pump-3")
    later = w.write(300, ["pump-1", "pump-2"], group=300)
    wait_until(lambda: not registry.get(NodeKind.PUMP, "pump-3").alive, 10, what="pump-3's alive key to expire")
    time.sleep(1.0)
    info = registry.get(NodeKind.PUMP, "pump-3")
    assert info.state == NodeState.ONLINE and not info.alive
    # The merge waits for pump-3: nothing written after the crash is emitted.
    assert not ({a.commit_ts for a in later} & sink_commit_ts(cluster, "d-crash"))
    assert d.metric('sluice_drainer_merge_holding{pump="pump-3"}') == 1
    cluster.start_pump("pump-3")
    wait_sink_has(cluster, "d-crash", w)
    check_exactly_once(d.out_dir, w.acked)
    w.close()


def test_mark_lost_takes_a_dead_pump_out_of_a_running_drainers_merge(
        cluster: Cluster, retired: list[str], registry: Registry) -> None:
    """A dead pump stalls the merge until `ctl mark-lost` takes it out (DESIGN §2.4): then the
    running drainer drops it from the merge and emits what the other pumps held back, exactly
    once (everything the lost pump held had been applied, so nothing is lost here)."""
    t0 = fresh_ts(cluster)
    cluster.start_pump("pump-lost")
    w = writer_for(cluster, "lost", seed=8)
    retired.append("d-lost")
    d = cluster.start_drainer("d-lost", **{"initial-commit-ts": t0})
    w.declare("pump-1")
    w.write(300, ["pump-1", "pump-lost"], group=100)
    wait_sink_has(cluster, "d-lost", w)
    cluster.pumps["pump-lost"].proc.kill9()
    w.forget("pump-lost")
    later = w.write(200, ["pump-1"], group=100)
    wait_until(lambda: not registry.get(NodeKind.PUMP, "pump-lost").alive, 10,
               what="pump-lost's alive key to expire")
    time.sleep(1.0)
    assert not ({a.commit_ts for a in later} & sink_commit_ts(cluster, "d-lost")), \
        "the merge must wait for a dead pump that is still online"
    r = ctl_in(cluster.etcd, cluster.cluster_id, "mark-lost", "pump-lost", "--force")
    assert r.code == 0, r
    info = registry.get(NodeKind.PUMP, "pump-lost")
    assert info.state == NodeState.OFFLINE and info.status.labels.get("lost") == "true"
    wait_sink_has(cluster, "d-lost", w)
    check_exactly_once(d.out_dir, w.acked)
    assert "pump pump-lost left the merge: marked lost" in d.proc.log_text()
    w.close()


def test_pump_added_mid_run_joins_by_notify_and_idle_pumps_do_not_stall(
        cluster: Cluster, retired: list[str]) -> None:
    """Notify adds the pump to the merge before replying: a pump started mid-run loses nothing;
    idle pumps (fake binlogs only) do not hold the merge back."""
    t0 = fresh_ts(cluster)
    w = writer_for(cluster, "notify", seed=5)
    retired.append("d-notify")
    d = cluster.start_drainer("d-notify", **{"initial-commit-ts": t0})
    w.declare("pump-1")
    # Idle pump-2 and pump-3: a transaction on pump-1 alone is emitted within seconds.
    t = time.monotonic()
    w.write(1, ["pump-1"])
    wait_sink_has(cluster, "d-notify", w, timeout=10)
    assert time.monotonic() - t < 5
    cluster.start_pump("pump-4")
    assert "pump pump-4 (" in d.proc.log_text()  # joined before it accepted the first write
    w.write(400, ["pump-4", "pump-1"], group=100)
    wait_sink_has(cluster, "d-notify", w)
    check_exactly_once(d.out_dir, w.acked)
    w.close()


@pytest.mark.parametrize("how", ["pausing", "closing"])
def test_paused_or_offline_pump_leaves_the_merge_after_its_final_ts(
        cluster: Cluster, retired: list[str], registry: Registry, how: str) -> None:
    """A paused or offline pump leaves the merge once the durable checkpoint passed its final
    max_commit_ts: after it stops, the merge goes on without it and nothing of it is lost."""
    pump = f"pump-{how}"
    cluster.start_pump(pump)
    t0 = fresh_ts(cluster)
    w = writer_for(cluster, f"leave_{how}", seed=6)
    name = f"d-leave-{how}"
    retired.append(name)
    d = cluster.start_drainer(name, **{"initial-commit-ts": t0})
    w.declare("pump-1")
    w.write(300, ["pump-1", pump], group=100)
    registry.set_state(NodeKind.PUMP, pump, NodeState(how))
    final = "paused" if how == "pausing" else "offline"
    wait_until(lambda: registry.get(NodeKind.PUMP, pump).state == final, 15, what=f"{pump} {final}")
    final_ts = registry.get(NodeKind.PUMP, pump).status.max_commit_ts
    assert final_ts >= max(a.commit_ts for a in w.acked if a.pump == pump)
    wait_until(lambda: f"pump {pump} left the merge" in d.proc.log_text(), 15,
               what=f"{pump} to leave the merge")
    cluster.pumps[pump].proc.stop()
    w.write(100, ["pump-1", "pump-2"], group=100)
    wait_sink_has(cluster, name, w, timeout=20)
    check_exactly_once(d.out_dir, w.acked)
    ckpt = read_checkpoint(registry, name)
    assert ckpt is not None and ckpt.commit_ts >= final_ts
    w.close()


def test_pump_online_between_register_and_list_is_not_missed(
        cluster: Cluster, retired: list[str], registry: Registry) -> None:
    """A drainer registers online+alive first, then lists pumps at revision R and watches from
    R+1; Notify adds the pump to the merge before replying: a pump coming online in between
    is not missed."""
    t0 = fresh_ts(cluster)
    w = writer_for(cluster, "between", seed=7)
    retired.append("d-between")
    d = cluster.start_drainer("d-between", wait_online=False,
                              env={"SLUICE_FAILPOINTS": "drainer-between-register-and-list=sleep(4000)"},
                              **{"initial-commit-ts": t0})
    wait_until(lambda: (i := registry.get(NodeKind.DRAINER, "d-between")) is not None and i.alive,
               20, what="d-between registered")
    assert "online: merging" not in d.proc.log_text()
    cluster.start_pump("pump-between")
    w.declare("pump-between")
    w.write(200, ["pump-between", "pump-1"], group=100)
    cluster.wait_drainer_online(d)
    wait_sink_has(cluster, "d-between", w)
    check_exactly_once(d.out_dir, w.acked)
    w.close()


def test_status_lifecycle_online_pause_resume_offline(
        cluster: Cluster, retired: list[str], registry: Registry) -> None:
    """Drainer states like TiDB-Binlog's: online (one alive drainer listed), pausing -> paused
    (process up, nothing applied, checkpoint saved), online again (applies), closing -> offline
    (process exits 0 with its checkpoint saved)."""
    t0 = fresh_ts(cluster)
    w = writer_for(cluster, "states", seed=8)
    retired.append("d-states")
    d = cluster.start_drainer("d-states", **{"initial-commit-ts": t0})
    nodes, _ = registry.list(NodeKind.DRAINER)
    online = [n.node_id for n in nodes if n.state == NodeState.ONLINE and n.alive]
    assert online == ["d-states"]
    assert nodes[[n.node_id for n in nodes].index("d-states")].status.addr == d.addr
    w.declare("pump-1")
    w.write(100, PUMPS, group=100)
    wait_sink_has(cluster, "d-states", w)
    registry.set_state(NodeKind.DRAINER, "d-states", NodeState.PAUSING)
    wait_until(lambda: registry.get(NodeKind.DRAINER, "d-states").state == NodeState.PAUSED, 10,
               what="d-states paused")
    paused_ckpt = read_checkpoint(registry, "d-states").commit_ts
    assert paused_ckpt >= max(a.commit_ts for a in w.acked)
    assert registry.get(NodeKind.DRAINER, "d-states").status.checkpoint == paused_ckpt
    before = sink_commit_ts(cluster, "d-states")
    pending = w.write(50, PUMPS, group=50)
    time.sleep(1.5)
    assert d.proc.alive() and sink_commit_ts(cluster, "d-states") == before
    assert not {a.commit_ts for a in pending} & before
    registry.set_state(NodeKind.DRAINER, "d-states", NodeState.ONLINE)
    wait_sink_has(cluster, "d-states", w)
    check_exactly_once(d.out_dir, w.acked)
    registry.set_state(NodeKind.DRAINER, "d-states", NodeState.CLOSING)
    wait_until(lambda: not d.proc.alive(), 10, what="d-states to exit")
    assert d.proc.popen.returncode == 0
    info = registry.get(NodeKind.DRAINER, "d-states")
    assert info.state == NodeState.OFFLINE and not info.alive
    assert read_checkpoint(registry, "d-states").commit_ts >= max(a.commit_ts for a in w.acked)
    w.close()


def _deep_bad_value() -> bytes:
    """Well-formed wire whose row text is not UTF-8: only a check of the whole value at the
    join (or a full parse) refuses it, the drainer's lazily parsed PrewriteValue included."""
    raw = pb.PrewriteValue(mutations=[pb.TableMutation(
        table_id=1, schema_name="corrupt", table_name="t",
        changes=[pb.RowChange(tp=pb.INSERT, after=pb.Row(columns=[pb.Datum(str="x")]))])]
    ).SerializeToString()
    assert raw.count(b"\x3a\x01x") == 1     # Datum.str = "x"
    return raw.replace(b"\x3a\x01x", b"\x3a\x01\xff")


@pytest.mark.parametrize("value, name", [(b"\xff\xff\xff\xff not a PrewriteValue", "d-corrupt"),
                                         (_deep_bad_value(), "d-corrupt-deep")],
                         ids=["wire", "deep-utf8"])
def test_undecodable_payload_stops_the_drainer_naming_pump_and_commit_ts(
        cluster: Cluster, retired: list[str], registry: Registry, value: bytes, name: str) -> None:
    """A transaction whose binlogs cannot be decoded is never skipped silently: the drainer
    stops naming the pump and commit_ts, with everything before it applied and nothing of it
    written; with skip-corrupt = true it drops it and goes on. (Pumps now refuse prewrite values
    that do not decode, so the undecodable one is put into pump-2's storage directly, as data
    stored by a release before that check.) A value broken deep inside (a row's text) stops
    the drainer at the same point: the join checks the whole value though it parses it lazily."""
    from sluice.pump.storage.storage import Storage
    t0 = fresh_ts(cluster)
    w = writer_for(cluster, name.removeprefix("d-").replace("-", "_"), seed=9)
    retired.append(name)
    w.declare("pump-1")
    w.write(20, ["pump-1"], group=20)
    pump2 = cluster.pumps["pump-2"]
    pump2.proc.stop()
    w.forget("pump-2")
    s = w.ts.get()
    c = w.ts.get()
    with Storage.open(pump2.data_dir) as st:
        st.write_blocking([prewrite(s, value), commit(s, c)])
    cluster.start_pump("pump-2")
    good_before = list(w.acked)
    w.write(20, ["pump-1"], group=20)
    d = cluster.start_drainer(name, wait_online=False, **{"initial-commit-ts": t0})
    wait_until(lambda: not d.proc.alive(), 20, what=f"{name} to stop")
    assert d.proc.popen.returncode == 1
    text = d.proc.log_text()
    assert f"corrupt transaction from pump pump-2 (start_ts {s}, commit_ts {c})" in text
    check_exactly_once(d.out_dir, good_before)
    assert max(sink_commit_ts(cluster, name)) < c
    assert read_checkpoint(registry, name).commit_ts < c
    d = cluster.start_drainer(name, **{"skip-corrupt": True})
    wait_sink_has(cluster, name, w)
    got = check_exactly_once(d.out_dir, w.acked)
    assert c not in {t["commit_ts"] for t in got}
    w.close()
