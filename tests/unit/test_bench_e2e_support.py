"""bench/e2e_support.py's measuring pieces, on real processes: CPU read from /proc counts a
process's children, a child's own CPU comes from its exit rusage, py-spy's collapsed stacks
become self/total shares."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from e2e_support import (Probe, lag_stats, parse_collapsed, proc_cpu_seconds,  # noqa: E402
                         profiles_markdown, Profile, wait_rusage)

BURN = "import time\nt=time.process_time()\nwhile time.process_time()-t<{s}: pass\n"


CHILD = BURN.format(s=0.5) + "import sys\nprint('burned', flush=True)\nsys.stdin.read()\n"
PARENT = ("import subprocess, sys, time\n"
          f"c = subprocess.Popen([sys.executable, '-c', {CHILD!r}], stdin=subprocess.PIPE)\n"
          "sys.stdin.readline(); c.stdin.close(); c.wait()\n"
          "print('reaped', flush=True); time.sleep(60)\n")


@pytest.mark.timeout(60)
def test_proc_cpu_counts_live_and_reaped_children() -> None:
    """A parent that only waits is charged for the CPU its live child burns (a Spark drainer's
    JVM is such a child), still after it has reaped that child, and a gone process is left out."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "burned"    # the child is alive, burned 0.5 s
        live = proc_cpu_seconds({"p": parent.pid, "gone": 2 ** 22 + 7})
        assert "gone" not in live
        assert live["p"] >= 0.5, live
        parent.stdin.write("go\n")
        parent.stdin.flush()
        assert parent.stdout.readline().strip() == "reaped"    # now in cutime + cstime
        after = proc_cpu_seconds({"p": parent.pid})
        assert after["p"] >= live["p"] - 0.02, (live, after)
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.timeout(60)
def test_wait_rusage_is_the_childs_cpu_and_exit_code() -> None:
    """wait_rusage gives one child's own CPU and exit code, and kills it at the timeout."""
    p = subprocess.Popen([sys.executable, "-c", BURN.format(s=0.5) + "raise SystemExit(3)"])
    code, cpu = wait_rusage(p, 30)
    assert code == 3 and 0.45 <= cpu < 5, (code, cpu)
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    t0 = time.monotonic()
    code, _ = wait_rusage(p, 0.5)
    assert code is None and time.monotonic() - t0 < 10 and p.returncode is not None


def test_collapsed_stacks_to_shares() -> None:
    """Self share counts the innermost frame; total counts a frame once per stack even when it
    recurses; paths are made repo-relative."""
    text = (f"<module> (x.py:1);f ({REPO}/capture/a.py:3);g (b.py:4) 30\n"
            f"<module> (x.py:1);f ({REPO}/capture/a.py:3);f ({REPO}/capture/a.py:3) 10\n"
            "garbage line\n")
    n, leaf, total = parse_collapsed(text, REPO)
    assert n == 40
    assert leaf == {"g (b.py:4)": 30, "f (capture/a.py:3)": 10}
    assert total["f (capture/a.py:3)"] == 40 and total["<module> (x.py:1)"] == 40
    prof = Profile("capture", 1, n, "", leaf, total)
    assert prof.top(1) == [("g (b.py:4)", 0.75, 0.75)]
    md = profiles_markdown([prof], 5, "hdr")
    assert "| `g (b.py:4)` | 75.0% | 75.0% |" in md and "| `f (capture/a.py:3)` | 100.0% |" in md


def test_lag_percentiles_and_missing() -> None:
    """Lag percentiles are nearest-rank over the probes seen; unseen probes count as missing."""
    probes = [Probe(i, 100.0 + i, i, "x", {"s": 100.0 + i + i / 100}) for i in range(1, 101)]
    probes.append(Probe(101, 150.0, 101, "x"))
    st = lag_stats(probes, "s", 100.0, 300.0)
    assert (st.p50, st.p95, st.p99) == pytest.approx((0.5, 0.95, 0.99))
    assert (st.probes, st.missing) == (101, 1)


def test_spark_batches_read_from_the_drainers_own_log_format(tmp_path: Path) -> None:
    """The Spark drainer's "spark batch committed" lines, written by the real log formatter,
    give the window's batch count, rows and commit step times; lines outside the window and
    other lines are not counted."""
    import logging

    from e2e_support import spark_batches
    from sluice.core.log import KeyValueFormatter, kv
    path = tmp_path / "drainer-spark.log"
    handler = logging.FileHandler(path)
    handler.setFormatter(KeyValueFormatter())
    lg = logging.getLogger("test.spark_batches")
    lg.addHandler(handler)
    lg.propagate = False
    lg.setLevel(logging.INFO)
    t0 = time.time()
    for batch, (rows, secs) in enumerate([(100, (1.5, 2.0, 0.5)), (300, (1.0, 1.0, 0.5))], 1):
        lg.info("spark batch committed", extra=kv(batch=batch, epoch=1, commit_ts=batch, rows=rows,
                                                  tables=4, changelog_s=secs[0], current_s=secs[1],
                                                  marker_s=secs[2]))
    lg.info("spark sink open", extra=kv(rows=999))
    handler.close()
    got = spark_batches(path, t0 - 1, time.time() + 1)
    assert got is not None
    assert (got["batches"], got["rows_p50"], got["commit_s_max"]) == (2, 100, 4.0)
    assert spark_batches(path, t0 + 3600, t0 + 7200) == {"batches": 0}
    assert spark_batches(tmp_path / "absent.log", t0, t0) is None


def test_loop_stalls_read_from_the_loopwatch_lines_of_each_process_log(tmp_path: Path) -> None:
    """core/loopwatch.py's own messages, written by the real log formatter into one log per
    process, give each process's stalls in the window (duration and busiest threads)."""
    import logging

    from e2e_support import loop_stalls
    from sluice.core.log import KeyValueFormatter
    from sluice.core.loopwatch import LoopWatch, busiest
    path = tmp_path / "drainer-spark.log"
    handler = logging.FileHandler(path)
    handler.setFormatter(KeyValueFormatter())
    lg = logging.getLogger("sluice.core.loopwatch")
    lg.addHandler(handler)
    old_level = lg.level
    lg.setLevel(logging.WARNING)
    try:
        watch = LoopWatch("drainer drainer-spark", threshold=0.3, tick=0.05)

        async def main() -> None:
            watch.start()
            await asyncio.sleep(0.1)
            end = time.thread_time() + 0.8       # the stall: the loop's own thread busy
            while time.thread_time() < end:
                pass
            await asyncio.sleep(0.3)
            watch.stop()
        t0 = time.time()
        asyncio.run(main())
    finally:
        lg.removeHandler(handler)
        lg.setLevel(old_level)
        handler.close()
    (tmp_path / "pump-1.log").write_text("2026-11-29T00:00:00.000Z INFO  sluice.pump started\n")
    got = loop_stalls(tmp_path, t0 - 1, time.time() + 1)
    assert list(got) == ["drainer-spark"], got
    (stall,) = got["drainer-spark"]
    assert 0.6 <= stall["seconds"] <= 1.5 and stall["threads"].startswith("MainThread/"), stall
    assert loop_stalls(tmp_path, t0 + 3600, t0 + 7200) == {}
    assert loop_stalls(tmp_path / "absent", t0, t0) == {}
    assert busiest({}, {}) == "none"


@pytest.mark.timeout(60)
def test_pipeline_with_one_drainer_against_the_replica_at_both_rates() -> None:
    """Issue #23's ratio: the pipeline with one drainer is every Sluice process but the Spark
    drainer (not the source side, not the downstream), compared with the replica's CPU per
    transaction at full speed and at Sluice's rate."""
    import e2e
    half = {"cpu_ms_per_txn": {"mariadb": 0.34, "sysbench": 0.12, "bench-probes": 0.01,
                               "mariadb-downstream": 0.05, "capture": 0.08, "pump-1": 0.04,
                               "pump-2": 0.04, "drainer-mysql": 0.09, "drainer-spark": 0.14,
                               "tso-1": 0.015, "etcd": 0.013, "supervisor": 0.002}}
    assert e2e.pipeline_one_drainer(half) == pytest.approx(0.28)
    native = {"cpu_ms_per_txn": {"mariadb-replica": 0.11},
              "same_rate": {"tps": 2087.0, "cpu_ms_per_txn": {"mariadb-replica": 0.16}}}
    rows = e2e.pipeline_ratio_rows(native, half)
    assert [r[3] for r in rows] == ["2.55x", "1.75x"]
    assert rows[0][4].endswith("NOT met") and rows[1][4].endswith(": met")
    assert "2,087 tps" in rows[1][0]


def test_stream_lags_are_each_drainers_view_of_each_pump_behind_its_served_watermark() -> None:
    from e2e_support import stream_lags
    TS_PER_SECOND = 1000 << 18      # TSO timestamps: milliseconds << 18
    wm = 470_000_000_000_000_000
    samples = {
        "pump-1": {"sluice_pump_served_watermark": wm},
        "pump-2": {"sluice_pump_served_watermark": wm + TS_PER_SECOND},
        "drainer-mysql": {'sluice_drainer_pump_watermark{pump="pump-1"}': wm,
                          'sluice_drainer_pump_watermark{pump="pump-2"}': wm - 14 * TS_PER_SECOND},
        "drainer-spark": {},                      # not scraped this time: no streams
        "capture": {"sluice_capture_transactions_total": 5.0},
    }
    assert stream_lags(samples) == {"drainer-mysql<pump-1": 0.0, "drainer-mysql<pump-2": 15.0}
