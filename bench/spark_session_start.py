"""A test Spark session's start-up with and without the test JVMs' CDS archive
(tests/support/spark.py), alternating in one invocation.

Each run is a fresh process (one JVM per process): the test session config on a new warehouse,
`SHOW NAMESPACES` (the catalog opened), then the JVM stopped and reaped, so its CPU (user + sys)
is this process's children's. Reports medians of wall seconds and JVM CPU seconds per mode, the
CPU ratio against the run without the archive (the baseline), and the load average beside each
run (the machine is shared: CPU per start is the number to trust when it is saturated).

    .venv/bin/python bench/spark_session_start.py [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def one_start(cds: str) -> None:
    import resource
    import time
    os.environ["SLUICE_TEST_CDS"] = cds
    sys.path.insert(0, str(REPO))
    from sluice.spark_sink.session import session, shutdown_jvm
    from tests.support.spark import session_config
    with tempfile.TemporaryDirectory() as work:
        t0 = time.monotonic()
        spark = session(session_config(Path(work)))
        spark.sql("SHOW NAMESPACES IN sluice").collect()
        wall = time.monotonic() - t0
        spark.stop()
        shutdown_jvm()
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"cds": cds, "wall_s": wall, "jvm_cpu_s": r.ru_utime + r.ru_stime,
                      "load": os.getloadavg()[0]}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--one", choices=("0", "1"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one is not None:
        one_start(args.one)
        return
    env = {**os.environ, "PYTHONPATH": str(REPO), "TZ": "UTC", "SPARK_LOCAL_IP": "127.0.0.1"}
    # The archive is built (once) before the first timed run.
    subprocess.run([sys.executable, "-c", "import tests.support.spark"], cwd=REPO, env=env,
                   check=True)
    runs: dict[str, list[dict]] = {"0": [], "1": []}
    for i in range(args.repeat):
        for cds in ("0", "1"):
            out = subprocess.run([sys.executable, __file__, "--one", cds], cwd=REPO, env=env,
                                 capture_output=True, text=True, check=True).stdout
            rec = json.loads(out.strip().splitlines()[-1])
            runs[cds].append(rec)
            print(f"run {i + 1} cds={cds}: wall {rec['wall_s']:.1f}s, JVM CPU "
                  f"{rec['jvm_cpu_s']:.1f}s, load {rec['load']:.1f}", flush=True)
    med = {c: (statistics.median(r["wall_s"] for r in rs),
               statistics.median(r["jvm_cpu_s"] for r in rs)) for c, rs in runs.items()}
    print(f"median without the archive (baseline): wall {med['0'][0]:.1f}s, JVM CPU {med['0'][1]:.1f}s")
    print(f"median with the archive:               wall {med['1'][0]:.1f}s, JVM CPU {med['1'][1]:.1f}s")
    print(f"JVM CPU per session start: {med['1'][1] / med['0'][1]:.2f}x the baseline; "
          f"wall {med['1'][0] / med['0'][0]:.2f}x")


if __name__ == "__main__":
    main()
