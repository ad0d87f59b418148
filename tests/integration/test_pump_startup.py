"""Pump start-up checks against the cluster in etcd: replicas, mark-lost, the disk guard."""
from __future__ import annotations

import dataclasses
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sluice.core.etcd import Etcd
from sluice.core.registry import NodeKind, NodeState, Registry
from sluice.proto import sluice_pb2 as pb
from tests.support.binlogs import TS, commit, decode, prewrite
from tests.support.cluster import Cluster, set_args
from tests.support.procs import free_port, sluice_argv

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def cluster(tmp_path: Path, etcd_module) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    # Each test gets its own cluster id, so tests sharing the module's etcd never meet.
    c = Cluster(tmp_path, etcd_module.endpoint, cluster_id=free_port())
    try:
        c.start_tso()
        yield c
    finally:
        c.stop()


@pytest.fixture
def registry(cluster: Cluster) -> Iterator[Registry]:
    client = Etcd(cluster.etcd)
    yield Registry(client, cluster.cluster_id)
    client.close()


def run_pump(cluster: Cluster, node_id: str, data_dir: Path | None = None,
             **extra: object) -> subprocess.CompletedProcess:
    settings = cluster.pump_settings(node_id, f"127.0.0.1:{free_port()}",
                                     data_dir or cluster.workdir / node_id, **extra)
    return subprocess.run(sluice_argv("pump", *set_args(settings)), capture_output=True,
                          text=True, timeout=60)


def test_first_pump_records_replicas_and_a_disagreeing_pump_exits_2(
        cluster: Cluster, registry: Registry) -> None:
    cluster.start_pump("pump-a", replicas=2)
    key = registry.cluster_key("config")
    assert json.loads(registry.etcd.get(key)[0]) == {"replicas": 2}
    cluster.start_pump("pump-b", replicas=2)   # agrees: starts
    r = run_pump(cluster, "pump-c", replicas=1)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0] and "replicas = 2" in lines[0], r.stderr
    assert json.loads(registry.etcd.get(key)[0]) == {"replicas": 2}, "the stored value stays"


def test_a_pump_marked_lost_refuses_to_start(cluster: Cluster, registry: Registry) -> None:
    pump = cluster.start_pump("pump-lost")
    pump.proc.kill9()
    # What `sluice ctl mark-lost` does: offline, labelled lost.
    lost = registry.update(NodeKind.PUMP, "pump-lost", lambda s: dataclasses.replace(
        s, state=NodeState.OFFLINE, labels={**s.labels, "lost": "true"}), force=True)
    r = run_pump(cluster, "pump-lost", data_dir=pump.data_dir)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "marked lost" in lines[0] and "pump-lost" in lines[0], r.stderr
    info = registry.get(NodeKind.PUMP, "pump-lost")
    assert info is not None and info.status == lost, "the refused pump wrote nothing"


def test_low_disk_guard_refuses_writes_and_reads_continue(cluster: Cluster) -> None:
    pump = cluster.start_pump("pump-disk")
    ch, stub = pump.stub()
    ts = TS(cluster.tso_addrs, cluster.cluster_id)
    s = ts.get()
    # The commit_ts is fetched after the prewrite's ack, as the protocol says: fetched before it,
    # a fake binlog the new pump writes in between can pass it (FAILED_PRECONDITION).
    for payload in (lambda: prewrite(s), lambda: commit(s, ts.get())):
        stub.WriteBinlogs(pb.WriteBinlogsReq(cluster_id=cluster.cluster_id, payloads=[payload()]),
                          timeout=10)
    pump.proc.stop()
    ch.close()
    # Ask for more free space than any disk has: every write must be refused.
    pump = cluster.start_pump("pump-disk", **{"storage.stop-write-at-available-space": 1 << 60})
    ch, stub = pump.stub()
    s2 = ts.get()
    with pytest.raises(grpc.RpcError) as e:
        stub.WriteBinlogs(pb.WriteBinlogsReq(cluster_id=cluster.cluster_id,
                                             payloads=[prewrite(s2)]), timeout=10)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "stop-write-at-available-space" in e.value.details()
    stream = stub.PullBinlogs(pb.PullBinlogsReq(cluster_id=cluster.cluster_id), timeout=10)
    got = [decode(b) for b in next(iter(stream)).binlogs]
    stream.cancel()
    assert [(b.tp, b.start_ts) for b in got if b.tp != pb.FAKE] == [(pb.PREWRITE, s),
                                                                   (pb.COMMIT, s)]
    ch.close()
    ts.close()
