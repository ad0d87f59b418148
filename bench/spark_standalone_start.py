"""The standalone test's Spark master and worker (tests/integration/test_spark_standalone.py)
started with the JVM's default flags (the baseline) and with the test JVMs' flags (client
compiler, serial collector), alternating in one invocation.

Each run starts a master, then a worker pointed at it, waits until the worker registered, then
reads both JVMs' CPU (user + sys, /proc/<pid>/stat) and stops them. Reports medians of wall and
JVM CPU seconds per mode, the CPU ratio against the baseline, and the load average beside each
run (the machine is shared: CPU per start is the number to trust when it is saturated).

    .venv/bin/python bench/spark_standalone_start.py [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from sluice.core.ports import free_port  # noqa: E402


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one(flags: list[str], home: str, work: Path) -> dict[str, float]:
    env = {**os.environ, "SPARK_HOME": home, "SPARK_SCALA_VERSION": "2.13",
           "SPARK_LOCAL_IP": "127.0.0.1", "TZ": "UTC"}
    port = free_port()
    t0 = time.monotonic()
    load0 = os.getloadavg()[0]
    procs = []
    try:
        with (work / "master.log").open("w") as f:
            procs.append(subprocess.Popen(
                ["java", "-Xmx512m", *flags, "-cp", f"{home}/jars/*",
                 "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                 str(port), "--webui-port", "0"], env=env, stdout=f, stderr=subprocess.STDOUT))
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        with (work / "worker.log").open("w") as f:
            procs.append(subprocess.Popen(
                ["java", "-Xmx512m", *flags, "-cp", f"{home}/jars/*",
                 "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}", "--host",
                 "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port", "0",
                 "--work-dir", str(work / "worker")], env=env, stdout=f,
                stderr=subprocess.STDOUT))
        while "Successfully registered with master" not in (work / "worker.log").read_text():
            assert procs[1].poll() is None, (work / "worker.log").read_text()[-2000:]
            time.sleep(0.1)
        wall = time.monotonic() - t0
        cpu = sum(cpu_s(p.pid) for p in procs)
    finally:
        for p in reversed(procs):   # our own children, by pid
            p.terminate()
            p.wait(30)
    return {"wall_s": wall, "cpu_s": cpu, "load": load0}


def main() -> None:
    import pyspark

    from tests.support.spark import FAST_JVM
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    home = os.path.dirname(pyspark.__file__)
    modes = {"default flags (baseline)": [], "test JVM flags": FAST_JVM.split()}
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for i in range(args.repeat):
        for mode, flags in modes.items():
            with tempfile.TemporaryDirectory() as work:
                r = one(flags, home, Path(work))
            runs[mode].append(r)
            print(f"run {i + 1} {mode}: wall {r['wall_s']:.1f} s, master+worker JVM CPU "
                  f"{r['cpu_s']:.1f} s, load {r['load']:.1f}", flush=True)
    base = statistics.median(r["cpu_s"] for r in runs["default flags (baseline)"])
    print("\n| mode | median wall s | median JVM CPU s | CPU ratio |\n|---|---|---|---|")
    for mode, rs in runs.items():
        cpu = statistics.median(r["cpu_s"] for r in rs)
        print(f"| {mode} | {statistics.median(r['wall_s'] for r in rs):.1f} | {cpu:.1f} | "
              f"{cpu / base:.2f}x |")


if __name__ == "__main__":
    main()
