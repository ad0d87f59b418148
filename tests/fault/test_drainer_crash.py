"""kill -9 the drainer (anywhere, and between its sink flush and its checkpoint save), restart it:
the file sink holds every acknowledged transaction exactly once.

Start cluster, load, kill, restart, compare the producer's ack log with the sink.
"""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from sluice.core.etcd import Etcd
from sluice.core.registry import NodeKind, NodeState, Registry
from sluice.drainer.checkpoint import read_checkpoint
from tests.support.cluster import (CLUSTER_ID, Cluster, TxnWriter, check_exactly_once, fresh_ts,
                                   load_in_background, read_file_sink, running_cluster, table_info)
from tests.support.procs import wait_until

pytestmark = pytest.mark.timeout(120)

PUMPS = ["pump-1", "pump-2"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, etcd_module) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    with running_cluster(tmp_path_factory.mktemp("drainer-crash"), etcd_module.endpoint, PUMPS, wait_writable=False) as c:
        yield c


@pytest.fixture(scope="module")
def registry(cluster: Cluster) -> Iterator[Registry]:
    etcd = Etcd(cluster.etcd)
    yield Registry(etcd, CLUSTER_ID)
    etcd.close()


def finish(cluster: Cluster, registry: Registry, name: str, w: TxnWriter) -> None:
    d = cluster.drainers[name]
    want = {a.commit_ts for a in w.acked if a.rows}
    wait_until(lambda: want <= {t["commit_ts"] for t in read_file_sink(d.out_dir)}
               or not d.proc.alive(), 60, 0.2, what=f"{name} to catch up")
    assert d.proc.alive(), d.proc.log_text()[-3000:]
    check_exactly_once(d.out_dir, w.acked)
    registry.set_state(NodeKind.DRAINER, name, NodeState.CLOSING)
    wait_until(lambda: not d.proc.alive(), 20, what=f"{name} to go offline")


def test_kill9_drainer_mid_load_then_restart_exactly_once(cluster: Cluster, registry: Registry) -> None:
    """Checkpoints never run ahead of the sink and the file sink truncates to its checkpoint:
    after kill -9 mid-load and a restart, every transaction is in the files exactly once."""
    t0 = fresh_ts(cluster)
    w = TxnWriter(cluster, [table_info(10 + i, "crash", f"t{i}") for i in range(3)], seed=11)
    w.declare("pump-1")
    d = cluster.start_drainer("d-kill", **{"initial-commit-ts": t0})
    loader = load_in_background(w, 4000, PUMPS, group=100)
    wait_until(lambda: len(read_file_sink(d.out_dir)) >= 800, 30, 0.1, what="some output")
    d.proc.kill9()
    loader.join(60)
    assert not loader.errors  # type: ignore[attr-defined]
    cp = read_checkpoint(registry, "d-kill")
    assert cp is not None and cp.sink_state.get("file")
    cluster.start_drainer("d-kill")
    finish(cluster, registry, "d-kill", w)
    w.close()


def test_kill_between_sink_flush_and_checkpoint_save_exactly_once(cluster: Cluster,
                                                                  registry: Registry) -> None:
    """The drainer dies after the sink flushed but before the checkpoint was saved (failpoint):
    what the files hold past the saved checkpoint is cut on restart and written once."""
    t0 = fresh_ts(cluster)
    w = TxnWriter(cluster, [table_info(20 + i, "flush", f"t{i}") for i in range(3)], seed=12)
    w.declare("pump-1")
    d = cluster.start_drainer("d-flush", env={"SLUICE_FAILPOINTS": "drainer-before-checkpoint-save=exit(137)@3"},
                              **{"initial-commit-ts": t0})
    # 30 groups 0.2 s apart: the load spans many checkpoint intervals (0.5 s) however fast the
    # drainer is, so the third save with something new to lose comes while data still flows.
    loader = load_in_background(w, 3000, PUMPS, group=100, pause=0.2)
    wait_until(lambda: not d.proc.alive(), 30, 0.1, what="the failpoint to kill d-flush")
    assert d.proc.popen.returncode == 137
    saved = read_checkpoint(registry, "d-flush").commit_ts
    written = {t["commit_ts"] for t in read_file_sink(d.out_dir)}
    loader.join(60)
    assert not loader.errors  # type: ignore[attr-defined]
    assert any(ct > saved for ct in written), "the failpoint fired with nothing past the checkpoint"
    cluster.start_drainer("d-flush")
    finish(cluster, registry, "d-flush", w)
    w.close()
