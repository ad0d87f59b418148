"""End to end: MariaDB native replication vs Sluice, under sysbench `oltp_write_only`, same run.

1. baseline — native replication: a source MariaDB and a GTID replica (`CHANGE MASTER TO ...
   MASTER_USE_GTID=slave_pos`, MariaDB 10.11 defaults otherwise: one SQL thread), both started
   as tests/support/mariadb.py starts them (own datadirs and ports, --no-defaults, ROW / FULL /
   FULL binlogs, utf8mb4, innodb-flush-log-at-trx-commit=2, sync-binlog=0). sysbench at full
   speed for --native-seconds: the source's max rate (tps), replica lag from probe rows
   (p50/p99) and Seconds_Behind_Master, and the drain time after the load stops. Then
   (--native-rate-seconds, default 30; 0 skips it) the same replication at Sluice's target rate
   (--rate-fraction of that max): the replica costs more CPU per transaction at a lower rate
   (smaller commit groups), so the pipeline is compared with the replica at both rates.
2. Sluice — `sluice cluster up` from a generated cluster.toml: etcd, 2 TSOs, 2 pumps, a local
   MariaDB source + capture, a MySQL drainer into a downstream MariaDB this script starts (like
   the replica), and a Spark drainer (Iceberg tables, embedded catalog). The cluster's
   MariaDB gets `SET GLOBAL innodb_flush_log_at_trx_commit=2` so the source is configured as
   the native one. sysbench at --rate = --rate-fraction (default 0.5) of the native max for
   --sluice-seconds, probe rows every 200 ms → lag p50/p95/p99 into MariaDB (rows polled every
   50 ms) and into Spark (the Spark drainer's durable etcd checkpoint position, see
   bench/e2e_support.py), drain time after.
   --profile: then a second window at the same rate (--profile-seconds) with py-spy recording
   the capture, each pump and each drainer (kept out of the measured window: the samplers take
   CPU from the same cores); the top frames per process as markdown tables (self share: the
   frame was the innermost one; total: it was on the stack; by default of the samples in which
   the process held the GIL, i.e. of its Python CPU).
   Then (unless --no-steps) the Spark drainer is stopped and the rate is stepped (--steps,
   fractions of the native max, --step-seconds each) into the MariaDB downstream only; the
   sustained rate is the source tps of the largest step whose lag stays bounded: every probe
   seen, p99 < 3 s and the lag not trending up (least-squares slope < 0.05 s per s and last
   third's p50 < first third's + 1 s); stepping stops after a step whose lag grows.
3. Report (stdout): first the CPU table — for the native window and the Sluice window of the same
   invocation, per process, **ms of CPU per source transaction** = (utime + stime from
   /proc/<pid>/stat at the end of the sysbench run − at its start, the process's live
   descendants and the children it reaped included: the Spark drainer's JVM is counted in the
   Spark drainer) × 1000 / the transactions sysbench committed in that run; and % of one core
   over the same window. sysbench's CPU comes from its own exit rusage (wait4), this script's
   (probe writer, pollers) from getrusage(RUSAGE_SELF). Rows: source mariadbd, replica (native) /
   downstream (Sluice) mariadbd, capture, each pump, each drainer, each TSO, etcd, the cluster
   supervisor, sysbench, this script; subtotals source side / pipeline (every Sluice process) /
   replica-or-downstream / all; then the lag percentiles into MariaDB (native: the replica) and
   into Spark. Then the summary table (with the pipeline with one drainer — capture, pumps,
   TSO, etcd, supervisor, the MySQL drainer — against the replica's CPU per transaction at full
   speed and at Sluice's rate: issue #23's <= 2x; and, per drainer and pump, the largest lag of
   the drainer's view of the pump behind the pump's served watermark, sampled every second),
   %CPU and Prometheus rates per phase, the profile
   tables, and one JSON line.

Probes: a row in `bench_probe.probe` committed every 200 ms on the source, the commit's wall time
noted when COMMIT returns; lag = first time a sink shows it − that time (one clock: this process).
Drain time: a probe inserted the moment sysbench exits; the time until the sink shows it.

    .venv/bin/python bench/e2e.py [--quick] [--no-spark] [--no-steps] [--rate-fraction 0.5]
        [--sluice-seconds 75] [--profile [--profile-seconds 30]] [--keep-dir] [--json-out F]

Progress lines go to stderr (one every 10 s while a window runs: the newest probe's lag per
sink); the machine is shared, so the load average is recorded with each phase. py-spy needs root
(it attaches to the processes); requirements.txt pins it.
Everything started here is stopped here, by pid (`sluice cluster down` for the cluster).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil  # noqa: E402

from e2e_support import (CheckpointPoller, LagSampler, LagStats, Probes, PySpy,  # noqa: E402
                         RowPoller, Sysbench, SysbenchResult, connect, cpu_percent, cpu_seconds,
                         lag_stats, loop_stalls, metric_rates, percentile, profiles_markdown,
                         py_spy_path, say, scrape, spark_batches, StreamLagSampler)

REPO = Path(__file__).resolve().parents[1]
PASSWORD = "sluice-root"
PRODUCER = "capture-1"
MYSQL_DRAINER, SPARK_DRAINER = "drainer-mysql", "drainer-spark"
SINK_REPLICA, SINK_MYSQL, SINK_SPARK = "replica", "mariadb", "spark"
P99_GOAL = {SINK_MYSQL: 3.0, SINK_SPARK: 10.0}   # issues #23 and #19
KEEP = re.compile(r"^sluice_")


def uptime() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


# ---------------------------------------------------------------------------------------------
# A measured phase: probes + pollers + CPU + metrics around one sysbench run
# ---------------------------------------------------------------------------------------------

class Phase:
    def __init__(self, name: str, probes: Probes, sinks: list[str], pids: dict[str, int],
                 metrics: dict[str, str]) -> None:
        self.name, self.probes, self.sinks = name, probes, sinks
        self.pids, self.metrics_addrs = pids, metrics
        self.result: dict[str, Any] = {"phase": name}

    def run(self, bench: Sysbench, seconds: int, rate: int, drain_timeout: float) -> dict[str, Any]:
        say(f"{self.name}: sysbench {seconds}s at {'full speed' if not rate else f'--rate={rate}'}")
        self.probes.phase = self.name
        m0 = {k: scrape(a) for k, a in self.metrics_addrs.items()}
        c0, w0 = cpu_seconds(self.pids), time.time()
        self0 = resource.getrusage(resource.RUSAGE_SELF)
        load0 = os.getloadavg()
        ticker = Progress(self.name, self.probes, self.sinks, seconds).start()
        streams = StreamLagSampler(self.metrics_addrs).start()
        try:
            res = bench.run(seconds, rate)
        finally:
            ticker.stop()
            worst_stream = streams.stop()
        c1, w1 = cpu_seconds(self.pids), time.time()
        self1 = resource.getrusage(resource.RUSAGE_SELF)
        # The load generator and this script (probes, pollers) run on the same cores.
        c0.update({"sysbench": 0.0, "bench-probes": 0.0})
        c1.update({"sysbench": res.cpu_s, "bench-probes": (self1.ru_utime - self0.ru_utime)
                   + (self1.ru_stime - self0.ru_stime)})
        m1 = {k: scrape(a) for k, a in self.metrics_addrs.items()}
        final = self.probes.insert(self.name + "-final")
        say(f"{self.name}: {res.tps:.0f} tps; waiting for the sinks to drain")
        drains = {s: self.probes.wait_seen(s, final, drain_timeout) for s in self.sinks}
        drained_at = max((final.committed + d for d in drains.values() if d is not None),
                         default=time.time())
        probes = self.probes.snapshot()
        lags = {s: lag_stats(probes, s, res.started, res.ended) for s in self.sinks}
        self.result.update({
            "rate": rate, "seconds": seconds, "tps": round(res.tps, 1),
            "transactions": res.transactions, "sysbench_p99_ms": res.lat_p99_ms,
            "sysbench_errors": res.errors,
            "tps_min_1s": min(res.per_second[1:-1] or res.per_second or [math.nan]),
            "lag": {s: v.to_dict() for s, v in lags.items()},
            "drain_s": {s: None if d is None else round(d, 3) for s, d in drains.items()},
            "cpu_pct": cpu_percent(c0, c1, w1 - w0),
            "window_s": round(w1 - w0, 2),
            "cpu_s": {k: round(c1[k] - c0.get(k, 0.0), 3) for k in c1},
            # CPU of each process over the sysbench run / sysbench's transactions in that run
            "cpu_ms_per_txn": {k: round(1000 * (c1[k] - c0.get(k, 0.0)) / res.transactions, 4)
                               for k in c1} if res.transactions else {},
            "metrics": {k: metric_rates(m0[k], m1[k], w1 - w0, KEEP) for k in m1 if m1[k]},
            # the largest lag of each drainer's view of each pump behind that pump's served
            # watermark, sampled every second (a stalled reader shows here first)
            "stream_lag_max_s": worst_stream,
            "load_before": [round(x, 2) for x in load0], "load_after": [round(x, 2) for x in os.getloadavg()],
        })
        self._lags, self._res, self._drained_at = lags, res, drained_at
        for s in self.sinks:
            v = lags[s]
            say(f"{self.name}: into {s}: p50 {v.p50:.3f}s p99 {v.p99:.3f}s max {v.max:.3f}s "
                f"slope {v.slope:+.4f} missing {v.missing}/{v.probes}; drain "
                f"{'timeout' if drains[s] is None else f'{drains[s]:.2f}s'}")
        say(f"{self.name}: cpu% {self.result['cpu_pct']}; {uptime()}")
        return self.result

    @property
    def lags(self) -> dict[str, LagStats]:
        return self._lags

    @property
    def sysbench(self) -> SysbenchResult:
        return self._res


class Progress:
    """A progress line every `every` seconds while a phase runs: elapsed of planned, and per
    sink the lag of the newest probe it shows and how many committed probes it does not yet."""

    def __init__(self, name: str, probes: Probes, sinks: list[str], seconds: int, every: float = 10.0) -> None:
        import threading
        self.name, self.probes, self.sinks, self.seconds, self.every = name, probes, sinks, seconds, every
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)

    def start(self) -> "Progress":
        self.t0 = time.monotonic()
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._halt.wait(self.every):
            items = self.probes.snapshot()
            parts = []
            for s in self.sinks:
                seen = [p for p in items if s in p.seen]
                last = max(seen, key=lambda p: p.id) if seen else None
                unseen = sum(1 for p in items if s not in p.seen)
                parts.append(f"{s}: newest seen lag "
                             f"{'n/a' if last is None else f'{last.seen[s] - last.committed:.2f}s'}, "
                             f"{unseen} unseen")
            say(f"{self.name}: {time.monotonic() - self.t0:.0f}/{self.seconds}s; " + "; ".join(parts)
                + f"; {uptime()}")

    def stop(self) -> None:
        self._halt.set()
        self._thread.join(5)


def sync_sinks(probes: Probes, sinks: list[str], timeout: float, what: str) -> None:
    """Insert a probe and wait until every sink shows it (everything before it is applied)."""
    p = probes.insert("sync")
    for s in sinks:
        t0 = time.monotonic()
        while probes.wait_seen(s, p, 10) is None:
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"{what}: {s} did not catch up within {timeout:.0f}s")
            say(f"{what}: waiting for {s} to catch up ({time.monotonic() - t0:.0f}s)")
    say(f"{what}: {', '.join(sinks)} caught up")


# ---------------------------------------------------------------------------------------------
# 1. native replication
# ---------------------------------------------------------------------------------------------

def run_native(a: argparse.Namespace, workdir: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
    from tests.support.mariadb import MariaDBServer
    say("native: starting source and replica MariaDB")
    src = MariaDBServer(workdir / "native-source", server_id=1).start()
    stack.callback(src.stop)
    rep = MariaDBServer(workdir / "native-replica", server_id=2).start()
    stack.callback(rep.stop)
    with connect(rep.port, PASSWORD) as conn, conn.cursor() as cur:
        cur.execute(f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={src.port}, "
                    f"MASTER_USER='root', MASTER_PASSWORD='{PASSWORD}', MASTER_USE_GTID=slave_pos")
        cur.execute("START SLAVE")
        cur.execute("SELECT @@slave_parallel_threads, @@slave_parallel_mode")
        par = cur.fetchone()
    probes = Probes(src.port, PASSWORD)
    probes.create_table()
    poller = RowPoller(SINK_REPLICA, probes, rep.port, PASSWORD).start()
    sampler = LagSampler(rep.port, PASSWORD)
    try:
        bench = Sysbench(src.port, PASSWORD, a.tables, a.table_size, a.threads)
        say(f"native: sysbench prepare {a.tables} x {a.table_size}")
        bench.prepare()
        sync_sinks(probes, [SINK_REPLICA], 300, "native prepare")
        sampler.start()
        probes.start(a.probe_interval)
        pids = {"mariadb-source": src.proc.pid, "mariadb-replica": rep.proc.pid}  # type: ignore[union-attr]
        phase = Phase("native", probes, [SINK_REPLICA], pids, {})
        out = phase.run(bench, a.native_seconds, 0, a.drain_timeout)
        if a.native_rate_seconds:
            # The replica's CPU per transaction falls as its rate rises (larger commit groups,
            # fuller reads): at full speed it is cheaper per transaction than at the rate Sluice
            # is measured at, so the pipeline is compared with both.
            rate = max(1, round(out["tps"] * a.rate_fraction))
            same = Phase(f"native-{a.rate_fraction:.0%}", probes, [SINK_REPLICA], pids, {})
            out["same_rate"] = same.run(bench, a.native_rate_seconds, rate, a.drain_timeout)
        sbm = sampler.between(phase.sysbench.started, phase.sysbench.ended + 0.5)
        out["seconds_behind_master"] = {"max": max(sbm, default=None),
                                        "p50": _pct(sbm, 50), "samples": len(sbm)}
        out["replica_parallel"] = {"slave_parallel_threads": par[0], "slave_parallel_mode": par[1]}
        return out
    finally:
        probes.stop()
        sampler.stop()
        poller.stop()
        probes.close()


def _pct(values: list[float], q: float) -> float | None:
    return None if not values else percentile(values, q)


# ---------------------------------------------------------------------------------------------
# 2. Sluice
# ---------------------------------------------------------------------------------------------

def cluster_toml(downstream_port: int, spark: bool, current_state: str = "delete") -> str:
    # Spark's session start takes minutes on a loaded machine.
    text = f"""cluster-id = 1
start-timeout = 900.0
stop-timeout = 30.0

[pump]
count = 2

[[drainers]]
name = "{MYSQL_DRAINER}"
sink = "mysql"
to = {{ host = "127.0.0.1", port = {downstream_port}, user = "root", password = "{PASSWORD}" }}
"""
    if spark:
        text += f"""
[[drainers]]
name = "{SPARK_DRAINER}"
sink = "spark"
to = {{ "current-state" = "{current_state}" }}
"""
    return text + """
[mariadb]
enabled = true

[capture]
enabled = true
"""


def cluster_cli(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sluice.ctl.main", "cluster", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


def cluster_down(cdir: Path) -> None:
    if not (cdir / "cluster.json").exists():
        return
    say(f"sluice: sluice cluster down --dir {cdir}")
    r = cluster_cli("down", "--dir", str(cdir), timeout=300)
    if r.returncode != 0:
        say(f"cluster down: exit {r.returncode}: {r.stdout[-1500:]}{r.stderr[-1500:]}")
    sweep_orphans(cdir)


def sweep_orphans(cdir: Path) -> None:
    """Stop any process the cluster in cdir started that is still alive after `down` (by its
    recorded pid, only while its command line still names this cluster dir)."""
    from sluice.ctl.cluster import read_state
    from sluice.ctl.cluster_config import Layout
    state = read_state(Layout(cdir))
    for r in state.processes if state else []:
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(r.pid)
            if p.status() != psutil.STATUS_ZOMBIE and any(str(cdir) in x for x in p.cmdline()):
                say(f"sluice: {r.name} (pid {r.pid}) survived `cluster down`; stopping it")
                stop_pid(r.pid, 15)


def stop_pid(pid: int, timeout: float = 30) -> None:
    """SIGTERM, then SIGKILL, one process this script started (through the cluster)."""
    with contextlib.suppress(psutil.NoSuchProcess):
        p = psutil.Process(pid)
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout)
        except psutil.TimeoutExpired:
            p.kill()
            p.wait(10)


PROFILED = re.compile(r"^(capture|pump-\d+|drainer-.*)$")


def stall_text(proc: str, stalls: list[dict[str, Any]]) -> str:
    lasted = ", ".join(f"{st['seconds']:.1f}s" for st in stalls)
    busiest = stalls[-1]["threads"] or "n/a"
    return f"{proc} {len(stalls)}x ({lasted}; busiest threads in the last: {busiest})"


def run_profile(a: argparse.Namespace, bench: Sysbench, rate: int, probes: Probes, sinks: list[str],
                pids: dict[str, int], metrics: dict[str, str], workdir: Path) -> dict[str, Any]:
    """A second window at the same rate with py-spy on the capture, each pump and each drainer
    (kept apart from the measured window: the samplers take CPU from the same cores)."""
    try:
        sync_sinks(probes, sinks, a.drain_timeout, "before profile")
    except RuntimeError as e:
        # A sink still behind does not stop the profile: the processes are busy either way.
        say(f"profile: {e}; profiling anyway")
    targets = {k: v for k, v in pids.items() if PROFILED.match(k)}
    say(f"profile: py-spy on {', '.join(targets)} for {a.profile_seconds}s at {a.profile_rate} Hz")
    spy = PySpy(targets, a.profile_seconds, a.profile_rate, workdir / "profiles", REPO,
                a.profile_mode).start()
    try:
        ph = Phase("profile", probes, sinks, pids, metrics)
        r = ph.run(bench, a.profile_seconds, rate, a.drain_timeout)
        profiles = spy.finish()
    finally:
        spy.stop()
    r["target_fraction"] = a.rate_fraction
    r["pyspy_cpu_s"] = {p.name: round(p.cpu_s, 2) for p in profiles}
    r["markdown"] = profiles_markdown(
        profiles, a.profile_top,
        f"py-spy {a.profile_rate} Hz, {a.profile_seconds} s, {r['tps']:,.0f} source tps "
        f"(target {rate}), --nonblocking --function"
        + (" --gil: shares of the samples in which a thread of the process held the GIL (its "
           "Python CPU)" if a.profile_mode == "gil" else
           ": shares of the samples of threads py-spy judged not idle (wall time on a loaded "
           "machine)")
        + "; self = the innermost Python frame, total = anywhere on the stack")
    if a.profile_out:
        Path(a.profile_out).write_text(r["markdown"] + "\n")
    for p in profiles:
        say(f"profile: {p.name}: {p.samples} samples{'; ' + p.errors if p.errors else ''}")
    return r


def run_sluice(a: argparse.Namespace, native_tps: float, workdir: Path,
               stack: contextlib.ExitStack, out: dict[str, Any]) -> dict[str, Any]:
    """Fills `out` as it goes, so a failure late in the run still reports what was measured."""
    from sluice.ctl.cluster import read_state
    from sluice.ctl.cluster_config import Layout
    from tests.support.mariadb import MariaDBServer
    say("sluice: starting the downstream MariaDB")
    down = MariaDBServer(workdir / "sluice-downstream", server_id=3).start()
    stack.callback(down.stop)
    conf = workdir / "cluster.toml"
    conf.write_text(cluster_toml(down.port, a.spark, a.spark_current_state))
    t0 = time.monotonic()
    cdir = workdir / "cluster"
    for attempt in (1, 2, 3):
        cdir = workdir / f"cluster-{attempt}"
        say(f"sluice: sluice cluster up --dir {cdir} (spark: {a.spark})")
        stack.callback(cluster_down, cdir)
        overrides = [arg for kv in a.set for arg in ("--set", kv)]
        up = cluster_cli("up", "--dir", str(cdir), "--config", str(conf), *overrides,
                         timeout=2400)
        if up.returncode == 0:
            break
        # `up` stopped what it started; sweep_orphans catches what it missed (`running()` in
        # ctl/cluster.py can misread a live child as gone: psutil's cmdline() is transiently
        # [] while a process starts). Retried in a fresh dir.
        sweep_orphans(cdir)
        say(f"sluice: cluster up failed (attempt {attempt}): {(up.stdout + up.stderr)[-800:]}")
        out.setdefault("cluster_up_failures", []).append((up.stdout + up.stderr)[-1500:])
        with connect(down.port, PASSWORD) as conn, conn.cursor() as cur:
            for db in ("sluice", "sbtest", "bench_probe"):   # the first attempt's sink state
                cur.execute(f"DROP DATABASE IF EXISTS {db}")
    if up.returncode != 0:
        raise RuntimeError(f"sluice cluster up failed ({up.returncode}):\n{up.stdout[-3000:]}{up.stderr[-3000:]}")
    out["cluster_up_s"] = round(time.monotonic() - t0, 1)
    state = read_state(Layout(cdir))
    assert state is not None
    procs = {r.name: r for r in state.processes}
    say(f"sluice: cluster up in {out['cluster_up_s']}s: {', '.join(procs)}")
    src_port = int(procs["mariadb"].addr.rsplit(":", 1)[1])
    with connect(src_port, PASSWORD) as conn, conn.cursor() as cur:
        # As the native source and tests/support/mariadb.py run (sync_binlog is 0 by default).
        cur.execute("SET GLOBAL innodb_flush_log_at_trx_commit = 2")
    pids = {name: r.pid for name, r in procs.items()}
    if state.supervisor is not None:
        pids["supervisor"] = state.supervisor.pid
    pids["mariadb-downstream"] = down.proc.pid  # type: ignore[union-attr]
    metrics = {name: r.metrics_addr for name, r in procs.items() if r.metrics_addr}

    probes = Probes(src_port, PASSWORD)
    probes.create_table()
    pollers = [RowPoller(SINK_MYSQL, probes, down.port, PASSWORD).start()]
    sinks = [SINK_MYSQL]
    if a.spark:
        pollers.append(CheckpointPoller(SINK_SPARK, probes, state.etcd, state.cluster_id,
                                        SPARK_DRAINER, PRODUCER,
                                        security=state.security_config()).start())
        sinks.append(SINK_SPARK)
    try:
        bench = Sysbench(src_port, PASSWORD, a.tables, a.table_size, a.threads)
        say(f"sluice: sysbench prepare {a.tables} x {a.table_size} (flows through the pipeline)")
        t0 = time.monotonic()
        bench.prepare()
        sync_sinks(probes, [SINK_MYSQL], a.catchup_timeout, "sluice prepare")
        if a.spark:
            try:
                sync_sinks(probes, [SINK_SPARK], a.catchup_timeout, "sluice prepare")
            except RuntimeError as e:
                # Measure MariaDB anyway; the report says Spark was not measured and why.
                out["spark_error"] = str(e)
                sinks.remove(SINK_SPARK)
                say(f"sluice: {e}; continuing without Spark")
        out["prepare_catchup_s"] = round(time.monotonic() - t0, 1)
        probes.start(a.probe_interval)

        rate = max(1, round(native_tps * a.rate_fraction))
        half = Phase(f"sluice-{a.rate_fraction:.0%}", probes, sinks, pids, metrics)
        t_half = time.time()
        out["half"] = half.run(bench, a.sluice_seconds, rate, a.drain_timeout)
        out["half"]["target_fraction"] = a.rate_fraction
        if a.spark:
            out["half"]["spark_batches"] = spark_batches(Layout(cdir).log(SPARK_DRAINER),
                                                         t_half, time.time())
        logs = Layout(cdir).root / "logs"
        out["half"]["loop_stalls"] = loop_stalls(logs, t_half, time.time())

        if a.profile:
            t_prof = time.time()
            out["profile"] = run_profile(a, bench, rate, probes, sinks, pids, metrics, workdir)
            out["profile"]["loop_stalls"] = loop_stalls(logs, t_prof, time.time())

        if a.spark and a.steps:
            say("sluice: stopping the Spark drainer (steps go into MariaDB only)")
            stop_pid(procs[SPARK_DRAINER].pid)
            pids.pop(SPARK_DRAINER, None)
            metrics.pop(SPARK_DRAINER, None)
        steps: list[dict[str, Any]] = out.setdefault("steps", [])
        out["sustained"] = None
        for frac in a.steps:
            sync_sinks(probes, [SINK_MYSQL], a.drain_timeout, f"before step {frac:.0%}")
            rate = max(1, round(native_tps * frac))
            ph = Phase(f"step-{frac:.0%}", probes, [SINK_MYSQL], pids, metrics)
            r = ph.run(bench, a.step_seconds, rate, a.drain_timeout)
            v = ph.lags[SINK_MYSQL]
            r["target_fraction"] = frac
            r["bounded"] = bool(v.missing == 0 and v.p99 < P99_GOAL[SINK_MYSQL]
                                and not (v.slope >= 0.05)
                                and not (v.last_third_p50 > v.first_third_p50 + 1.0))
            steps.append(r)
            say(f"step {frac:.0%}: {'bounded' if r['bounded'] else 'NOT bounded'}")
            if r["bounded"]:
                out["sustained"] = r
            elif r["drain_s"][SINK_MYSQL] is None or v.slope >= 0.05:
                break     # lag grows at this rate: higher steps only grow it faster
        return out
    finally:
        probes.stop()
        for p in pollers:
            p.stop()
        probes.close()


# ---------------------------------------------------------------------------------------------
# 3. Report
# ---------------------------------------------------------------------------------------------

def _f(v: Any, fmt: str = "{:.2f}", unit: str = "") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return fmt.format(v) + unit


def _proc_order(name: str) -> tuple[int, str]:
    order = ["mariadb-source", "mariadb", "mariadb-replica", "mariadb-downstream", "capture",
             "pump-", "drainer-mysql", "drainer-", "tso-", "etcd", "supervisor", "sysbench",
             "bench-probes"]
    for i, prefix in enumerate(order):
        if name == prefix or (prefix.endswith("-") and name.startswith(prefix)):
            return i, name
    return len(order), name


_LABEL = {"mariadb-source": "source mariadbd", "mariadb": "source mariadbd",
          "mariadb-replica": "replica mariadbd", "mariadb-downstream": "downstream mariadbd",
          "drainer-spark": "drainer-spark (with its JVM)", "sysbench": "sysbench (load generator)",
          "bench-probes": "bench/e2e.py (probes, pollers)"}


def cpu_table(native: dict[str, Any], ph: dict[str, Any] | None, target: float = 0.8) -> list[str]:
    """The CPU table: ms of CPU per source transaction and % of one core for every process,
    native and Sluice side by side, subtotals per role, then the lag percentiles. The last
    column: cores the process would need at `target` x the native rate if its CPU per
    transaction stayed as measured (ms/txn x rate / 1000)."""
    label = f"Sluice {ph['target_fraction']:.0%}" if ph else "Sluice"
    goal_tps = target * native["tps"]
    out = [f"| process | native: ms CPU / txn | native: % of a core | {label}: ms CPU / txn "
           f"| {label}: % of a core | cores at {target:g}x native ({goal_tps:,.0f} tps) |",
           "|---|---:|---:|---:|---:|---:|"]

    def cores(ms: float | None) -> str:
        return _f(None if ms is None else ms * goal_tps / 1000, "{:.2f}")
    n_ms, n_pct = native.get("cpu_ms_per_txn", {}), native.get("cpu_pct", {})
    s_ms, s_pct = (ph or {}).get("cpu_ms_per_txn", {}), (ph or {}).get("cpu_pct", {})
    # One row per role: the native source and Sluice's source MariaDB share a row, and so do
    # the native replica and Sluice's downstream.
    same = {"mariadb-source": "mariadb", "mariadb-replica": "mariadb-downstream"}
    names = sorted(set(n_ms) | {k for k in s_ms if k not in same.values()}, key=_proc_order)
    for n in names:
        sk = same.get(n, n)
        lab = _LABEL.get(n, n)
        if n in same:
            lab = {"mariadb-source": "source mariadbd", "mariadb-replica":
                   "replica (native) / downstream (Sluice) mariadbd"}[n]
        out.append(f"| {lab} | {_f(n_ms.get(n), '{:.3f}')} | {_f(n_pct.get(n), '{:.0f}')} "
                   f"| {_f(s_ms.get(sk), '{:.3f}')} | {_f(s_pct.get(sk), '{:.0f}')} "
                   f"| {cores(s_ms.get(sk) if ph else n_ms.get(n))} |")

    def group(ms: dict[str, float], pct: dict[str, float], keys: Any, with_cores: bool = False) -> str:
        ks = [k for k in ms if keys(k)]
        if not ks:
            return "— | —" + (" | —" if with_cores else "")
        total = sum(ms[k] for k in ks)
        return (f"{total:.3f} | {sum(pct.get(k, 0.0) for k in ks):.0f}"
                + (f" | {cores(total)}" if with_cores else ""))
    for title, sel in (("**source side** (source mariadbd, sysbench, bench/e2e.py)", lambda k: k in _SOURCE_SIDE),
                       ("**pipeline** (every Sluice process)", lambda k: k not in _SOURCE_SIDE + _DOWNSTREAM),
                       ("**replica / downstream**", lambda k: k in _DOWNSTREAM),
                       ("**all processes**", lambda k: True)):
        nat = group(n_ms, n_pct, sel) if not title.startswith("**pipeline") else "— | —"
        out.append(f"| {title} | {nat} | {group(s_ms, s_pct, sel, True) if ph else '— | — | —'} |")
    out.append(f"| source transactions in the window (sysbench tps) | {native['transactions']:,} "
               f"({native['tps']:,.0f} tps) | {native['window_s']:.0f} s "
               + (f"| {ph['transactions']:,} ({ph['tps']:,.0f} tps, target {ph['rate']}) | "
                  f"{ph['window_s']:.0f} s | |" if ph else "| | | |"))

    def lag(d: dict[str, Any] | None) -> str:
        if not d:
            return "n/a"
        miss = f", {d['missing']} of {d['probes']} unseen" if d.get("missing") else ""
        return f"{_f(d['p50'])} / {_f(d['p95'])} / {_f(d['p99'])}{miss}"
    nl = native["lag"].get(SINK_REPLICA)
    out.append(f"| lag p50 / p95 / p99 (s) into MariaDB (native: the replica at full speed) | "
               f"{lag(nl)} | | {lag((ph or {}).get('lag', {}).get(SINK_MYSQL))} "
               f"| goal p99 < {P99_GOAL[SINK_MYSQL]:g} s | |")
    if ph and SINK_SPARK in ph.get("lag", {}):
        out.append(f"| lag p50 / p95 / p99 (s) into Spark (Iceberg) | | | "
                   f"{lag(ph['lag'][SINK_SPARK])} | goal p99 < {P99_GOAL[SINK_SPARK]:g} s | |")
    return out


def report(a: argparse.Namespace, native: dict[str, Any], sluice: dict[str, Any] | None,
           started: str) -> None:
    rows: list[tuple[str, str, str, str, str]] = []
    nl = native["lag"][SINK_REPLICA]
    rows.append(("source max rate, sysbench full speed (tps)", _f(native["tps"], "{:,.0f}"), "", "",
                 f"{a.threads} threads, {a.native_seconds}s"))
    rows.append(("lag at max rate, p50 / p99 (s)", f"{_f(nl['p50'])} / {_f(nl['p99'])}", "", "",
                 f"Seconds_Behind_Master max {native['seconds_behind_master']['max']}"))
    rows.append(("drain after load (s)", _f(native["drain_s"][SINK_REPLICA]), "", "", ""))
    if sluice and "half" in sluice:
        h = sluice["half"]
        for sink in (SINK_MYSQL, SINK_SPARK):
            if sink not in h["lag"]:
                continue
            lag = h["lag"][sink]
            goal = P99_GOAL[sink]
            met = lag["p99"] is not None and lag["p99"] < goal and lag["missing"] == 0
            rows.append((f"50% rate ({h['rate']} tps target, {h['tps']:,.0f} achieved): lag into "
                         f"{'MariaDB' if sink == SINK_MYSQL else 'Spark'}, p50 / p99 (s)", "",
                         f"{_f(lag['p50'])} / {_f(lag['p99'])}", "",
                         f"goal p99 < {goal:g}s: {'met' if met else 'NOT met'}"))
            rows.append((f"50% rate: drain into {'MariaDB' if sink == SINK_MYSQL else 'Spark'} (s)", "",
                         _f(h["drain_s"][sink]), "", ""))
    if sluice and "half" in sluice:
        rows.extend(pipeline_ratio_rows(native, sluice["half"]))
    if sluice and sluice.get("steps"):
        for st in sluice["steps"]:
            lag = st["lag"][SINK_MYSQL]
            rows.append((f"step {st['target_fraction']:.0%} ({st['rate']} tps target): MariaDB lag "
                         "p50 / p99 (s), slope", "",
                         f"{_f(lag['p50'])} / {_f(lag['p99'])}, {_f(lag['slope'], '{:+.3f}')}",
                         "", f"source {st['tps']:,.0f} tps; {'bounded' if st['bounded'] else 'NOT bounded'}"))
        s = sluice["sustained"]
        sus = s["tps"] if s else 0.0
        ratio = sus / native["tps"] if native["tps"] else math.nan
        rows.append(("highest rate with bounded lag into MariaDB (tps)", _f(native["tps"], "{:,.0f}"),
                     _f(sus, "{:,.0f}"), _f(ratio, "{:.2f}x"),
                     f"goal >= 0.8x: {'met' if ratio >= 0.8 else 'NOT met'}"
                     + ("" if not s or s is not sluice["steps"][-1] or len(sluice["steps"]) < len(a.steps)
                        else " (largest step tried; may sustain more)")))
    print(f"\nEnd to end, sysbench oltp_write_only ({a.tables} tables x {a.table_size} rows, "
          f"{a.threads} threads), probes every {a.probe_interval * 1000:.0f} ms")
    print(f"machine: {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}, "
          f"started {started} UTC; {uptime()} at the end")
    if a.set:
        print(f"Sluice's cluster with: {', '.join(a.set)}")
    print("baseline: MariaDB 10.11 native GTID replication (source -> replica, one SQL thread)\n")
    half = sluice.get("half") if sluice else None
    print("CPU per source transaction (each process's utime+stime from /proc/<pid>/stat, its "
          "children included, over the sysbench run / sysbench's transactions in it):\n")
    for line in cpu_table(native, half):
        print(line)
    print()
    print("| what | native | sluice | ratio | note |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print("\nload average (1/5/15 min) per phase:")
    for ph in [native, *([native["same_rate"]] if native.get("same_rate") else []),
               *([sluice["half"]] if sluice and "half" in sluice else []),
               *(sluice.get("steps", []) if sluice else [])]:
        print(f"- {ph['phase']}: before {ph['load_before']}, after {ph['load_after']}; "
              f"%CPU {json.dumps(ph['cpu_pct'])}")
    print(f"\nwhere the time goes, native ({native['tps']:,.0f} source tps):")
    print("- " + cpu_budget(native))
    for ph in ([sluice["half"]] if sluice and "half" in sluice else []) + (
            sluice.get("steps", [])[-1:] if sluice else []):
        print(f"\nwhere the time goes, {ph['phase']} ({ph['tps']:,.0f} source tps):")
        for line in profile_lines(ph):
            print("- " + line)
        if "loop_stalls" in ph:
            stalls = ph["loop_stalls"]
            print("- event loops stalled > 2 s (core/loopwatch.py, from the process logs): "
                  + ("; ".join(stall_text(proc, v) for proc, v in sorted(stalls.items()))
                     or "none"))
        sb = ph.get("spark_batches")
        if sb and sb.get("batches"):
            print(f"- spark batches committed in the window: {sb['batches']}, rows per batch p50 "
                  f"{sb['rows_p50']:,.0f}; commit (changelog + current + marker) p50 "
                  f"{sb['commit_s_p50']:.2f} s, p90 {sb['commit_s_p90']:.2f} s, max "
                  f"{sb['commit_s_max']:.2f} s; between commit ends p50 "
                  f"{_f(sb['between_commits_s_p50'])} s")
    if sluice and "profile" in sluice:
        pr = sluice["profile"]
        print(f"\nprofile window ({pr['tps']:,.0f} source tps): %CPU {json.dumps(pr['cpu_pct'])}; "
              f"py-spy CPU s {json.dumps(pr['pyspy_cpu_s'])}; lag p99 "
              + ", ".join(f"{k} {_f(v['p99'])} s" for k, v in pr["lag"].items()) + "\n")
        print(pr["markdown"])
    if sluice and "spark_error" in sluice:
        print(f"\nSPARK NOT MEASURED: {sluice['spark_error']}")
    if sluice and "error" in sluice:
        print(f"\nSLUICE RUN FAILED: {sluice['error'][:2000]}")
    summary = {"bench": "e2e", "date": started, "cores": os.cpu_count(), "args": vars(a),
               "native": native, "sluice": sluice}
    print("\n" + json.dumps(summary, default=str))


PIPELINE_GOAL = 2.0


def pipeline_one_drainer(ph: dict[str, Any]) -> float:
    """CPU ms per source transaction of capture, pumps, TSO, etcd, supervisor and the MySQL
    drainer: issue #23's "pipeline with one drainer"."""
    return sum(v for k, v in ph.get("cpu_ms_per_txn", {}).items()
               if k not in _SOURCE_SIDE + _DOWNSTREAM and k != "drainer-spark")


def pipeline_ratio_rows(native: dict[str, Any], half: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """The pipeline with one drainer against the native replica's CPU per transaction, at full
    speed and (when measured) at the rate Sluice ran at."""
    pipe = pipeline_one_drainer(half)
    rows = []
    baselines = [("full speed", native)]
    if native.get("same_rate"):
        baselines.append((f"{native['same_rate']['tps']:,.0f} tps (Sluice's rate)", native["same_rate"]))
    for what, ph in baselines:
        rep = ph.get("cpu_ms_per_txn", {}).get("mariadb-replica")
        if not rep or not pipe:
            continue
        ratio = pipe / rep
        rows.append((f"CPU ms / txn: pipeline with one drainer (MySQL) vs the replica at {what}",
                     f"{rep:.3f}", f"{pipe:.3f}", f"{ratio:.2f}x",
                     f"goal <= {PIPELINE_GOAL:g}x: {'met' if ratio <= PIPELINE_GOAL else 'NOT met'}"))
    return rows


def _m(ph: dict[str, Any], proc: str, name: str) -> float:
    return float(ph["metrics"].get(proc, {}).get(name, math.nan))


_SOURCE_SIDE = ("mariadb", "mariadb-source", "sysbench", "bench-probes")
_DOWNSTREAM = ("mariadb-downstream", "mariadb-replica")


def cpu_budget(ph: dict[str, Any]) -> str:
    """How the machine's cores were shared in one phase, and CPU ms per source transaction for
    the source side (source MariaDB, sysbench, this script's probes), the replication pipeline
    (Sluice's processes) and the downstream database."""
    cpu, tps = ph["cpu_pct"], ph["tps"]
    groups = {"source side": sum(v for k, v in cpu.items() if k in _SOURCE_SIDE),
              "pipeline": sum(v for k, v in cpu.items() if k not in _SOURCE_SIDE + _DOWNSTREAM),
              "downstream": sum(v for k, v in cpu.items() if k in _DOWNSTREAM)}
    total = sum(groups.values())
    per = ", ".join(f"{k} {v * 10 / tps:.3f}" for k, v in groups.items() if tps) or "n/a"
    return (f"CPU budget: {total:.0f}% of {100 * (os.cpu_count() or 1)}% used at {tps:,.0f} source "
            f"tps; ms CPU per source txn: {per}")


def profile_lines(ph: dict[str, Any]) -> list[str]:
    """The Sluice processes' own view of one phase: rates, per-hop lag, CPU."""
    cpu = ph["cpu_pct"]
    out = ["%CPU (100 = one core): " + ", ".join(f"{k} {v:.0f}" for k, v in
                                                  sorted(cpu.items(), key=lambda kv: -kv[1])),
           cpu_budget(ph)]
    c = "capture"
    txns, groups = _m(ph, c, "sluice_capture_transactions_total /s"), _m(ph, c, "sluice_capture_groups_total /s")
    gsum = _m(ph, c, "sluice_capture_group_seconds_sum /s")
    if not math.isnan(txns):
        out.append(f"capture: {txns:,.1f} txns/s committed to pumps ({_m(ph, c, 'sluice_capture_rows_total /s'):,.0f} "
                   f"rows/s) in {groups:,.1f} groups/s ({txns / groups if groups else math.nan:.1f} txns/group, "
                   f"{1000 * gsum / groups if groups else math.nan:.0f} ms prewrite->commit ack per group, "
                   f"busy {gsum:.0%} of the time); source lag at the end "
                   f"{_m(ph, c, 'sluice_capture_source_lag_seconds'):.2f}s; "
                   f"{cpu.get(c, math.nan) * 10 / txns if txns else math.nan:.2f} ms capture CPU per txn")
    for pump in sorted(k for k in ph["metrics"] if k.startswith("pump-")):
        out.append(f"{pump}: {_m(ph, pump, 'sluice_pump_binlogs_written_total /s'):,.0f} binlogs/s in "
                   f"{_m(ph, pump, 'sluice_pump_write_requests_total /s'):,.1f} writes/s; watermark lag "
                   f"{_m(ph, pump, 'sluice_pump_watermark_lag_seconds'):.2f}s; fsync "
                   f"{_m(ph, pump, 'sluice_pump_fsync_latency_ms'):.1f} ms")
    if ph.get("stream_lag_max_s"):
        out.append("largest lag of a drainer's view of a pump behind the pump's served watermark "
                   "(sampled each second): " + ", ".join(f"{k} {v:.1f}s" for k, v in
                                                        ph["stream_lag_max_s"].items()))
    for d in sorted(k for k in ph["metrics"] if k.startswith("drainer-")):
        t = _m(ph, d, "sluice_drainer_txns_total /s")
        pend = sum(v for k, v in ph["metrics"][d].items() if k.startswith("sluice_drainer_pump_pending_txns"))
        out.append(f"{d}: {t:,.1f} txns/s to the sink; checkpoint lag at the end "
                   f"{_m(ph, d, 'sluice_drainer_checkpoint_lag_seconds'):.2f}s; {pend:.0f} txns "
                   f"pending in the merge; {cpu.get(d, math.nan) * 10 / t if t else math.nan:.2f} ms "
                   "drainer CPU per txn (incl. Spark's JVM for the Spark drainer)")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2-3 minute smoke run (small, short)")
    ap.add_argument("--tables", type=int, default=4)
    ap.add_argument("--table-size", type=int, default=10_000)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--native-seconds", type=int, default=45)
    ap.add_argument("--sluice-seconds", type=int, default=60)
    ap.add_argument("--native-rate-seconds", type=int, default=30,
                    help="native replication also at Sluice's target rate (0: skip)")
    ap.add_argument("--step-seconds", type=int, default=30)
    ap.add_argument("--steps", default="0.5,0.75,1.0,1.25",
                    help="step rates as fractions of the native max (comma-separated)")
    ap.add_argument("--rate-fraction", type=float, default=0.5,
                    help="the Sluice window's sysbench --rate as a fraction of the native max")
    ap.add_argument("--no-steps", action="store_true", help="skip the rate steps")
    ap.add_argument("--profile", action="store_true",
                    help="after the measured window, a window at the same rate with py-spy on "
                         "capture, pumps and drainers; top frames as markdown tables")
    ap.add_argument("--profile-seconds", type=int, default=30)
    ap.add_argument("--profile-rate", type=int, default=50, help="py-spy samples per second")
    ap.add_argument("--profile-top", type=int, default=12, help="frames per table")
    ap.add_argument("--profile-mode", choices=("gil", "active"), default="gil",
                    help="gil: sample the GIL holder (Python CPU); active: every non-idle thread")
    ap.add_argument("--profile-out", help="also write the profile tables to this markdown file")
    ap.add_argument("--probe-interval", type=float, default=0.2)
    ap.add_argument("--drain-timeout", type=float, default=120.0)
    ap.add_argument("--catchup-timeout", type=float, default=300.0)
    ap.add_argument("--no-spark", dest="spark", action="store_false")
    ap.add_argument("--spark-current-state", default="delete", choices=("delete", "equality-deletes"),
                    help="the Spark drainer's current-state (docs/spark.md)")
    ap.add_argument("--native-only", action="store_true")
    ap.add_argument("--keep-dir", action="store_true")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a cluster key for Sluice's `sluice cluster up --set` (repeatable), e.g. "
                         "capture.config.group-min-interval-ms=400")
    ap.add_argument("--json-out", help="also write the JSON summary to this file")
    a = ap.parse_args()
    if a.quick:
        a.tables, a.table_size = 2, 2000
        a.native_seconds, a.sluice_seconds, a.step_seconds = 15, 20, 12
        a.native_rate_seconds = min(a.native_rate_seconds, 10)
        a.steps, a.drain_timeout = "0.5,1.0", 60.0
    a.steps = [] if a.no_steps else [float(x) for x in str(a.steps).split(",") if x.strip()]
    if not 0 < a.rate_fraction <= 4:
        print(f"e2e: --rate-fraction {a.rate_fraction}: must be in (0, 4]", file=sys.stderr)
        return 2
    if a.profile and py_spy_path() is None:
        print("e2e: --profile needs py-spy (.venv/bin/pip install -r requirements.txt)", file=sys.stderr)
        return 2
    if a.profile and os.geteuid() != 0:
        print("e2e: --profile needs root (py-spy attaches to other processes)", file=sys.stderr)
        return 2
    for tool in ("sysbench", "mariadbd", "etcd"):
        if shutil.which(tool) is None:
            print(f"e2e: `{tool}` not found on PATH (apt-get install {tool})", file=sys.stderr)
            return 2
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    workdir = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    say(f"workdir {workdir}; {uptime()}")
    native: dict[str, Any] | None = None
    sluice: dict[str, Any] | None = None
    try:
        with contextlib.ExitStack() as stack:
            native = run_native(a, workdir, stack)
        if not a.native_only:
            sluice = {}
            try:
                with contextlib.ExitStack() as stack:
                    run_sluice(a, native["tps"], workdir, stack, sluice)
            except Exception as e:  # noqa: BLE001 - report what was measured, then the failure
                sluice["error"] = f"{type(e).__name__}: {e}"
                say(f"sluice run failed: {sluice['error']}")
    finally:
        if a.keep_dir:
            say(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    assert native is not None
    report(a, native, sluice, started)
    if a.json_out:
        Path(a.json_out).write_text(json.dumps({"native": native, "sluice": sluice}, default=str, indent=2))
    return 1 if sluice and "error" in sluice else 0


if __name__ == "__main__":
    sys.exit(main())
