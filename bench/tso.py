"""TSO throughput and latency: the batching client against one etcd put per timestamp.

    .venv/bin/python bench/tso.py [--seconds 5] [--requesters 16]

Starts a real etcd and one `sluice tso` server on free ports, then, in the same run:
- baseline: `requesters` threads, each awaiting one etcd `put` per timestamp (a naive oracle that
  persists every timestamp),
- ours: `requesters` asyncio tasks, each awaiting one `TSOClient.get_ts()` at a time (the client
  coalesces them into one GetTS(count) RPC in flight),
and prints a markdown table (what, baseline, ours, ratio, machine, date) for docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sluice.core import grpcutil  # noqa: E402
from sluice.core.etcd import Etcd  # noqa: E402
from sluice.core.tso_client import TSOClient, read_leader  # noqa: E402
from sluice.proto import sluice_pb2 as pb, sluice_pb2_grpc as pbg  # noqa: E402
from tests.support.procs import EtcdServer, Proc, free_port, sluice_argv, wait_until  # noqa: E402

CLUSTER = 1


def p99_ms(latencies: list[float]) -> float:
    s = sorted(latencies)
    return s[min(len(s) - 1, int(len(s) * 0.99))] * 1000 if s else float("nan")


def baseline(endpoint: str, requesters: int, seconds: float) -> tuple[float, float]:
    """ts/s and p99 ms when every timestamp is one etcd put (a counter persisted per ts)."""
    lat: list[list[float]] = [[] for _ in range(requesters)]
    end = time.monotonic() + seconds

    def worker(i: int) -> None:
        etcd = Etcd(endpoint, timeout=5)
        n = 0
        while time.monotonic() < end:
            t0 = time.monotonic()
            etcd.put(f"/bench/tso-baseline/{i}", str(n))
            lat[i].append(time.monotonic() - t0)
            n += 1
        etcd.close()

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(requesters)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    flat = [x for per in lat for x in per]
    return len(flat) / elapsed, p99_ms(flat)


async def ours(addr: str, requesters: int, seconds: float) -> tuple[float, float]:
    """ts/s and p99 ms through the batching client."""
    client = TSOClient([addr], CLUSTER)
    await client.get_ts()
    lat: list[float] = []
    last = [0] * requesters
    end = time.monotonic() + seconds

    async def requester(i: int) -> None:
        while time.monotonic() < end:
            t0 = time.monotonic()
            ts = await client.get_ts()
            lat.append(time.monotonic() - t0)
            assert ts > last[i], "timestamps went backwards"
            last[i] = ts

    t0 = time.monotonic()
    await asyncio.gather(*(requester(i) for i in range(requesters)))
    elapsed = time.monotonic() - t0
    await client.close()
    return len(lat) / elapsed, p99_ms(lat)


async def raw_rpc_rate(addr: str, seconds: float) -> float:
    """GetTS(1) round trips per second with one call in flight: the per-RPC floor here."""
    channel = grpcutil.aio_channel(addr)
    stub = pbg.TSOStub(channel)
    req = pb.GetTSReq(cluster_id=CLUSTER, count=1)
    await stub.GetTS(req)
    n, end, t0 = 0, time.monotonic() + seconds, time.monotonic()
    while time.monotonic() < end:
        await stub.GetTS(req)
        n += 1
    rate = n / (time.monotonic() - t0)
    await channel.close()
    return rate


def machine() -> str:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0]
    return f"{os.cpu_count()} cores {model}, {platform.system()} {platform.release()}, load {load:.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--requesters", type=int, default=16)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sluice-bench-tso-"))
    etcd_server = EtcdServer(tmp).start()
    addr = f"127.0.0.1:{free_port()}"
    tso = Proc("tso", sluice_argv("tso", "--set", f"addr='{addr}'", "--set",
                                  f"etcd='{etcd_server.endpoint}'", "--log-file",
                                  str(tmp / "tso.log")), tmp / "tso.out").start()
    try:
        etcd = Etcd(etcd_server.endpoint, timeout=2)
        wait_until(lambda: read_leader(etcd, CLUSTER), 20, what="TSO leader")
        etcd.close()
        base_rate, base_p99 = baseline(etcd_server.endpoint, args.requesters, args.seconds)
        our_rate, our_p99 = asyncio.run(ours(addr, args.requesters, args.seconds))
        rpc_rate = asyncio.run(raw_rpc_rate(addr, min(args.seconds, 3.0)))
    finally:
        tso.stop()
        etcd_server.stop()
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    mach = machine()
    n = args.requesters
    print("| what | baseline (1 etcd put per ts) | ours (batching client) | ratio | machine | date |")
    print("|---|---|---|---|---|---|")
    print(f"| ts/s, {n} requesters, {args.seconds:.0f}s | {base_rate:,.0f} | {our_rate:,.0f} | "
          f"{our_rate / base_rate:.1f}x | {mach} | {when} |")
    print(f"| p99 latency ms | {base_p99:.2f} | {our_p99:.2f} | {base_p99 / our_p99:.1f}x lower | "
          f"{mach} | {when} |")
    print(f"\nfloor: GetTS(1) with one RPC in flight = {rpc_rate:,.0f} RPC/s on this machine "
          f"(so {n} requesters can reach at most ~{rpc_rate * n:,.0f} ts/s at this RPC rate)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
