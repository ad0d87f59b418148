"""Pump write benchmark: 1 KiB binlogs, 64 concurrent writers each awaiting its own durable ack,
through coalesced batched writes, vs redis-server XADD with appendfsync always (same run).

Also PullBinlogs throughput (one stream, the whole store from ts 0, best of three) vs plain
sequential reads of the same segment files (header parse + payload read, best of three).
The pump's own CPU (user + system, from /proc) is reported per binlog written and per binlog
served: on a shared, saturated machine that is the number that compares across runs. With
`--followers N`, N PullBinlogs streams follow the writes live (as drainers do), so the write
phase's CPU per binlog includes serving each binlog N times as it becomes final.
With `--group N` each writer writes the capture's shape instead: N prewrites in one call, then
their N commits in one call (a capture group reaches the pump as one WriteBinlogs each way).

With `--rate R` each group writer starts at most R groups per second (a bounded rate, as the e2e
runs at 40-60% of native: the capture's groups of ~140 at ~13 groups/s).
With `--positions` every binlog of a group carries a source position, as the capture's do (the
pump records the producer's progress from the commits).
With `--count` the pump runs with bench/loopcount/ on its PYTHONPATH and the phase reports, per
group (a prewrite call and its commit call), the event-loop callbacks by function, the hand-offs
between threads and the loop, and the responses each follower got; with `--strace` the phase runs
under `strace -c -f` and reports the pump's system calls per group (both slow the pump: their
runs' CPU numbers are not comparable with plain runs).

With `--baseline REV` the write phase alone runs `--rounds` times for the pump of git revision REV
(its tree exported with `git archive` and put first on the pump's PYTHONPATH) and for this tree,
alternating, each on a fresh pump; it reports the medians of CPU per binlog and per transaction
(a prewrite and its commit) and new / old, with the load average of each run.
Usage: .venv/bin/python bench/pump_write.py [--seconds 10] [--writers 64] [--skip-redis]
       [--followers 2] [--group 50 [--rate 13]] [--count | --strace]
       [--baseline HEAD~3 --rounds 3] [--positions]
       [--baseline HEAD~1 --rounds 6 --group 84 --committer 150]

With `--committer GROUPS` (and `--baseline`, `--group`) only the storage committer is measured,
in process: GROUPS capture-shaped groups (positions on, values decoded by an admission check)
through `Storage.write_blocking`, old tree and this one alternating in fresh processes; it
reports the committer thread's CPU per binlog (staging, persisting, the fsync calls), which the
pump's gRPC and loop work would otherwise drown on a shared machine.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import datetime
import json
import signal
import os
import statistics
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import grpc  # noqa: E402

from sluice.client.batcher import WriteBatcher  # noqa: E402
from sluice.core import grpcutil, ts  # noqa: E402
from sluice.proto import sluice_pb2 as pb  # noqa: E402
from sluice.proto import sluice_pb2_grpc as pbg  # noqa: E402
from tests.support.cluster import CLUSTER_ID, Cluster  # noqa: E402
from tests.support.procs import EtcdServer, Proc, free_port, port_open, wait_until  # noqa: E402
from trees import export_tree  # noqa: E402

# ~1 KiB of incompressible row data in a valid PrewriteValue (pumps refuse values that do not
# decode); the producer "bench" is registered before writing (pumps admit registered producers).
PAYLOAD = pb.PrewriteValue(schema_version=1, mutations=[pb.TableMutation(table_id=1, changes=[
    pb.RowChange(tp=pb.INSERT, after=pb.Row(columns=[pb.Datum(bytes=os.urandom(1000))]))])]
).SerializeToString()


def proc_cpu(pid: int, system_only: bool = False) -> float:
    """CPU seconds (user + system, or system only) the process `pid` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[12]) if system_only else int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of process `pid` by thread: "loop" (the main thread: the event loop, gRPC's
    callbacks included) and "other" (the storage committer, gRPC's and asyncio's worker threads:
    Python names none of them in /proc, so they are not told apart)."""
    out = {"loop": 0.0, "other": 0.0}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue   # the thread ended
        kind = "loop" if task.name == str(pid) else "other"
        out[kind] += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))] * 1000 if values else 0.0


async def redis_run(port: int, writers: int, seconds: float, pipeline: int) -> tuple[float, list[float]]:
    import redis.asyncio as aioredis
    r = aioredis.Redis(host="127.0.0.1", port=port, max_connections=writers)
    lat: list[float] = []
    count = 0
    end = time.monotonic() + seconds

    async def writer() -> None:
        nonlocal count
        while time.monotonic() < end:
            t0 = time.monotonic()
            if pipeline == 1:
                await r.xadd("s", {"v": PAYLOAD})
            else:
                async with r.pipeline(transaction=False) as p:
                    for _ in range(pipeline):
                        p.xadd("s", {"v": PAYLOAD})
                    await p.execute()
            lat.append(time.monotonic() - t0)
            count += pipeline
    t0 = time.monotonic()
    await asyncio.gather(*(writer() for _ in range(writers)))
    rate = count / (time.monotonic() - t0)
    await r.aclose()
    return rate, lat


async def pump_run(addr: str, writers: int, seconds: float, group: int = 0, rate: float = 0,
                   positions: bool = False) -> tuple[float, list[float], int, int]:
    channel = grpcutil.aio_channel(addr)
    batcher = WriteBatcher(channel, CLUSTER_ID, max_batch=512, max_inflight=2)
    counter = ts.now_ts() + (1 << 30)
    lat: list[float] = []
    count = groups = 0
    end = time.monotonic() + seconds

    def next_ts() -> int:
        nonlocal counter
        counter += 1
        return counter

    async def group_writer() -> None:
        nonlocal count, groups
        next_at = time.monotonic()
        while time.monotonic() < end:
            if rate:
                # Paced from a fixed schedule (not from the last ack): a slow group is not
                # followed by a gap, as the capture's groups follow the source's commits.
                next_at += 1 / rate
                delay = next_at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            starts = [next_ts() for _ in range(group)]
            pos = [position_of(s) if positions else None for s in starts]
            t0 = time.monotonic()
            await batcher.write_many([pb.Binlog(
                tp=pb.PREWRITE, start_ts=s, prewrite_value=PAYLOAD, producer_id="bench",
                position=p).SerializeToString() for s, p in zip(starts, pos)])
            lat.append(time.monotonic() - t0)
            t0 = time.monotonic()
            await batcher.write_many([pb.Binlog(
                tp=pb.COMMIT, start_ts=s, commit_ts=next_ts(), producer_id="bench",
                position=p).SerializeToString() for s, p in zip(starts, pos)])
            lat.append(time.monotonic() - t0)
            count += 2 * group
            groups += 1

    async def writer() -> None:
        nonlocal count
        while time.monotonic() < end:
            s = next_ts()
            t0 = time.monotonic()
            await batcher.write(pb.Binlog(tp=pb.PREWRITE, start_ts=s, prewrite_value=PAYLOAD,
                                          producer_id="bench").SerializeToString())
            lat.append(time.monotonic() - t0)
            c = next_ts()
            t0 = time.monotonic()
            await batcher.write(pb.Binlog(tp=pb.COMMIT, start_ts=s, commit_ts=c,
                                          producer_id="bench").SerializeToString())
            lat.append(time.monotonic() - t0)
            count += 2
    t0 = time.monotonic()
    await asyncio.gather(*((group_writer() if group else writer()) for _ in range(writers)))
    rpcs = batcher.rpcs
    await batcher.close()
    await channel.close()
    return count / (time.monotonic() - t0), lat, rpcs, groups


def position_of(n: int) -> pb.Position:
    """A source position like the capture's (MariaDB GTID, file and offset) for `--positions`."""
    return pb.Position(file_seq=42, offset=n % (1 << 30), file_name="mysql-bin.000042",
                       gtids=[pb.GtidPos(domain_id=0, server_id=1, seq_no=n)], ts_ms=n >> 18)


def follow(addr: str, stop: threading.Event, counts: list[int], msgs: list[int], k: int,
           streams: list[grpc.Future]) -> None:
    """One live PullBinlogs stream from ts 0 until `stop` (counts[k]: binlogs received,
    msgs[k]: responses; the caller cancels the streams in `streams`)."""
    ch = grpc.insecure_channel(addr, options=grpcutil.CHANNEL_OPTIONS)
    stream = pbg.PumpStub(ch).PullBinlogs(pb.PullBinlogsReq(cluster_id=CLUSTER_ID,
                                                            after_commit_ts=0, packed_meta=True))
    streams.append(stream)
    try:
        for resp in stream:
            counts[k] += len(resp.binlogs)
            msgs[k] += 1
            if stop.is_set():
                break
    except grpc.RpcError:
        if not stop.is_set():
            raise
    finally:
        stream.cancel()
        ch.close()


@dataclass
class WritePhase:
    rate: float          # binlogs/s
    lat: list[float]     # seconds per awaited write call
    rpcs: int
    cpu: float           # pump CPU seconds (user + system) during the phase
    sys: float           # of them system
    written: int
    load: str            # load average at the start of the phase
    counts: list[int]    # binlogs each follower received
    msgs: list[int]      # responses each follower received
    threads: dict[str, float]   # pump CPU seconds per thread kind during the phase
    groups: int = 0             # groups written (with --group)
    loop_counts: dict[str, int] | None = None   # with --count: the phase's loop accounting
    syscalls: dict[str, int] | None = None      # with --strace: calls per system call

    @property
    def us_per_binlog(self) -> float:
        return self.cpu / self.written * 1e6

    @property
    def sys_per_binlog(self) -> float:
        return self.sys / self.written * 1e6


def write_phase(addr: str, pid: int, args: argparse.Namespace) -> WritePhase:
    """The write phase with `args.followers` live PullBinlogs streams; the pump's CPU from /proc."""
    load = loadavg()
    stop = threading.Event()
    counts = [0] * args.followers
    msgs = [0] * args.followers
    streams: list[grpc.Future] = []
    followers = [threading.Thread(target=follow, args=(addr, stop, counts, msgs, k, streams),
                                  daemon=True) for k in range(args.followers)]
    for t in followers:
        t.start()
    tracer = None
    if args.strace:
        tracer = subprocess.Popen(["strace", "-c", "-f", "-p", str(pid)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)   # attached to every thread before the phase starts
    counts0 = read_loop_counts(args)
    cpu0, sys0, th0 = proc_cpu(pid), proc_cpu(pid, system_only=True), thread_cpu(pid)
    rate, lat, rpcs, groups = asyncio.run(pump_run(addr, args.writers, args.seconds, args.group,
                                                   args.rate, args.positions))
    time.sleep(0.5 if args.count else 0)   # the pump's counts file is rewritten every 0.2 s
    loop_counts = None
    if args.count:
        after = read_loop_counts(args)
        loop_counts = {k: v - counts0.get(k, 0) for k, v in after.items()
                       if v - counts0.get(k, 0)}
    syscalls = None
    if tracer is not None:
        tracer.send_signal(signal.SIGINT)
        syscalls = parse_strace(tracer.communicate(timeout=30)[1])
    cpu = proc_cpu(pid) - cpu0
    sys_cpu = proc_cpu(pid, system_only=True) - sys0
    threads = {k: v - th0.get(k, 0.0) for k, v in thread_cpu(pid).items()}
    stop.set()
    for stream in streams:
        stream.cancel()
    for t in followers:
        t.join(timeout=30)
    return WritePhase(rate, lat, rpcs, cpu, sys_cpu, round(rate * args.seconds), load, counts,
                      msgs, threads, groups, loop_counts, syscalls)


def read_loop_counts(args: argparse.Namespace) -> dict[str, int]:
    if not args.count:
        return {}
    try:
        return json.loads(Path(args.count_file).read_text())
    except FileNotFoundError:
        return {}


def parse_strace(summary: str) -> dict[str, int]:
    """calls per system call from `strace -c`'s table (errors counted with the calls)."""
    out: dict[str, int] = {}
    for line in summary.splitlines():
        f = line.split()
        if len(f) >= 5 and f[0][0].isdigit() and f[-1] != "total":
            out[f[-1]] = int(f[3])
    return out


def pump_env(args: argparse.Namespace, base_root: Path | None) -> dict[str, str] | None:
    """The pump's environment: the old tree first on PYTHONPATH (`--baseline`), the loop
    accounting with `--count`."""
    paths = [str(base_root)] if base_root is not None else []
    env: dict[str, str] = {}
    if args.count:
        paths.append(str(REPO / "bench" / "loopcount"))
        env["SLUICE_LOOPCOUNT_FILE"] = args.count_file
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    return env or None


def report_per_group(ph: WritePhase, top: int = 25) -> None:
    """Per group: loop callbacks by function, hand-offs, follower responses, system calls."""
    g = max(ph.groups, 1)
    print(f"    per group ({ph.groups} groups, {ph.written / g:.0f} binlogs, "
          f"{ph.rpcs / g:.2f} write RPCs): follower responses "
          f"{sum(ph.msgs) / g:.2f}", flush=True)
    if ph.loop_counts:
        c = collections.Counter(ph.loop_counts)
        print("    loop: " + ", ".join(f"{k} {c[k] / g:.1f}" for k in
                                      ("callbacks", "call_soon_threadsafe", "run_in_executor")))
        gcs = [f"gen{gen} {c[f'gc gen{gen} collections'] / g:.2f} runs, "
               f"{c[f'gc gen{gen} us'] / g:.0f} µs" for gen in range(3)
               if c[f"gc gen{gen} collections"]]
        if gcs:
            print("    cyclic GC per group: " + "; ".join(gcs))
        for k, v in c.most_common(top + 3):
            if " " in k and not k.startswith("gc "):
                print(f"      {v / g:7.2f}  {k}")
    if ph.syscalls:
        print("    syscalls: " + ", ".join(
            f"{k} {v / g:.1f}" for k, v in sorted(ph.syscalls.items(), key=lambda kv: -kv[1])
            if v / g >= 0.1))


def compare(args: argparse.Namespace, cluster: Cluster, work: Path) -> None:
    """Old (`args.baseline`) and new pumps alternating, a fresh pump each run: medians."""
    base_root = export_tree(args.baseline, work)
    rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", args.baseline],
                         check=True, capture_output=True, text=True).stdout.strip()
    shape = (f"groups of {args.group} transactions per call" if args.group
             else "one binlog per write call, coalesced")
    print(f"compare: pump at {args.baseline} ({rev}) vs this tree; {args.writers} writers, "
          f"{shape}, {args.followers} live followers, {args.seconds}s x {args.rounds} rounds "
          "each, alternating", flush=True)
    runs: dict[str, list[WritePhase]] = {"old": [], "new": []}
    settings = {"heartbeat-interval": 3600.0, "pull-heartbeat-interval": 3600.0}
    for k in range(args.rounds):
        for which in (("old", "new") if k % 2 == 0 else ("new", "old")):
            env = pump_env(args, base_root if which == "old" else None)
            pump = cluster.start_pump(f"pump-{which}-{k}", env=env, **settings)
            try:
                ph = write_phase(pump.addr, pump.proc.pid, args)
            finally:
                pump.proc.stop()
                shutil.rmtree(pump.data_dir, ignore_errors=True)
                Path(args.count_file).unlink(missing_ok=True)   # the next pump's counts only
            runs[which].append(ph)
            print(f"  {which} #{k}: {ph.rate:,.0f} binlogs/s, {ph.written / max(ph.rpcs, 1):.1f} "
                  f"per RPC; pump CPU {ph.us_per_binlog:.1f} µs per binlog "
                  f"({ph.sys_per_binlog:.1f} system), {2 * ph.us_per_binlog:.1f} µs per txn; "
                  f"followers got {ph.counts} in {ph.msgs} responses (load {ph.load}); µs per "
                  "binlog by thread: " + ", ".join(
                      f"{k} {v / ph.written * 1e6:.1f}" for k, v in sorted(ph.threads.items())),
                  flush=True)
            if args.group:
                report_per_group(ph)
    med = {w: statistics.median(p.us_per_binlog for p in ps) for w, ps in runs.items()}
    med_sys = {w: statistics.median(p.sys_per_binlog for p in ps) for w, ps in runs.items()}
    med_rate = {w: statistics.median(p.rate for p in ps) for w, ps in runs.items()}
    today = datetime.date.today().isoformat()
    kinds = ("loop", "other")
    med_th = {w: {k: statistics.median(p.threads.get(k, 0.0) / p.written * 1e6 for p in ps)
                  for k in kinds} for w, ps in runs.items()}
    print(f"\n| pump | µs CPU / binlog | of them system | µs CPU / txn | by thread: "
          f"{' / '.join(kinds)} | binlogs/s | loads |\n|---|---:|---:|---:|---|---:|---|")
    for w in ("old", "new"):
        print(f"| {w} ({rev if w == 'old' else 'this tree'}) | {med[w]:.1f} | {med_sys[w]:.1f} | "
              f"{2 * med[w]:.1f} | {' / '.join(f'{med_th[w][k]:.1f}' for k in kinds)} | "
              f"{med_rate[w]:,.0f} | {'; '.join(p.load for p in runs[w])} |")
    print(f"\nnew / old CPU per binlog: {med['new'] / med['old']:.2f}x (medians of "
          f"{args.rounds}; {os.cpu_count()} cores, {today})")


def pull_all(addr: str, expect: int) -> tuple[float, float, int]:
    ch = grpc.insecure_channel(addr, options=grpcutil.CHANNEL_OPTIONS)
    stub = pbg.PumpStub(ch)
    n = size = 0
    t0 = time.monotonic()
    stream = stub.PullBinlogs(pb.PullBinlogsReq(cluster_id=CLUSTER_ID, after_commit_ts=0), timeout=300)
    for resp in stream:
        n += len(resp.binlogs)
        size += sum(map(len, resp.binlogs))
        if n >= expect:
            break
    stream.cancel()
    dt = time.monotonic() - t0
    ch.close()
    return n / dt, size / dt / 1e6, n


def raw_read(data_dir: Path) -> tuple[float, float, int]:
    import struct
    n = size = 0
    t0 = time.monotonic()
    for seg in sorted((data_dir / "vlog").glob("*.log")):
        with open(seg, "rb", buffering=1 << 20) as f:
            while True:
                head = f.read(12)
                if len(head) < 12:
                    break
                (length,) = struct.unpack_from(">I", head, 4)
                payload = f.read(length)
                n += 1
                size += len(payload)
    dt = time.monotonic() - t0
    return n / dt, size / dt / 1e6, n


def committer_probe(group: int, groups: int) -> None:
    """In this process (no gRPC): `groups` capture-shaped groups (G prewrites with positions
    through an admission that decodes every value, then their G commits) through
    `Storage.write_blocking`; prints the committer thread's CPU µs per binlog as JSON."""
    from sluice.client import binlogs
    from sluice.pump.admission import ProducerAdmission
    from sluice.pump.storage.storage import Storage

    class Admit:
        def check(self, producer_id: str) -> None:
            pass
        check_value = staticmethod(ProducerAdmission.check_value)

    work = Path(tempfile.mkdtemp(prefix="sluice-bench-committer-"))
    try:
        st = Storage.open(work / "pump")
        st.admission = Admit()
        tid = st._committer._thread.native_id

        def cpu() -> float:
            f = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
        ident = binlogs.identity("bench", 1)
        start = ts.now_ts()
        c0, n = cpu(), 0
        for _ in range(groups):
            pre = [binlogs.prewrite(start + i, PAYLOAD, binlogs.tail(
                ident, position_of(start + i).SerializeToString(), None, 1)) for i in range(group)]
            st.write_blocking([p.raw for p in pre])
            st.write_blocking([binlogs.commit_of(p, start + group + i).raw
                               for i, p in enumerate(pre)])
            start += 2 * group + 1
            n += 2 * group
        print(json.dumps({"us": (cpu() - c0) / n * 1e6}))
        st.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def compare_committer(args: argparse.Namespace) -> None:
    """`--committer`: the storage committer alone, old tree and this one alternating, each in a
    fresh process (`committer_probe`); medians of `--rounds`."""
    work = Path(tempfile.mkdtemp(prefix="sluice-bench-committer-cmp-"))
    try:
        base_root = export_tree(args.baseline, work)
        runs: dict[str, list[float]] = {"old": [], "new": []}
        for k in range(args.rounds):
            for which in (("old", "new") if k % 2 == 0 else ("new", "old")):
                env = dict(os.environ)
                if which == "old":
                    env["PYTHONPATH"] = str(base_root)
                load = loadavg()
                out = subprocess.run([sys.executable, __file__, "--committer-probe", "--group",
                                      str(args.group), "--rounds", str(args.committer)],
                                     env=env, check=True, capture_output=True, text=True).stdout
                us = json.loads(out.splitlines()[-1])["us"]
                runs[which].append(us)
                print(f"  {which} #{k}: committer {us:.2f} µs CPU per binlog (load {load})",
                      flush=True)
        med = {w: statistics.median(v) for w, v in runs.items()}
        print(f"committer µs CPU per binlog, medians of {args.rounds}: old ({args.baseline}) "
              f"{med['old']:.2f}, new {med['new']:.2f}, new / old {med['new'] / med['old']:.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--writers", type=int, default=64)
    ap.add_argument("--followers", type=int, default=0,
                    help="live PullBinlogs streams during the write phase (drainers)")
    ap.add_argument("--skip-redis", action="store_true",
                    help="pump only (CPU per binlog needs no redis; the ratio rows are omitted)")
    ap.add_argument("--group", type=int, default=0,
                    help="transactions per write call (the capture's shape); 0: one binlog")
    ap.add_argument("--baseline", default="",
                    help="git revision of the old pump: compare write phases only, alternating")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each pump with --baseline")
    ap.add_argument("--rate", type=float, default=0,
                    help="with --group: at most this many groups per second per writer")
    ap.add_argument("--positions", action="store_true",
                    help="group binlogs carry a source position, as the capture's do")
    ap.add_argument("--count", action="store_true",
                    help="count the pump's event-loop callbacks and thread hand-offs per group")
    ap.add_argument("--strace", action="store_true",
                    help="count the pump's system calls per group (strace -c -f)")
    ap.add_argument("--committer", type=int, default=0, metavar="GROUPS",
                    help="with --baseline and --group: the storage committer alone, in process, "
                         "GROUPS capture-shaped groups per run (no gRPC, no pump process)")
    ap.add_argument("--committer-probe", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.committer_probe:
        committer_probe(args.group, args.rounds)
        return 0
    if args.committer:
        compare_committer(args)
        return 0
    work = Path(tempfile.mkdtemp(prefix="sluice-bench-pump-"))
    args.count_file = str(work / "loopcount.json")
    etcd = EtcdServer(work / "etcd").start()
    cluster = Cluster(work, etcd.endpoint)
    cluster.register_producer("bench")
    if args.baseline:
        try:
            cluster.start_tso()
            compare(args, cluster, work)
        finally:
            cluster.stop()
            etcd.stop()
            shutil.rmtree(work, ignore_errors=True)
        return 0
    redis_port = free_port()
    redis = Proc("redis", ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
                           "--appendonly", "yes", "--appendfsync", "always", "--save", "",
                           "--dir", str(work)], work / "redis.log").start()
    try:
        wait_until(lambda: port_open(redis_port), 10, what="redis")
        cluster.start_tso()
        pump = cluster.start_pump(env=pump_env(args, None), **{
            "heartbeat-interval": 3600.0, "pull-heartbeat-interval": 3600.0})
        print(f"benchmark: {args.writers} writers, {args.seconds}s each phase, 1 KiB binlogs", flush=True)
        r1 = r16 = 0.0
        rl1: list[float] = []
        if not args.skip_redis:
            r1, rl1 = asyncio.run(redis_run(redis_port, args.writers, args.seconds, 1))
            print(f"  redis XADD appendfsync=always: {r1:,.0f}/s", flush=True)
            r16, _ = asyncio.run(redis_run(redis_port, args.writers, args.seconds, 16))
            print(f"  redis XADD pipeline 16:        {r16:,.0f}/s", flush=True)
        pid = pump.proc.pid
        ph = write_phase(pump.addr, pid, args)
        ours, lat, rpcs, write_cpu, written = ph.rate, ph.lat, ph.rpcs, ph.cpu, ph.written
        served = (f", {args.followers} live followers got {ph.counts} binlogs in {ph.msgs} "
                  "responses" if args.followers else "")
        print(f"  sluice pump batched writes:    {ours:,.0f}/s ({rpcs} RPCs{served}); pump CPU "
              f"{write_cpu:.2f} s = {ph.us_per_binlog:.1f} µs per binlog written, "
              f"{ph.sys_per_binlog:.1f} of them system (load {ph.load})", flush=True)
        if args.group:
            report_per_group(ph)
        total = int(ours * args.seconds)
        # Best of three for both, alternating, so a burst of load from other processes on the
        # machine does not decide the ratio.
        pulls, raws, pull_cpus = [], [], []
        for _ in range(3):
            cpu0 = proc_cpu(pid)
            pulls.append(pull_all(pump.addr, int(total * 0.95)))
            pull_cpus.append((proc_cpu(pid) - cpu0) / pulls[-1][2] * 1e6)
            raws.append(raw_read(pump.data_dir))
        pull_rate, pull_mb, n = max(pulls)
        raw_rate, raw_mb, rn = max(raws)
        print(f"  PullBinlogs: {pull_rate:,.0f}/s; raw segment read: {raw_rate:,.0f}/s; pump CPU "
              f"per binlog served {min(pull_cpus):.1f} µs (best of 3; load {loadavg()})",
              flush=True)
    finally:
        cluster.stop()
        redis.stop()
        etcd.stop()
        shutil.rmtree(work, ignore_errors=True)   # pump data, etcd, redis: hundreds of MB a run
    today = datetime.date.today().isoformat()
    machine = f"{os.cpu_count()} cores"
    rows = [] if args.skip_redis else [
        ("pump writes vs redis XADD (64 asyncio callers)", f"{r1:,.0f}/s", f"{ours:,.0f}/s", ours / r1),
        ("pump writes vs redis XADD pipeline 16", f"{r16:,.0f}/s", f"{ours:,.0f}/s", ours / r16),
    ]
    rows += [
        ("PullBinlogs vs raw segment read (binlogs/s)", f"{raw_rate:,.0f}/s", f"{pull_rate:,.0f}/s",
         pull_rate / raw_rate),
    ]
    print(f"\n| what | baseline | ours | ratio | machine | date |\n|---|---|---|---|---|---|")
    for what, base, our, ratio in rows:
        print(f"| {what} | {base} | {our} | {ratio:.2f}x | {machine} | {today} |")
    print(f"\npump CPU: {write_cpu / written * 1e6:.1f} µs per binlog written, "
          f"{min(pull_cpus):.1f} µs per binlog served")
    print(f"ack latency ours p50 {pct(lat, .5):.2f} ms p99 {pct(lat, .99):.2f} ms; redis p50 "
          f"{pct(rl1, .5):.2f} ms p99 {pct(rl1, .99):.2f} ms; binlogs per RPC "
          f"{ours * args.seconds / max(rpcs, 1):.1f}; PullBinlogs {pull_mb:.1f} MB/s vs raw "
          f"{raw_mb:.1f} MB/s ({n} vs {rn} records)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
