"""kill -9 stories for PumpsClient: failover with the same start_ts, probes, replicas=2.

One transaction, one commit_ts: retries, failover copies and replicas of a transaction carry the
same start_ts and the same commit_ts (DESIGN §2.5), and nothing acknowledged is lost.
"""
from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from sluice.client.pumps import CommitNotAcknowledged, PumpsClient, check_commit_ts
from sluice.core.etcd import Etcd
from sluice.core.registry import Registry
from sluice.core.tso_client import TSOClient
from sluice.proto import sluice_pb2 as pb
from sluice.proto import sluice_pb2_grpc as pbg
from sluice.pump.config import PumpConfig
from tests.support.binlogs import decode, pv
from tests.support.cluster import Cluster, commits_in_order, drainer_pull, fresh_ts
from tests.support.procs import wait_until

pytestmark = pytest.mark.timeout(150)

VALUE = pv("x" * 512)
PROBE_S = 1.0


@dataclass
class Txn:
    start_ts: int
    commit_ts: int
    pumps: tuple[str, ...]
    acked_at: float      # when the prewrite ack arrived
    committed: bool      # write_commits returned (False: CommitNotAcknowledged, re-sent later)


@pytest.fixture
def cluster(tmp_path: Path, etcd) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    c = Cluster(tmp_path, etcd.endpoint)
    try:
        yield c
    finally:
        c.stop()


async def load(client: PumpsClient, tso: TSOClient, n: int, txns: list[Txn],
               concurrency: int = 64, gate: tuple[int, asyncio.Event] | None = None) -> None:
    """n transactions by `concurrency` workers; with gate (k, event) the (k+1)-th and later
    transactions start only once event is set (those already in flight go on)."""
    todo = iter(range(n))

    async def worker() -> None:
        for i in todo:
            if gate is not None and i >= gate[0]:
                await gate[1].wait()
            s = await tso.get_ts()
            ack = await client.write_prewrite(pb.Binlog(tp=pb.PREWRITE, start_ts=s,
                                                        prewrite_value=VALUE, producer_id="load"))
            acked_at = time.monotonic()
            c = await tso.get_ts()
            check_commit_ts(c, ack)
            try:
                await client.write_commits([pb.Binlog(tp=pb.COMMIT, start_ts=s, commit_ts=c,
                                                      producer_id="load")], ack)
                committed = True
            except CommitNotAcknowledged:
                committed = False
            txns.append(Txn(s, c, ack.pumps, acked_at, committed))
    await asyncio.gather(*(worker() for _ in range(concurrency)))


def acks_stopped(txns: list[Txn], quiet_s: float) -> Callable[[], bool]:
    """A condition: no transaction was acknowledged in the last quiet_s seconds."""
    seen = [len(txns), time.monotonic()]

    def check() -> bool:
        now = time.monotonic()
        if len(txns) != seen[0]:
            seen[:] = [len(txns), now]
        return now - seen[1] >= quiet_s
    return check


def pull_commits(cluster: Cluster, upto: int) -> dict[str, dict[int, int]]:
    """pump -> {start_ts: commit_ts} for the load's transactions (prewrite checked present)."""
    out: dict[str, dict[int, int]] = {}
    for node_id, handle in cluster.pumps.items():
        ch = grpc.insecure_channel(handle.addr, options=[("grpc.max_receive_message_length", 1 << 30)])
        got: dict[int, int] = {}
        prewritten: set[int] = set()
        stream = pbg.PumpStub(ch).PullBinlogs(
            pb.PullBinlogsReq(cluster_id=cluster.cluster_id, after_commit_ts=0), timeout=30)
        try:
            for resp in stream:
                for b in map(decode, resp.binlogs):
                    if b.producer_id != "load":
                        continue
                    if b.tp == pb.PREWRITE:
                        prewritten.add(b.start_ts)
                    elif b.tp == pb.COMMIT:
                        assert b.start_ts in prewritten
                        got[b.start_ts] = b.commit_ts
                if resp.watermark >= upto:
                    break
        finally:
            stream.cancel()
            ch.close()
        out[node_id] = got
    return out


def unresolved(cluster: Cluster, node_id: str) -> int:
    ch, stub = cluster.pumps[node_id].stub()
    try:
        return stub.Status(pb.PumpStatusReq(cluster_id=cluster.cluster_id), timeout=2).unresolved
    finally:
        ch.close()


def check_one_commit_ts(txns: list[Txn], stored: dict[str, dict[int, int]], copies: int) -> None:
    where: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for node_id, commits in stored.items():
        for s, c in commits.items():
            where[s].append((node_id, c))
    for t in txns:
        holders = where.get(t.start_ts, [])
        assert {c for _, c in holders} == {t.commit_ts}, (t, holders)
        assert {p for p, _ in holders} >= set(t.pumps), (t, holders)
        assert len(holders) >= copies, (t, holders)
    assert set(where) == {t.start_ts for t in txns}   # nothing that was never written


def test_kill9_pump_during_load_fails_over_and_the_restarted_pump_is_probed_back(
        cluster: Cluster) -> None:
    """One transaction, one commit_ts: with a pump killed mid-load, prewrites fail over under
    the same start_ts, every acknowledged transaction is stored with its one commit_ts (copies
    on two pumps agree), and the restarted pump is probed and used again within the interval."""
    cluster.start_tso()
    for i in (1, 2, 3):
        cluster.start_pump(f"pump-{i}")
    # A drainer serving the merged stream (grpc sink: the values are not decoded) reads the
    # pumps through it all: failover copies of one start_ts must come out once.
    t0 = fresh_ts(cluster)
    drainer = cluster.start_drainer("d-failover", sink="grpc", **{"initial-commit-ts": t0})
    txns: list[Txn] = []
    marks: dict[str, float] = {}

    async def go() -> None:
        client = PumpsClient(cluster.etcd, cluster.cluster_id, probe_interval_s=PROBE_S,
                             write_timeout_s=3.0)
        tso = TSOClient(cluster.tso_addrs, cluster.cluster_id)
        await client.start()
        # The last 4,000 transactions start only once pump-2 is back, so some are routed to it
        # again whatever the machine's speed (at ~10k txn/s the load could end before).
        back = asyncio.Event()
        try:
            loader = asyncio.create_task(load(client, tso, 20_000, txns, gate=(16_000, back)))
            await asyncio.to_thread(wait_until, lambda: len(txns) >= 4000, 60, what="4000 txns")
            cluster.pumps["pump-2"].proc.kill9()
            marks["killed"] = time.monotonic()
            await asyncio.to_thread(wait_until, lambda: "pump-2" not in client.available_pumps(),
                                    10, what="pump-2 to become unavailable")
            n = len(txns)
            # At least 3000 transactions and 2.5 s without pump-2 (on a quiet machine 3000 take
            # under a second, which leaves no acks after the 1 s grace below to look at).
            await asyncio.to_thread(
                wait_until, lambda: len(txns) >= n + 3000
                and time.monotonic() - marks["killed"] >= 2.5, 60,
                what="3000 txns and 2.5 s without pump-2")
            marks["restarting"] = time.monotonic()
            await asyncio.to_thread(cluster.start_pump, "pump-2")
            marks["restarted"] = time.monotonic()   # it takes writes from here on
            await asyncio.to_thread(wait_until, lambda: "pump-2" in client.available_pumps(),
                                    PROBE_S + 5, 0.02, what="pump-2 to be probed back")
            marks["back"] = time.monotonic()
            back.set()
            await loader
            marks["failovers"] = client.metrics.m.registry.get_sample_value(
                "sluice_client_failovers_total")
            # Decisions that could not reach pump-2 while it was down are re-sent by now.
            await asyncio.to_thread(wait_until, lambda: client.pending_decisions == 0, 20,
                                    what="re-sent commits")
        finally:
            await client.close()
            await tso.close()
    asyncio.run(go())

    assert len(txns) == 20_000
    assert marks["back"] - marks["restarted"] <= PROBE_S + 1.5
    spread = Counter(p for t in txns for p in t.pumps)
    during = [t for t in txns if marks["killed"] + 1 < t.acked_at < marks["restarting"]]
    bad = [(round(t.acked_at - marks["killed"], 3), t.pumps, t.committed) for t in during
           if "pump-2" in t.pumps]
    assert during and not bad, (marks, bad[:10], len(bad))
    assert any("pump-2" in t.pumps for t in txns if t.acked_at > marks["back"] + 0.5), spread
    assert marks["failovers"] > 0
    assert sum(not t.committed for t in txns) < 200   # only those caught by the kill
    for node_id in cluster.pumps:
        wait_until(lambda: unresolved(cluster, node_id) == 0, 20,
                   what=f"{node_id} to have no unresolved prewrite")
    stored = pull_commits(cluster, max(t.commit_ts for t in txns))
    print("kill-9 story:", {k: round(v, 2) for k, v in marks.items()}, "not committed at once:",
          sum(not t.committed for t in txns), "copies:",
          Counter(Counter(s for c in stored.values() for s in c).values()))
    check_one_commit_ts(txns, stored, copies=1)
    # The drainer's merged stream: each transaction once, with its commit_ts, in commit order.
    merged = [b for b in drainer_pull(drainer.addr, t0, {t.commit_ts for t in txns}, consumer="",
                                      timeout=60) if b.producer_id == "load"]
    commits = [(b.start_ts, b.commit_ts) for b in merged if b.tp == pb.COMMIT]
    assert commits_in_order(merged) == sorted(t.commit_ts for t in txns)
    assert sorted(commits) == sorted((t.start_ts, t.commit_ts) for t in txns)
    drainer.proc.stop()


def test_replicas_two_keeps_two_copies_and_writes_continue_when_one_pump_dies(
        cluster: Cluster) -> None:
    """With replicas=2 every prewrite and commit is on two pumps with one commit_ts; when a pair
    member dies, writes continue on the other member plus another pump."""
    etcd = Etcd(cluster.etcd)
    Registry(etcd, cluster.cluster_id).put_json("config", {"replicas": 2})
    etcd.close()
    extra = {"replicas": 2} if "replicas" in PumpConfig.__dataclass_fields__ else {}
    cluster.start_tso()
    for i in (1, 2, 3):
        cluster.start_pump(f"pump-{i}", **extra)
    txns: list[Txn] = []
    marks: dict[str, float] = {}

    async def go() -> None:
        client = PumpsClient(cluster.etcd, cluster.cluster_id, probe_interval_s=PROBE_S,
                             write_timeout_s=3.0)
        tso = TSOClient(cluster.tso_addrs, cluster.cluster_id)
        await client.start()
        try:
            assert client.replicas == 2
            # ~2,000 transactions start after the kill, so how many land after it does not
            # depend on the machine's speed. pump-1 is frozen first and the gate opened, so the
            # kill finds prewrites in flight to it: with none in flight the client can learn of
            # the death from a failed commit and route around pump-1 without a single failover.
            opened = asyncio.Event()
            loader = asyncio.create_task(load(client, tso, 3000, txns, concurrency=32,
                                              gate=(1032, opened)))
            await asyncio.to_thread(wait_until, lambda: len(txns) >= 1000, 60, what="1000 txns")
            cluster.pumps["pump-1"].proc.signal(signal.SIGSTOP)
            opened.set()
            # Every worker is soon stuck on a write to pump-1 (2 of 3 pairs hold it): the acks
            # stop. The write timeout (3 s) is longer than this wait.
            await asyncio.to_thread(wait_until, acks_stopped(txns, 0.3), 2.5, 0.02,
                                    what="every worker waiting on frozen pump-1")
            cluster.pumps["pump-1"].proc.kill9()
            marks["killed"] = time.monotonic()
            await loader
            marks["failovers"] = client.metrics.m.registry.get_sample_value(
                "sluice_client_failovers_total")
            await asyncio.to_thread(cluster.start_pump, "pump-1")
            await asyncio.to_thread(wait_until, lambda: client.pending_decisions == 0, 20,
                                    what="re-sent commits")
        finally:
            await client.close()
            await tso.close()
    asyncio.run(go())

    assert len(txns) == 3000
    assert all(len(set(t.pumps)) == 2 for t in txns)
    # The last 500 acknowledgements all came after the kill, from the surviving pair.
    last = sorted(txns, key=lambda t: t.acked_at)[-500:]
    assert min(t.acked_at for t in last) > marks["killed"]
    assert all(set(t.pumps) == {"pump-2", "pump-3"} for t in last)
    assert all(t.committed for t in txns)   # one live member of the pair is enough
    assert marks["failovers"] > 0, marks
    for node_id in cluster.pumps:
        wait_until(lambda: unresolved(cluster, node_id) == 0, 20,
                   what=f"{node_id} to have no unresolved prewrite")
    stored = pull_commits(cluster, max(t.commit_ts for t in txns))
    check_one_commit_ts(txns, stored, copies=2)


def test_replicas_two_lost_pump_data_dir_then_mark_lost_every_txn_readable_from_the_other(
        cluster: Cluster) -> None:
    """replicas=2: a pump's data dir is destroyed and the pump marked lost with `sluice ctl
    mark-lost` (no --force needed with replicas) -> every acknowledged transaction is still
    readable, with its one commit_ts, from the other pump."""
    import shutil
    import subprocess

    from sluice.core.registry import NodeKind
    from tests.support.procs import sluice_argv

    etcd = Etcd(cluster.etcd)
    Registry(etcd, cluster.cluster_id).put_json("config", {"replicas": 2})
    cluster.start_tso()
    for i in (1, 2):
        cluster.start_pump(f"pump-{i}", replicas=2)
    txns: list[Txn] = []

    async def go() -> None:
        client = PumpsClient(cluster.etcd, cluster.cluster_id, probe_interval_s=PROBE_S)
        tso = TSOClient(cluster.tso_addrs, cluster.cluster_id)
        await client.start()
        try:
            await load(client, tso, 500, txns, concurrency=16)
        finally:
            await client.close()
            await tso.close()
    asyncio.run(go())
    assert len(txns) == 500 and all(set(t.pumps) == {"pump-1", "pump-2"} for t in txns)

    lost = cluster.pumps.pop("pump-1")
    lost.proc.kill9()
    shutil.rmtree(lost.data_dir)
    reg = Registry(etcd, cluster.cluster_id)
    wait_until(lambda: not reg.get(NodeKind.PUMP, "pump-1").alive, 30,   # type: ignore[union-attr]
               what="pump-1's alive key to expire")
    out = subprocess.run(sluice_argv("ctl", "--etcd", cluster.etcd, "--cluster-id",
                                     str(cluster.cluster_id), "mark-lost", "pump-1"),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    info = Registry(etcd, cluster.cluster_id).get(NodeKind.PUMP, "pump-1")
    etcd.close()
    assert info is not None and info.status.state.value == "offline"
    assert info.status.labels.get("lost") == "true"

    stored = pull_commits(cluster, max(t.commit_ts for t in txns))   # pump-2 only now
    check_one_commit_ts([dataclasses_replace_pumps(t, ("pump-2",)) for t in txns], stored, copies=1)


def dataclasses_replace_pumps(t: Txn, pumps: tuple[str, ...]) -> Txn:
    return Txn(t.start_ts, t.commit_ts, pumps, t.acked_at, t.committed)
