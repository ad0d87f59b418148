"""The control plane's CPU and requests: etcd and the TSOs, idle and under a fixed load (#23).

A local cluster (`sluice cluster up`: etcd, 2 TSOs, 2 pumps, one file drainer, MariaDB, the
capture; mutual TLS as by default) per run, old tree (`--baseline REV`, exported with `git
archive` and put first on PYTHONPATH of every process) and this tree alternating, `--repeat`
times each. Per run, two windows of the same length:
- idle: nothing written;
- load: sysbench oltp_write_only at `--rate` transactions per second.
Per window: CPU ms per second of every process (utime+stime from /proc), etcd's requests per
second by gRPC method (etcd's own /metrics, `grpc_server_handled_total`), the TSO requests per
second each TSO served (`sluice_tso_requests_total`), and per process the TCP segments per
second it sent to etcd and to the TSOs (`ss -ti`: who calls them). Under load also CPU ms per
transaction.

    .venv/bin/python bench/control_plane.py --baseline HEAD~1 --repeat 2
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from e2e_support import Sysbench, connect, proc_cpu_seconds, scrape  # noqa: E402
from trees import export_tree  # noqa: E402

PASSWORD = "sluice-root"   # the local cluster's MariaDB root password (ctl/cluster_config.py)

CONFIG = """cluster-id = 1
start-timeout = 600.0
stop-timeout = 30.0

[pump]
count = 2

[[drainers]]
name = "files"
sink = "file"

[mariadb]
enabled = true

[capture]
enabled = true
"""

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def say(msg: str) -> None:
    print(f"[{Path(sys.argv[0]).stem} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr,
          flush=True)


def etcd_metrics(addr: str, sec: dict[str, str]) -> dict[str, float]:
    ctx = ssl.create_default_context(cafile=sec["ssl-ca"])
    ctx.load_cert_chain(sec["ssl-cert"], sec["ssl-key"])
    ctx.check_hostname = False
    text = urllib.request.urlopen(f"https://{addr}/metrics", timeout=5, context=ctx).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and not line.startswith("#"):
            with contextlib.suppress(ValueError):
                out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def etcd_methods(before: dict[str, float], after: dict[str, float], secs: float) -> dict[str, float]:
    """Handled unary calls / stream messages received per second, by method."""
    out: dict[str, float] = {}
    for k, v in after.items():
        if k.startswith("grpc_server_handled_total") or k.startswith("grpc_server_msg_received_total"):
            m = re.search(r'grpc_method="(\w+)"', k)
            if m and (v - before.get(k, 0.0)) > 0:
                kind = "calls" if k.startswith("grpc_server_handled") else "msgs"
                key = f"{m.group(1)} {kind}"
                out[key] = out.get(key, 0.0) + (v - before.get(k, 0.0)) / secs
    return out


def segments_by_pid(ports: dict[str, int]) -> dict[tuple[int, str], int]:
    """{(pid, target): data segments sent} over the established connections to the given ports."""
    text = subprocess.run(["ss", "-tinpH", "state", "established"], capture_output=True,
                          text=True).stdout
    out: dict[tuple[int, str], int] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        f = line.split()
        if len(f) < 4 or "users:" not in line:
            continue
        peer = f[3] if f[0] != "ESTAB" else f[4]
        port = int(peer.rsplit(":", 1)[1])
        target = next((n for n, p in ports.items() if p == port), None)
        pid = re.search(r"pid=(\d+)", line)
        if target is None or pid is None:
            continue
        info = lines[i + 1] if i + 1 < len(lines) and "users:" not in lines[i + 1] else line
        seg = re.search(r"data_segs_out:(\d+)", info) or re.search(r"segs_out:(\d+)", info)
        if seg:
            key = (int(pid.group(1)), target)
            out[key] = out.get(key, 0) + int(seg.group(1))
    return out


def tso_served(metrics: dict[str, str]) -> dict[str, float]:
    """Requests each TSO served, and the groups the capture committed (for per-group rates)."""
    out = {}
    for name, addr in metrics.items():
        if name.startswith("tso"):
            s = scrape(addr)
            out[name] = sum(v for k, v in s.items() if k.startswith("sluice_tso_requests_total")
                            or k.startswith("tso_requests_total"))
        elif name == "capture":
            s = scrape(addr)
            out["capture groups"] = sum(v for k, v in s.items()
                                        if k.split("{")[0].endswith("capture_groups_total"))
    return out


class Window:
    """CPU, etcd methods, TSO requests and per-process segments between start() and stop()."""

    def __init__(self, pids: dict[str, int], etcd_addr: str, sec: dict[str, str],
                 ports: dict[str, int], metrics: dict[str, str]) -> None:
        self.pids, self.etcd_addr, self.sec, self.ports, self.metrics = pids, etcd_addr, sec, ports, metrics

    def start(self) -> None:
        self.load = os.getloadavg()[0]
        self.t0 = time.monotonic()
        self.cpu0 = proc_cpu_seconds(self.pids)
        self.etcd0 = etcd_metrics(self.etcd_addr, self.sec)
        self.seg0 = segments_by_pid(self.ports)
        self.tso0 = tso_served(self.metrics)

    def stop(self) -> dict:
        secs = time.monotonic() - self.t0
        cpu1 = proc_cpu_seconds(self.pids)
        etcd1 = etcd_metrics(self.etcd_addr, self.sec)
        seg1 = segments_by_pid(self.ports)
        tso1 = tso_served(self.metrics)
        names = {pid: n for n, pid in self.pids.items()}
        segs: dict[str, float] = {}
        for (pid, target), v in seg1.items():
            who = names.get(pid, f"pid {pid}")
            d = v - self.seg0.get((pid, target), 0)
            segs[f"{who}->{target}"] = segs.get(f"{who}->{target}", 0.0) + d / secs
        return {"seconds": round(secs, 1), "load": round(self.load, 2),
                "cpu_ms_s": {k: round(1000 * (cpu1[k] - self.cpu0.get(k, 0.0)) / secs, 2)
                             for k in cpu1},
                "etcd_per_s": {k: round(v, 2) for k, v in sorted(etcd_methods(self.etcd0, etcd1, secs).items())},
                "tso_req_per_s": {k: round((tso1[k] - self.tso0.get(k, 0.0)) / secs, 2) for k in tso1},
                "segs_per_s": {k: round(v, 2) for k, v in sorted(segs.items()) if v > 0}}


def cluster(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sluice.ctl.main", "cluster", *args],
                          capture_output=True, text=True, timeout=900, cwd=REPO, env=env)


@contextlib.contextmanager
def running_cluster(cdir: Path, config: str, env: dict[str, str], what: str, settle: float,
                    overrides: list[str] | None = None
                    ) -> Iterator[tuple[Any, dict[str, int], Sysbench]]:
    """`sluice cluster up` of `config` (with `--set` `overrides`) in `cdir`, its sysbench tables
    prepared, `settle` s later: (the cluster's state, pid by process name — the supervisor's too —, the Sysbench
    of its MariaDB). Down and removed after."""
    from sluice.ctl.cluster import read_state
    from sluice.ctl.cluster_config import Layout
    conf = cdir.parent / f"{cdir.name}.toml"
    conf.write_text(config)
    say(f"{what}: cluster up in {cdir}")
    sets = [arg for kv in overrides or () for arg in ("--set", kv)]
    up = cluster("up", "--dir", str(cdir), "--config", str(conf), *sets, env=env)
    try:
        if up.returncode != 0:
            raise RuntimeError(f"cluster up failed: {up.stdout[-2000:]}{up.stderr[-2000:]}")
        state = read_state(Layout(cdir))
        assert state is not None
        procs = {r.name: r for r in state.processes}
        pids = {n: r.pid for n, r in procs.items()}
        if state.supervisor is not None:
            pids["supervisor"] = state.supervisor.pid
        src_port = int(procs["mariadb"].addr.rsplit(":", 1)[1])
        with connect(src_port, PASSWORD) as conn, conn.cursor() as cur:
            cur.execute("SET GLOBAL innodb_flush_log_at_trx_commit = 2")
        bench = Sysbench(src_port, PASSWORD, 2, 2000, 2)
        bench.prepare()
        time.sleep(settle)
        yield state, pids, bench
    finally:
        say(f"{what}: cluster down")
        cluster("down", "--dir", str(cdir), env=env)
        shutil.rmtree(cdir, ignore_errors=True)


def one_run(side: str, base_root: Path | None, work: Path, a: argparse.Namespace, i: int) -> dict:
    env = dict(os.environ)
    if base_root is not None:
        env["PYTHONPATH"] = str(base_root)
    else:
        env.pop("PYTHONPATH", None)
    with running_cluster(work / f"{side}-{i}", CONFIG, env, f"{side} run {i}",
                         a.settle) as (state, pids, bench):
        procs = {r.name: r for r in state.processes}
        metrics = {n: r.metrics_addr for n, r in procs.items() if r.metrics_addr}
        ports = {"etcd": int(state.etcd.rsplit(":", 1)[1])}
        for n, r in procs.items():
            if n.startswith("tso"):
                ports[n] = int(r.addr.rsplit(":", 1)[1])
        w = Window(pids, state.etcd, state.security, ports, metrics)
        w.start()
        time.sleep(a.seconds)
        idle = w.stop()
        w.start()
        res = bench.run(a.seconds, a.rate)
        load = w.stop()
        load["tps"] = round(res.tps, 1)
        load["cpu_ms_txn"] = {k: round(v / res.tps, 4) for k, v in load["cpu_ms_s"].items()}
        return {"side": side, "run": i, "idle": idle, "load": load}


def med(runs: list[dict], window: str, group: str, key: str) -> float:
    vals = [r[window][group].get(key, 0.0) for r in runs]
    return statistics.median(vals) if vals else 0.0


def report(runs: list[dict], rev: str) -> None:
    sides = ("old", "new")
    by = {s: [r for r in runs if r["side"] == s] for s in sides}
    for window in ("idle", "load"):
        print(f"\n### {window}")
        groups = [("cpu_ms_s", "CPU ms/s"), ("etcd_per_s", "etcd /s"),
                  ("tso_req_per_s", "TSO requests /s"), ("segs_per_s", "segments sent /s")]
        if window == "load":
            groups.append(("cpu_ms_txn", "CPU ms/txn"))
        for group, unit in groups:
            keys = sorted({k for r in runs for k in r[window][group]})
            print(f"\n| {unit} | old ({rev}) median [runs] | new median [runs] | new/old |")
            print("|---|---|---|---|")
            for k in keys:
                o, n = med(by["old"], window, group, k), med(by["new"], window, group, k)
                each = {s: ", ".join(f"{r[window][group].get(k, 0.0):g}" for r in by[s]) for s in sides}
                ratio = f"{n / o:.2f}" if o else "-"
                print(f"| {k} | {o:g} [{each['old']}] | {n:g} [{each['new']}] | {ratio} |")
        loads = {s: [r[window]["load"] for r in by[s]] for s in sides}
        print(f"\nload average at window start: old {loads['old']}, new {loads['new']}")
        if window == "load":
            print(f"tps: old {[r['load']['tps'] for r in by['old']]}, "
                  f"new {[r['load']['tps'] for r in by['new']]}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", required=True, help="git revision of the old tree")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--seconds", type=int, default=30, help="length of each window")
    p.add_argument("--rate", type=int, default=300, help="sysbench transactions per second")
    p.add_argument("--settle", type=float, default=5.0)
    p.add_argument("--json", default="")
    a = p.parse_args()
    rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", a.baseline],
                         capture_output=True, text=True, check=True).stdout.strip()
    work = Path(tempfile.mkdtemp(prefix="control-cpu-"))
    runs = []
    try:
        base_root = export_tree(a.baseline, work)
        print(f"control plane: old {rev} vs this tree; {a.repeat} runs each, alternating; "
              f"{a.seconds} s idle + {a.seconds} s at {a.rate} tps; {os.cpu_count()} cores; "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
        for i in range(a.repeat):
            for side in ("old", "new") if i % 2 == 0 else ("new", "old"):
                runs.append(one_run(side, base_root if side == "old" else None, work, a, i + 1))
                if a.json:
                    Path(a.json).write_text(json.dumps(runs, indent=1))
        report(runs, rev)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
