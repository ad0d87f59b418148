"""kill -9 stories for the pump process: nothing acknowledged is lost (invariant 7)."""
from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest

from sluice.proto import sluice_pb2 as pb
from sluice.proto import sluice_pb2_grpc as pbg
from tests.support.binlogs import TS, commit, decode, prewrite, pv
from tests.support.cluster import CLUSTER_ID, Cluster

pytestmark = pytest.mark.timeout(180)


async def _writers(addr_of, ts: TS, acked: list[tuple[int, int]], started: list[int],
                   stop: threading.Event, n: int = 8) -> None:  # type: ignore[no-untyped-def]
    async def write(payload: bytes) -> None:
        while not stop.is_set():
            ch = grpc.aio.insecure_channel(addr_of())
            try:
                await pbg.PumpStub(ch).WriteBinlogs(
                    pb.WriteBinlogsReq(cluster_id=CLUSTER_ID, payloads=[payload]), timeout=3)
                return
            except grpc.RpcError as e:
                if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
                await asyncio.sleep(0.05)
            finally:
                await ch.close()
        raise asyncio.CancelledError

    async def one(i: int) -> None:
        while not stop.is_set():
            s = await asyncio.to_thread(ts.get)
            started.append(s)
            try:
                await write(prewrite(s, pv("x" * random.randint(10, 3000))))
                c = await asyncio.to_thread(ts.get)
                await write(commit(s, c))
            except asyncio.CancelledError:
                return
            acked.append((s, c))
    await asyncio.gather(*(one(i) for i in range(n)))


def _pull_all(addr: str, upto: int) -> list[pb.Binlog]:
    ch = grpc.insecure_channel(addr)
    out: list[pb.Binlog] = []
    stream = pbg.PumpStub(ch).PullBinlogs(pb.PullBinlogsReq(cluster_id=CLUSTER_ID, after_commit_ts=0),
                                          timeout=30)
    for resp in stream:
        out += [b for b in map(decode, resp.binlogs) if b.tp != pb.FAKE]
        if resp.watermark >= upto:
            break
    stream.cancel()
    ch.close()
    return out


def test_kill9_during_concurrent_writes_loses_no_acknowledged_binlog(tmp_path: Path, etcd) -> None:  # type: ignore[no-untyped-def]
    """Every acknowledged binlog is served after kill -9 at random moments and at the failpoint
    between the vlog sync and the index sync, in commit order, exactly once; nothing
    unacknowledged is served half-joined."""
    cluster = Cluster(tmp_path, etcd.endpoint)
    try:
        cluster.start_tso()
        pump = cluster.start_pump()
        ts = TS(cluster.tso_addrs, CLUSTER_ID)
        acked: list[tuple[int, int]] = []
        started: list[int] = []
        stop = threading.Event()
        t = threading.Thread(target=lambda: asyncio.run(_writers(lambda: pump.addr, ts, acked,
                                                                 started, stop)),
                             daemon=True)
        t.start()
        rounds = [None, "storage-after-vlog-sync=exit(137)@40", None,
                  "storage-after-vlog-sync=exit(137)@15"]
        for fp in rounds:
            time.sleep(random.uniform(0.8, 1.6))
            pump.proc.kill9()
            if fp is not None:
                # Restart armed: the N-th group dies between the vlog sync and the index sync.
                pump = cluster.start_pump(pump.node_id, env={"SLUICE_FAILPOINTS": fp},
                                          wait_online=False)
                deadline = time.monotonic() + 30
                while pump.proc.alive() and time.monotonic() < deadline:
                    time.sleep(0.1)
                assert not pump.proc.alive(), "failpoint did not fire"
            pump = cluster.start_pump(pump.node_id)
        time.sleep(1.0)
        stop.set()
        t.join(30)
        # Writers stopped between a prewrite and its commit leave it unresolved: roll it back,
        # as the producer's TxnStatus answer would.
        ch = grpc.insecure_channel(pump.addr)
        stub = pbg.PumpStub(ch)
        committed = {s for s, _ in acked}
        for s in started:
            if s not in committed:
                st = stub.GetCommit(pb.GetCommitReq(cluster_id=CLUSTER_ID, start_ts=s)).state
                if st == pb.TXN_UNKNOWN:
                    stub.ResolveTxn(pb.ResolveTxnReq(cluster_id=CLUSTER_ID, start_ts=s, rollback=True))
        ch.close()
        final = ts.get()
        got = _pull_all(pump.addr, final)
        commits = [b for b in got if b.tp == pb.COMMIT]
        assert len(acked) > 50, "the load did not run"
        counts = Counter(b.start_ts for b in commits)
        assert not [s for s, n in counts.items() if n > 1], "a transaction was served twice"
        served = {b.start_ts: b.commit_ts for b in commits}
        missing = [(s, c) for s, c in acked if served.get(s) != c]
        assert not missing, f"acknowledged but not served: {missing[:5]}"
        assert [b.commit_ts for b in commits] == sorted(b.commit_ts for b in commits)
        # Every served commit is preceded by its prewrite (joined whole).
        prewrites = set()
        for b in got:
            if b.tp == pb.PREWRITE:
                prewrites.add(b.start_ts)
            else:
                assert b.start_ts in prewrites, f"commit {b.start_ts} served without its prewrite"
        ts.close()
    finally:
        cluster.stop()
