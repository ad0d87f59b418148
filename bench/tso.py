"""TSO throughput and latency: the streaming batching client against one etcd put per timestamp.

    .venv/bin/python bench/tso.py [--seconds 5] [--requesters 16] [--inflight 1,2,4] [--profile]

Starts a real etcd and one `sluice tso` server on free ports, then, in the same run:
- baseline: `requesters` threads, each awaiting one etcd `put` per timestamp (a naive oracle that
  persists every timestamp),
- ours (main line): `requesters` asyncio tasks, each awaiting one `TSOClient.get_ts()` at a time
  through the streaming client (GetTSStream, up to `max_inflight` requests pipelined), once per
  `--inflight` value; the first value is the headline,
- ours, unary (secondary line): the same client with `stream=False` (one GetTS RPC in flight),
- raw stream floor: GetTSStream(count=1) ping-pong, one message in flight,
and prints a markdown table (what, baseline, ours, ratio, machine, date) for docs/benchmarks.md,
then the CPU breakdown of each run: CPU microseconds per timestamp and per message of the client
(this process, `time.process_time`) and of the server process (psutil), so the ceiling can be
explained. `--profile` adds a cProfile of the client loop for the headline run. Bounded: about
(4 + number of --inflight values) x --seconds plus start-up.
"""
from __future__ import annotations

import argparse
import asyncio
import cProfile
import datetime as dt
import io
import os
import platform
import pstats
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sluice.core import grpcutil  # noqa: E402
from sluice.core.etcd import Etcd  # noqa: E402
from sluice.core.tso_client import TSOClient, read_leader  # noqa: E402
from sluice.proto import sluice_pb2 as pb, sluice_pb2_grpc as pbg  # noqa: E402
from tests.support.procs import EtcdServer, Proc, free_port, sluice_argv, wait_until  # noqa: E402

CLUSTER = 1


@dataclass
class Run:
    what: str
    count: int            # timestamps handed out
    messages: int         # requests sent (RPCs or stream messages)
    elapsed: float
    latencies: list[float]
    client_cpu: float     # seconds, this process
    server_cpu: float     # seconds, the tso process (0 for the baseline)
    etcd_cpu: float

    @property
    def rate(self) -> float:
        return self.count / self.elapsed

    def pct_ms(self, q: float) -> float:
        s = sorted(self.latencies)
        return s[min(len(s) - 1, int(len(s) * q))] * 1000 if s else float("nan")


class CPU:
    """CPU seconds of this process and of the server processes across a measured section."""

    def __init__(self, server: psutil.Process | None, etcd: psutil.Process) -> None:
        self.server, self.etcd = server, etcd

    @staticmethod
    def _of(p: psutil.Process | None) -> float:
        if p is None:
            return 0.0
        t = p.cpu_times()
        return t.user + t.system + t.children_user + t.children_system

    def __enter__(self) -> "CPU":
        self.c0, self.s0, self.e0 = time.process_time(), self._of(self.server), self._of(self.etcd)
        return self

    def __exit__(self, *exc: object) -> None:
        self.client = time.process_time() - self.c0
        self.srv = self._of(self.server) - self.s0
        self.etc = self._of(self.etcd) - self.e0


def baseline(endpoint: str, requesters: int, seconds: float, cpu: CPU) -> Run:
    """Every timestamp is one etcd put (a counter persisted per ts)."""
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

    with cpu:
        t0 = time.monotonic()
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(requesters)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t0
    flat = [x for per in lat for x in per]
    return Run("1 etcd put per ts", len(flat), len(flat), elapsed, flat, cpu.client, 0.0, cpu.etc)


async def ours(addr: str, requesters: int, seconds: float, cpu: CPU, *, stream: bool,
               max_inflight: int, profile: cProfile.Profile | None = None) -> Run:
    """`requesters` tasks each awaiting one get_ts() at a time through one TSOClient."""
    client = TSOClient([addr], CLUSTER, stream=stream, max_inflight=max_inflight)
    await client.get_ts()
    lat: list[float] = []
    last = [0] * requesters
    seen: set[int] = set()
    sent_before = client.requests_sent
    end = time.monotonic() + seconds

    async def requester(i: int) -> None:
        while time.monotonic() < end:
            t0 = time.monotonic()
            ts = await client.get_ts()
            lat.append(time.monotonic() - t0)
            if ts <= last[i]:
                raise AssertionError("timestamps went backwards")
            last[i] = ts
            seen.add(ts)

    with cpu:
        if profile is not None:
            profile.enable()
        t0 = time.monotonic()
        await asyncio.gather(*(requester(i) for i in range(requesters)))
        elapsed = time.monotonic() - t0
        if profile is not None:
            profile.disable()
    messages = client.requests_sent - sent_before
    await client.close()
    if len(seen) != len(lat):
        raise AssertionError("a timestamp was handed out twice")
    kind = f"stream, {max_inflight} in flight" if stream else "unary GetTS"
    return Run(kind, len(lat), messages, elapsed, lat, cpu.client, cpu.srv, cpu.etc)


async def raw_stream(addr: str, seconds: float, cpu: CPU) -> Run:
    """GetTSStream(count=1) ping-pong, one message in flight: the per-message floor here."""
    channel = grpcutil.aio_channel(addr)
    call = pbg.TSOStub(channel).GetTSStream()
    req = pb.GetTSReq(cluster_id=CLUSTER, count=1)
    await call.write(req)
    await call.read()
    lat: list[float] = []
    end = time.monotonic() + seconds
    with cpu:
        t0 = time.monotonic()
        while time.monotonic() < end:
            t1 = time.monotonic()
            await call.write(req)
            await call.read()
            lat.append(time.monotonic() - t1)
        elapsed = time.monotonic() - t0
    await call.done_writing()
    await channel.close()
    return Run("raw stream ping-pong, count=1", len(lat), len(lat), elapsed, lat, cpu.client,
               cpu.srv, cpu.etc)


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
    ap.add_argument("--inflight", default="2,1,4",
                    help="comma-separated max_inflight values; the first is the headline")
    ap.add_argument("--profile", action="store_true", help="cProfile the headline client run")
    args = ap.parse_args()
    inflights = [int(x) for x in args.inflight.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="sluice-bench-tso-"))
    etcd_server = EtcdServer(tmp).start()
    addr = f"127.0.0.1:{free_port()}"
    tso = Proc("tso", sluice_argv("tso", "--set", f"addr='{addr}'", "--set",
                                  f"etcd='{etcd_server.endpoint}'", "--log-file",
                                  str(tmp / "tso.log")), tmp / "tso.out").start()
    profile = cProfile.Profile() if args.profile else None
    runs: list[Run] = []
    try:
        etcd = Etcd(etcd_server.endpoint, timeout=2)
        wait_until(lambda: read_leader(etcd, CLUSTER), 20, what="TSO leader")
        etcd.close()
        assert tso.popen is not None
        server_p = psutil.Process(tso.popen.pid)
        etcd_p = psutil.Process(etcd_server.proc.popen.pid)  # type: ignore[union-attr]
        n = args.requesters
        base = baseline(etcd_server.endpoint, n, args.seconds, CPU(None, etcd_p))
        for i, k in enumerate(inflights):
            runs.append(asyncio.run(ours(addr, n, args.seconds, CPU(server_p, etcd_p),
                                         stream=True, max_inflight=k,
                                         profile=profile if i == 0 else None)))
        runs.append(asyncio.run(ours(addr, n, args.seconds, CPU(server_p, etcd_p),
                                     stream=False, max_inflight=1)))
        runs.append(asyncio.run(raw_stream(addr, min(args.seconds, 3.0),
                                           CPU(server_p, etcd_p))))
    finally:
        tso.stop()
        etcd_server.stop()
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    mach = machine()
    head = runs[0]
    print(f"| what | baseline ({base.what}) | ours | ratio | machine | date |")
    print("|---|---|---|---|---|---|")
    for r in runs[:-1]:
        print(f"| ts/s, {n} requesters, {args.seconds:.0f}s, {r.what} | {base.rate:,.0f} | "
              f"{r.rate:,.0f} | {r.rate / base.rate:.1f}x | {mach} | {when} |")
    print(f"| p50 / p99 latency ms, {head.what} | {base.pct_ms(0.5):.2f} / {base.pct_ms(0.99):.2f}"
          f" | {head.pct_ms(0.5):.2f} / {head.pct_ms(0.99):.2f} | "
          f"{base.pct_ms(0.99) / head.pct_ms(0.99):.1f}x lower p99 | {mach} | {when} |")
    print()
    print("| run | ts/s | msg/s | ts/msg | p50 ms | p99 ms | client CPU us/msg | server CPU us/msg "
          "| client+server CPU s per s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in [base, *runs]:
        msgs = max(r.messages, 1)
        print(f"| {r.what} | {r.rate:,.0f} | {r.messages / r.elapsed:,.0f} | "
              f"{r.count / msgs:.1f} | {r.pct_ms(0.5):.2f} | {r.pct_ms(0.99):.2f} | "
              f"{r.client_cpu / msgs * 1e6:.0f} | {r.server_cpu / msgs * 1e6:.0f} | "
              f"{(r.client_cpu + r.server_cpu) / r.elapsed:.2f} |")
    raw = runs[-1]
    print(f"\nceiling: each requester waits at least one stream round trip per ts, so {n} "
          f"requesters get at most {n} x the raw ping-pong rate = {n * raw.rate:,.0f} ts/s here "
          f"(raw round trip p50 {raw.pct_ms(0.5):.2f} ms, client {raw.client_cpu / raw.messages * 1e6:.0f}"
          f" + server {raw.server_cpu / raw.messages * 1e6:.0f} CPU us per message); "
          f"goal 50,000 ts/s needs a round trip <= {n / 50_000 * 1e6:.0f} us")
    if profile is not None:
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(15)
        print("\ncProfile of the headline client run (tottime):\n" + out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
