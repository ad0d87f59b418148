"""Drainer HA with epoch fencing: two instances of one drainer name, the active one killed or
frozen under load; the standby takes over and the file sink holds every transaction exactly once.

Start cluster, start active + standby, load, kill -9 / SIGSTOP the active, watch the standby take
over, compare the producer's ack log with the sink.
"""
from __future__ import annotations

import hashlib
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.core.etcd import Etcd
from sluice.core.registry import NodeKind, NodeState, Registry
from sluice.drainer.checkpoint import read_checkpoint
from sluice.drainer.sink import Checkpoint
from tests.support.cluster import (CLUSTER_ID, Cluster, DrainerHandle, TxnWriter,
                                   check_exactly_once, fresh_ts, load_in_background, read_file_sink,
                                   running_cluster, table_info)
from tests.support.procs import wait_until

pytestmark = pytest.mark.timeout(120)

PUMPS = ["pump-1", "pump-2"]
# Lease TTL 4 s: the active stops itself 3 s after its last acknowledged keepalive was sent;
# a standby waits 5 s (TTL + margin) once the lease is gone. 2 s was too tight for a loaded CI
# machine: an instance lost its lease (no keepalive acknowledged for 2.1 s) while taking over.
HA = {"ha": True, "alive-ttl": 4, "ha-margin": 1.0, "txn-batch": 32}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, etcd_module) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    with running_cluster(tmp_path_factory.mktemp("drainer-ha"), etcd_module.endpoint, PUMPS, wait_writable=False) as c:
        yield c


@pytest.fixture(scope="module")
def registry(cluster: Cluster) -> Iterator[Registry]:
    etcd = Etcd(cluster.etcd, timeout=3)
    yield Registry(etcd, CLUSTER_ID)
    etcd.close()


def start_pair(cluster: Cluster, name: str, t0: int) -> tuple[DrainerHandle, DrainerHandle]:
    a = cluster.start_drainer(name, instance=f"{name}-a", **HA, **{"initial-commit-ts": t0})
    b = cluster.start_drainer(name, instance=f"{name}-b", wait_online=False, **HA,
                              **{"initial-commit-ts": t0})
    cluster.wait_drainer_standby(b)
    return a, b


def status(registry: Registry, name: str):  # type: ignore[no-untyped-def]
    info = registry.get(NodeKind.DRAINER, name)
    assert info is not None
    return info


def caught_up(d: DrainerHandle, w: TxnWriter) -> None:
    want = {a.commit_ts for a in w.acked if a.rows}
    wait_until(lambda: want <= {t["commit_ts"] for t in read_file_sink(d.out_dir)}
               or not d.proc.alive(), 40, 0.2, what=f"{d.addr} to catch up")
    assert d.proc.alive(), d.proc.log_text()[-3000:]


def take_offline(cluster: Cluster, registry: Registry, d: DrainerHandle) -> None:
    registry.set_state(NodeKind.DRAINER, d.name, NodeState.CLOSING)
    wait_until(lambda: not d.proc.alive(), 20, what=f"{d.name} to go offline")


def snapshot(out_dir: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out_dir.glob("binlog-*.jsonl"))}


def test_kill9_active_standby_takes_over_exactly_once(cluster: Cluster, registry: Registry) -> None:
    """kill -9 the active drainer under load: the standby (same name) takes over with a higher
    epoch and the file sink ends with every transaction exactly once; a clean stop hands over at
    once; epochs strictly increase across takeovers."""
    name = "d-ha-kill"
    t0 = fresh_ts(cluster)
    w = TxnWriter(cluster, [table_info(70 + i, "hakill", f"t{i}") for i in range(3)], seed=31)
    w.declare("pump-1")
    a, b = start_pair(cluster, name, t0)
    e1 = status(registry, name).status.epoch
    # `ctl drainers` shows who is active (addr, epoch) and who stands by (label).
    wait_until(lambda: status(registry, name).status.labels.get("standby") == b.addr, 10,
               what="the standby label")
    assert status(registry, name).status.addr == a.addr

    loader = load_in_background(w, 2500, PUMPS, group=50)
    wait_until(lambda: len(read_file_sink(a.out_dir)) >= 300, 30, 0.1, what="some output")
    a.proc.kill9()
    cluster.wait_drainer_online(b, timeout=30)
    e2 = status(registry, name).status.epoch
    assert e2 == e1 + 1
    assert f"active at {b.addr} with epoch {e2}" in b.proc.log_text()

    # The killed one comes back as the standby.
    a = cluster.start_drainer(name, instance=f"{name}-a", wait_online=False)
    cluster.wait_drainer_standby(a)
    loader.join(60)
    assert not loader.errors  # type: ignore[attr-defined]
    caught_up(b, w)

    # A clean stop releases the epoch: the standby needs no TTL wait.
    assert b.proc.stop() == 0
    cluster.wait_drainer_online(a, timeout=10)
    e3 = status(registry, name).status.epoch
    assert e3 == e2 + 1
    w.write(200, PUMPS, group=50)
    caught_up(a, w)
    check_exactly_once(a.out_dir, w.acked)
    take_offline(cluster, registry, a)
    w.close()


def test_sigstop_active_past_ttl_then_sigcont_writes_nothing(cluster: Cluster,
                                                             registry: Registry) -> None:
    """SIGSTOP the active drainer past its lease TTL while load runs: the standby takes over;
    after SIGCONT the old one finds its lease not certainly alive and exits (code 3) writing
    nothing — the file sink and the etcd checkpoint are unchanged by it."""
    name = "d-ha-stop"
    t0 = fresh_ts(cluster)
    w = TxnWriter(cluster, [table_info(80 + i, "hastop", f"t{i}") for i in range(3)], seed=32)
    w.declare("pump-1")
    a, b = start_pair(cluster, name, t0)
    e1 = status(registry, name).status.epoch

    loader = load_in_background(w, 2000, PUMPS, group=50)
    wait_until(lambda: len(read_file_sink(a.out_dir)) >= 300, 30, 0.1, what="some output")
    etcd = registry.etcd
    watch: int | None = None
    a.proc.signal(signal.SIGSTOP)
    try:
        cluster.wait_drainer_online(b, timeout=30)
        assert status(registry, name).status.epoch == e1 + 1
        loader.join(60)
        assert not loader.errors  # type: ignore[attr-defined]
        caught_up(b, w)

        # B writes nothing more to the files without new transactions; its checkpoint may move
        # with the pumps' fake binlogs, never backwards.
        files = snapshot(b.out_dir)
        cp_before = read_checkpoint(registry, name)
        assert cp_before is not None
        seen: list[Checkpoint] = []
        rev = etcd.revision()
        watch = etcd.watch_prefix(registry.drainer_checkpoint_key(name), lambda resp: seen.extend(
            Checkpoint.from_json(ev.value) for ev in getattr(resp, "events", []) or []
            if type(ev).__name__ == "PutEvent"), start_revision=rev + 1)
    finally:
        a.proc.signal(signal.SIGCONT)
    try:
        wait_until(lambda: not a.proc.alive(), 15, what="the old active to exit")
        assert a.proc.popen.returncode == 3, a.proc.log_text()[-3000:]
        assert "no longer certainly the active instance" in a.proc.log_text()
        assert snapshot(b.out_dir) == files, "the stale drainer wrote to the file sink"
        assert all(cp.commit_ts >= cp_before.commit_ts for cp in seen), \
            "a checkpoint went backwards: the stale drainer overwrote the new one's"
        st = status(registry, name)
        assert (st.status.epoch, st.status.addr, st.alive) == (e1 + 1, b.addr, True)
    finally:
        if watch is not None:
            etcd.cancel_watch(watch)
    w.write(200, PUMPS, group=50)
    caught_up(b, w)
    check_exactly_once(b.out_dir, w.acked)
    take_offline(cluster, registry, b)
    w.close()
