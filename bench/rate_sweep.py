"""CPU of every process at several source rates: the fixed part and the per-transaction part (#23).

A process's CPU per transaction is not a constant: every pump, drainer and the capture also pays
per second (timers, heartbeats, gRPC's threads) and per capture group (TSO requests, RPCs,
fsyncs), whatever the rate. This bench measures CPU ms per second of each process at each rate
and fits `ms/s = fixed + marginal x tps` over the loaded windows (least squares): `marginal` is
what one more transaction costs, `fixed` what the process costs once anything flows. Capacity
for a rate R is then `fixed + marginal x R` per process (docs/benchmarks.md, "Round 32").

A local cluster (`sluice cluster up`: etcd, 2 TSOs, 2 pumps, one file drainer, MariaDB, the
capture; mutual TLS as by default) per run; windows of `--seconds` at each of `--rates` (0 =
idle: nothing written) of sysbench oltp_write_only (2 tables x 2,000 rows, 2 threads). The
baseline is this tree with its default settings; each `--variant NAME:key=value,...` runs the same
tree with those capture settings, alternating with the baseline in the same invocation, and its
pipeline CPU is reported as a ratio to the baseline's at each rate.

    .venv/bin/python bench/rate_sweep.py --rates 0,300,600,1200 \
        --variant "groups500:group-min-interval-ms=500" --repeat 2
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from control_plane import CONFIG, running_cluster, say  # noqa: E402
from e2e_support import proc_cpu_seconds  # noqa: E402

PIPELINE = ("capture", "pump-1", "pump-2", "files", "tso-1", "tso-2", "etcd", "supervisor")


def parse_variant(text: str) -> tuple[str, list[str]]:
    """NAME:key=value,... -> (NAME, the capture's keys as `sluice cluster up --set` overrides)."""
    name, _, sets = text.partition(":")
    if not name or not sets:
        raise SystemExit(f"--variant {text!r}: want NAME:key=value[,key=value...]")
    out = []
    for kv in sets.split(","):
        k, eq, v = kv.partition("=")
        if not eq:
            raise SystemExit(f"--variant {text!r}: {kv!r} is not key=value")
        out.append(f"capture.config.{k.strip()}={v.strip()}")
    return name, out


def one_run(name: str, sets: list[str], work: Path, a: argparse.Namespace, i: int) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    with running_cluster(work / f"{name}-{i}", CONFIG, env, f"{name} run {i}", a.settle,
                         sets) as (_, pids, bench):
        windows = []
        for rate in a.rates:
            c0, t0, load = proc_cpu_seconds(pids), time.monotonic(), os.getloadavg()[0]
            if rate:
                tps = bench.run(a.seconds, rate).tps
            else:
                time.sleep(a.seconds)
                tps = 0.0
            secs = time.monotonic() - t0
            c1 = proc_cpu_seconds(pids)
            ms_s = {k: round(1000 * (c1[k] - c0.get(k, 0.0)) / secs, 1) for k in c1}
            windows.append({"rate": rate, "tps": round(tps, 1), "load": round(load, 2),
                            "ms_s": ms_s})
            say(f"{name} run {i}: {rate or 'idle'}: {tps:,.0f} tps, "
                f"pipeline {cpu(windows[-1], 'pipeline'):.0f} ms/s, "
                f"load {load:.1f}")
        return {"variant": name, "run": i, "windows": windows}


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares `y = fixed + marginal * x`; (nan, nan) with fewer than two distinct x."""
    xs = [x for x, _ in points]
    if len(set(xs)) < 2:
        return float("nan"), float("nan")
    mx, my = statistics.mean(xs), statistics.mean(y for _, y in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def cpu(window: dict, process: str) -> float:
    """CPU ms per second of `process` in a window; "pipeline": of every Sluice process."""
    ms = window["ms_s"]
    if process == "pipeline":
        return sum(v for k, v in ms.items() if k in PIPELINE)
    return float(ms.get(process, 0.0))


def report(runs: list[dict], names: list[str], rates: list[int]) -> None:
    procs = sorted({k for r in runs for w in r["windows"] for k in w["ms_s"] if k in PIPELINE},
                   key=PIPELINE.index)
    med_pipe: dict[tuple[str, int], float] = {}
    for name in names:
        rs = [r for r in runs if r["variant"] == name]
        print(f"\n### {name}: CPU ms per second, median of {len(rs)} run(s) "
              "[fixed + marginal x tps fitted over the loaded windows of every run]")
        print("\n| process | " + " | ".join(f"{r or 'idle'}" for r in rates)
              + " | fixed ms/s | marginal ms/txn |")
        print("|---|" + "---:|" * (len(rates) + 2))
        for p in [*procs, "pipeline"]:
            cells = [statistics.median(cpu(r["windows"][j], p) for r in rs)
                     for j in range(len(rates))]
            a, b = fit([(w["tps"], cpu(w, p)) for r in rs for w in r["windows"] if w["rate"]])
            print(f"| {p} | " + " | ".join(f"{c:.1f}" for c in cells) + f" | {a:.1f} | {b:.4f} |")
        med_pipe.update({(name, rate): statistics.median(cpu(r["windows"][j], "pipeline")
                                                         for r in rs)
                         for j, rate in enumerate(rates)})
        tps = [statistics.median(r["windows"][j]["tps"] for r in rs) for j in range(len(rates))]
        print("| source tps | " + " | ".join(f"{t:,.0f}" for t in tps) + " | | |")
    for name in names[1:]:
        print(f"\n{name} / {names[0]} (pipeline CPU ms/s, medians): " + ", ".join(
            f"{r or 'idle'}: {med_pipe[(name, r)] / med_pipe[(names[0], r)]:.2f}x"
            for r in rates if med_pipe.get((names[0], r))))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="0,300,600,1200",
                   help="sysbench transactions per second per window, comma-separated (0: idle)")
    p.add_argument("--seconds", type=int, default=20, help="length of each window")
    p.add_argument("--variant", action="append", default=[],
                   help="NAME:key=value,... capture settings run against the default (repeatable)")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--settle", type=float, default=5.0)
    p.add_argument("--json", default="")
    a = p.parse_args()
    a.rates = [int(r) for r in a.rates.split(",")]
    if any(r < 0 for r in a.rates):
        raise SystemExit("--rates: every rate must be >= 0")
    variants: list[tuple[str, list[str]]] = [("default", [])] + [parse_variant(v) for v in a.variant]
    names = [n for n, _ in variants]
    work = Path(tempfile.mkdtemp(prefix="rate-sweep-"))
    runs = []
    print(f"rate sweep: {', '.join(names)}; rates {a.rates}; {a.seconds} s each; "
          f"{a.repeat} run(s) each, alternating; {os.cpu_count()} cores; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    try:
        for i in range(a.repeat):
            order = variants if i % 2 == 0 else variants[::-1]
            for name, sets in order:
                runs.append(one_run(name, sets, work, a, i + 1))
                if a.json:
                    Path(a.json).write_text(json.dumps(runs, indent=1))
        report(runs, names, a.rates)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
