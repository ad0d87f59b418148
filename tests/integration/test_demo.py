"""`sluice demo --short` run as a user runs it: MariaDB -> capture -> pumps -> Spark drainer
(with its standby) -> verified against the source, then everything stopped.

Invariant (ctl/demo.py): the demo exits 0 only when every source table equals its Spark view;
and it stops every process it started (`sluice cluster down`, by recorded pid) on every way
out — success, failure, Ctrl-C — unless `--keep` is given.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from tests.support.procs import REPO, sluice_argv

pytestmark = [pytest.mark.spark, pytest.mark.mariadb, pytest.mark.timeout(900)]

TABLES = ("shop.customers", "shop.orders", "shop.order_items", "shop.inventory")


def processes_under(path: Path) -> list[psutil.Process]:
    """Every process whose command line names the demo's directory (all the cluster's children
    do: their configs, data dirs and logs live there)."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if str(path) in " ".join(p.info["cmdline"] or []):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def test_short_demo_verifies_spark_row_for_row_and_leaves_no_process(tmp_path: Path) -> None:
    """The demo exits 0 only when every source table equals its Spark view, and it stops every
    process it started."""
    d = tmp_path / "demo"
    from tests.support.spark import TEST_CONF
    # The demo's JVMs start and run like the other test JVMs (fast-start flags, the CDS
    # archive, one shuffle partition for a few hundred rows): results do not depend on them.
    spark_conf = {**TEST_CONF, "spark.sql.shuffle.partitions": "1"}
    env = {**os.environ, "PYTHONPATH": str(REPO), "TZ": "UTC", "SPARK_LOCAL_IP": "127.0.0.1",
           "SLUICE_DEMO_SPARK_CONF": json.dumps(spark_conf)}
    proc = subprocess.Popen(sluice_argv("demo", "--short", "--dir", str(d)), cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=870)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        left = processes_under(d)
        for p in left:
            p.kill()
    assert proc.returncode == 0, out[-6000:]
    assert not left, f"the demo left processes behind: {[p.pid for p in left]}"

    # `up` through the cluster code: the Spark drainer is active and its standby waits.
    assert re.search(r"^spark\s+\d+\s+yes\s+online \(active\)\s+yes", out, re.M), out[-6000:]
    assert re.search(r"^spark-standby\s+\d+\s+yes\s+standby", out, re.M), out[-6000:]
    # A live progress line while the workload runs.
    assert re.search(r"workload\s+source\s+\d+ txns \| captured\s+\d+ \| in pumps\s+\d+ binlogs"
                     r" \| to Spark\s+\d+ txns \| lag", out), out[-6000:]
    assert "the probe row is in Spark" in out
    # The verification: each table row for row, then the summary.
    for t in TABLES:
        m = re.search(rf"^{re.escape(t)}\s+(\d+)\s+(\d+)\s+(\d+)\s+match", out, re.M)
        assert m, f"{t} not verified:\n{out[-6000:]}"
        assert int(m.group(2)) == int(m.group(3)) > 0
    assert f"OK: all {len(TABLES)} tables match the source row for row" in out
    m = re.search(r"changes in changelog (\d+)", out)
    assert m and int(m.group(1)) > 0, out[-3000:]
    assert "sluice spark-sql --config" in out and " --tables" in out
    assert re.search(r"sluice spark-sql --config \S+ --as-of \d+ ", out), out[-3000:]
    # The terminal shows the demo's own lines only: the JVM of the demo's Spark session (banner,
    # log4j) writes to its log file.
    jvm_noise = [line for line in out.splitlines() if re.search(
        r"log4j|Setting default log level|NativeCodeLoader|^\d\d/\d\d/\d\d \d\d:\d\d:\d\d "
        r"(WARN|ERROR|INFO)|WARNING: Using incubator modules", line)]
    assert not jvm_noise, jvm_noise[:5]
    jvm_log = d / "logs" / "demo-spark.log"
    # (the JVM's own start-up line; log4j's are quiet at a normal start: our log4j2 profile)
    assert "Using incubator modules" in jvm_log.read_text(errors="replace")
    # Nothing kept on success in a directory the user named? The directory stays (it was
    # given), the processes are gone.
    assert "stopping the cluster" in out
