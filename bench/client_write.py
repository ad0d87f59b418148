"""Client write benchmark: transactions/s through PumpsClient vs direct batched writes.

A transaction = Prewrite (1 KiB value) acked, then commit_ts from the TSO client, then Commit
acked; 64 concurrent producers. Baseline (same run, same binlogs, same TSO client): one
WriteBatcher straight to one pump — the pump benchmark's direct batched writes. Ours:
PumpsClient (registry, routing, retries, ack bookkeeping) to 1, 2 and 3 pumps. Baseline and
ours at 1 pump alternate in rounds so drift on a shared machine hits both. For every phase the
CPU seconds of each process (this client process, each pump, TSO, etcd) show where the ceiling is.
Usage: .venv/bin/python bench/client_write.py [--seconds 8] [--rounds 2] [--producers 64]
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

from sluice.client.batcher import WriteBatcher  # noqa: E402
from sluice.client.pumps import PumpsClient, check_commit_ts  # noqa: E402
from sluice.core import grpcutil  # noqa: E402
from sluice.core.tso_client import TSOClient  # noqa: E402
from sluice.proto import sluice_pb2 as pb  # noqa: E402
from tests.support.cluster import CLUSTER_ID, Cluster  # noqa: E402
from tests.support.procs import EtcdServer  # noqa: E402

# ~1 KiB of incompressible row data in a valid PrewriteValue (pumps refuse values that do not
# decode); the producer "bench" is registered before writing (pumps admit registered producers).
VALUE = pb.PrewriteValue(schema_version=1, mutations=[pb.TableMutation(table_id=1, changes=[
    pb.RowChange(tp=pb.INSERT, after=pb.Row(columns=[pb.Datum(bytes=os.urandom(1000))]))])]
).SerializeToString()
QUIET = {"heartbeat-interval": 3600.0, "pull-heartbeat-interval": 3600.0}
LAST_CPU_US: list[float] = []   # bench-process CPU per transaction of each drive() call

async def drive(tso: TSOClient, txn: Callable[[TSOClient], Awaitable[None]], producers: int,
                seconds: float) -> float:
    count = 0
    end = time.monotonic() + seconds

    async def producer() -> None:
        nonlocal count
        while time.monotonic() < end:
            await txn(tso)
            count += 1
    t0 = time.monotonic()
    c0 = time.process_time()
    await asyncio.gather(*(producer() for _ in range(producers)))
    # CPU of this process (every thread) while transactions flow, without start-up and close.
    LAST_CPU_US.append((time.process_time() - c0) / max(count, 1) * 1e6)
    return count / (time.monotonic() - t0)


async def direct(addr: str, tso_addrs: list[str], producers: int, seconds: float) -> float:
    channel = grpcutil.aio_channel(addr)
    batcher = WriteBatcher(channel, CLUSTER_ID, max_batch=512, max_inflight=2)
    tso = TSOClient(tso_addrs, CLUSTER_ID)

    async def txn(tso: TSOClient) -> None:
        s = await tso.get_ts()
        await batcher.write(pb.Binlog(tp=pb.PREWRITE, start_ts=s, prewrite_value=VALUE,
                                      producer_id="bench").SerializeToString())
        c = await tso.get_ts()
        await batcher.write(pb.Binlog(tp=pb.COMMIT, start_ts=s, commit_ts=c,
                                      producer_id="bench").SerializeToString())
    try:
        return await drive(tso, txn, producers, seconds)
    finally:
        await batcher.close()
        await channel.close()
        await tso.close()


async def through_client(etcd: str, tso_addrs: list[str], producers: int, seconds: float,
                         expect_pumps: int) -> float:
    client = PumpsClient(etcd, CLUSTER_ID)
    await client.start()
    tso = TSOClient(tso_addrs, CLUSTER_ID)
    assert len(client.available_pumps()) == expect_pumps, client.available_pumps()

    async def txn(tso: TSOClient) -> None:
        s = await tso.get_ts()
        ack = await client.write_prewrite(pb.Binlog(tp=pb.PREWRITE, start_ts=s,
                                                    prewrite_value=VALUE, producer_id="bench"))
        c = await tso.get_ts()
        check_commit_ts(c, ack)
        await client.write_commits([pb.Binlog(tp=pb.COMMIT, start_ts=s, commit_ts=c,
                                              producer_id="bench")], ack)
    try:
        return await drive(tso, txn, producers, seconds)
    finally:
        await client.close()
        await tso.close()


class CpuMeter:
    """CPU seconds per process over one phase (this process via time.process_time)."""

    def __init__(self, procs: dict[str, int]) -> None:
        self.procs = {name: psutil.Process(pid) for name, pid in procs.items()}
        self.wall, self.used = 0.0, {}

    def _sample(self) -> dict[str, float]:
        out = {"client (bench process)": time.process_time()}
        for name, p in self.procs.items():
            t = p.cpu_times()
            out[name] = t.user + t.system
        return out

    def __enter__(self) -> "CpuMeter":
        self.t0, self.start = time.monotonic(), self._sample()
        return self

    def __exit__(self, *exc: object) -> None:
        end = self._sample()
        self.wall = time.monotonic() - self.t0
        self.used = {k: end[k] - self.start[k] for k in end}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--producers", type=int, default=64)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sluice-bench-client-"))
    etcd = EtcdServer(work / "etcd").start()
    cluster = Cluster(work, etcd.endpoint)
    cluster.register_producer("bench")
    breakdown: list[tuple[str, float, CpuMeter]] = []
    base_rates: list[float] = []
    one_rates: list[float] = []
    scaled: dict[int, float] = {}
    try:
        tso = cluster.start_tso()
        p1 = cluster.start_pump("pump-1", **QUIET)
        procs = {"etcd": etcd.proc.pid, "tso": tso.pid, "pump-1": p1.proc.pid}  # type: ignore[union-attr]
        print(f"client benchmark: {args.producers} producers, 1 KiB prewrites, "
              f"{args.seconds}s phases, {args.rounds} rounds at 1 pump", flush=True)

        # One event loop for every phase: grpc.aio's poller outlives a closed loop otherwise.
        async def phases() -> None:
            for r in range(args.rounds):
                with CpuMeter(procs) as m:
                    rate = await direct(p1.addr, cluster.tso_addrs, args.producers, args.seconds)
                base_rates.append(rate)
                breakdown.append((f"direct WriteBatcher, 1 pump, round {r + 1}", rate, m))
                print(f"  direct batched writes, 1 pump:  {rate:,.0f} txn/s, "
                      f"{LAST_CPU_US[-1]:.0f} us CPU/txn in this process", flush=True)
                with CpuMeter(procs) as m:
                    rate = await through_client(etcd.endpoint, cluster.tso_addrs, args.producers,
                                                args.seconds, 1)
                one_rates.append(rate)
                breakdown.append((f"PumpsClient, 1 pump, round {r + 1}", rate, m))
                print(f"  PumpsClient, 1 pump:            {rate:,.0f} txn/s, "
                      f"{LAST_CPU_US[-1]:.0f} us CPU/txn in this process", flush=True)
            scaled[1] = statistics.median(one_rates)
            for n in (2, 3):
                h = await asyncio.to_thread(cluster.start_pump, f"pump-{n}", **QUIET)
                procs[f"pump-{n}"] = h.proc.pid
                with CpuMeter(procs) as m:
                    rate = await through_client(etcd.endpoint, cluster.tso_addrs, args.producers,
                                                args.seconds, n)
                scaled[n] = rate
                breakdown.append((f"PumpsClient, {n} pumps", rate, m))
                print(f"  PumpsClient, {n} pumps:           {rate:,.0f} txn/s, "
                      f"{LAST_CPU_US[-1]:.0f} us CPU/txn in this process", flush=True)
        asyncio.run(phases())
    finally:
        cluster.stop()
        etcd.stop()
    base = statistics.median(base_rates)
    today = datetime.date.today().isoformat()
    load = os.getloadavg()[0]
    machine = f"{os.cpu_count()} cores, load {load:.1f}"
    print("\n| what | baseline | ours | ratio | machine | date |\n|---|---|---|---|---|---|")
    print(f"| txn/s, 1 pump: PumpsClient vs direct WriteBatcher (median of {args.rounds}) | "
          f"{base:,.0f}/s | {scaled[1]:,.0f}/s | {scaled[1] / base:.2f}x | {machine} | {today} |")
    for n in (2, 3):
        print(f"| txn/s, {n} pumps: PumpsClient vs direct WriteBatcher to 1 pump | {base:,.0f}/s | "
              f"{scaled[n]:,.0f}/s | {scaled[n] / base:.2f}x | {machine} | {today} |")
    print(f"\nclient overhead at 1 pump: {(1 - scaled[1] / base) * 100:+.1f}% "
          f"(rounds: direct {', '.join(f'{r:,.0f}' for r in base_rates)}; "
          f"client {', '.join(f'{r:,.0f}' for r in one_rates)})")
    names = ["client (bench process)", "tso", "etcd", "pump-1", "pump-2", "pump-3"]
    print("\nCPU seconds per process over each phase (cores used = CPU s / wall s):\n")
    print("| phase | txn/s | " + " | ".join(names) + " | total cores |")
    print("|---|---|" + "---|" * len(names) + "---|")
    for what, rate, m in breakdown:
        cells = [f"{m.used[n]:.1f}" if n in m.used else "-" for n in names]
        print(f"| {what} | {rate:,.0f} | " + " | ".join(cells)
              + f" | {sum(m.used.values()) / m.wall:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
