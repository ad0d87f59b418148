"""Pump reader CPU: this tree's CommitReader vs the one of git revision REV, in one process,
alternating (medians of --repeat), on one store of single-part transactions.

Measures the PullBinlogs read path alone (index walk, pread windows, CRC checks, framing, the
txns entries or packed arrays) as CPU µs per binlog read, for several chunk sizes. The old
reader is loaded from `git show REV:pump/storage/reader.py` as a sibling module of the new one,
so both use the same index, value log and wire code. With --shared, two readers per pass follow
the store group by group as two live drainers do, through this tree's shared chunks
(`Storage.open_reader`) vs two private readers.
Usage: .venv/bin/python bench/pump_read.py [--baseline HEAD~1] [--repeat 7] [--groups 200]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import sluice.pump.storage.reader as new_reader  # noqa: E402
from sluice.proto import sluice_pb2 as pb  # noqa: E402
from sluice.pump.storage.storage import Storage, StorageOptions  # noqa: E402


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def old_module(rev: str, work: Path) -> ModuleType:
    src = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:pump/storage/reader.py"],
                         capture_output=True, text=True, check=True).stdout
    path = work / "reader_old.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("sluice.pump.storage.reader_old", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fill(st: Storage, groups: int, per_group: int, value: int) -> list[int]:
    """`groups` durable groups of `per_group` transactions; returns each group's watermark."""
    ts = 10
    marks = []
    for _ in range(groups):
        batch = []
        for _ in range(per_group):
            batch.append(pb.Binlog(tp=pb.PREWRITE, start_ts=ts, prewrite_value=os.urandom(value)
                                   ).SerializeToString())
            batch.append(pb.Binlog(tp=pb.COMMIT, start_ts=ts, commit_ts=ts + 1
                                   ).SerializeToString())
            ts += 2
        marks.append(st.write_blocking(batch))
    return marks


def read_all(st: Storage, mod: ModuleType, max_bytes: int, packed: bool) -> float:
    """CPU µs per binlog of one reader reading the whole store."""
    state = st._state
    t0 = time.process_time()
    r = mod.CommitReader(state.db, state.vlog, 0, lambda: state.served)
    r.packed = packed
    n = 0
    while True:
        c = r.next_chunk(max_bytes)
        n += c.count
        if c.exhausted:
            return (time.process_time() - t0) / n * 1e6


def follow(st: Storage, marks: list[int], shared: bool) -> float:
    """CPU µs per binlog written of two readers following group by group (inline reads of up to
    64 KiB, as caught-up streams do), through shared chunks or each on its own."""
    state = st._state
    wm = [0]
    watermark = lambda: wm[0]  # noqa: E731 - the watermark as each group made it
    if shared:
        cache = new_reader.SharedChunks()
        readers = [new_reader.CommitReader(state.db, state.vlog, 0, watermark, shared=cache)
                   for _ in range(2)]
    else:
        readers = [new_reader.CommitReader(state.db, state.vlog, 0, watermark) for _ in range(2)]
    for r in readers:
        r.packed = True
    n = 0   # binlogs the first reader got: the binlogs written
    t0 = time.process_time()
    for mark in marks:
        wm[0] = mark
        for k, r in enumerate(readers):
            inline = True
            while True:
                c = r.next_chunk(64 << 10 if inline else 2 << 20, inline)
                n += c.count if k == 0 else 0
                if c.exhausted:
                    break
                inline = False
    return (time.process_time() - t0) / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", default="HEAD~1", help="git revision of the old reader")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--groups", type=int, default=200)
    ap.add_argument("--per-group", type=int, default=50, help="transactions per group")
    ap.add_argument("--value", type=int, default=300, help="prewrite value bytes")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sluice-bench-read-"))
    try:
        old = old_module(args.baseline, work)
        st = Storage.open(work / "pump", StorageOptions(stop_write_at_available_space=0))
        marks = fill(st, args.groups, args.per_group, args.value)
        print(f"store: {args.groups} groups x {args.per_group} transactions ({args.value}-byte "
              f"values); reader at {args.baseline} vs this tree, alternating, medians of "
              f"{args.repeat}", flush=True)
        print("\n| read | old µs CPU / binlog | new | new / old | load at end |\n"
              "|---|---:|---:|---:|---|")
        for max_bytes, packed in ((2 << 20, True), (2 << 20, False), (64 << 10, True),
                                  (16 << 10, True)):
            runs: dict[str, list[float]] = {"old": [], "new": []}
            for k in range(args.repeat):
                order = (("old", old), ("new", new_reader))
                for name, mod in (order if k % 2 == 0 else order[::-1]):
                    runs[name].append(read_all(st, mod, max_bytes, packed))
            o, n = statistics.median(runs["old"]), statistics.median(runs["new"])
            print(f"| whole store, chunks of {max_bytes >> 10} KiB, "
                  f"{'packed arrays' if packed else 'txns entries'} | {o:.2f} | {n:.2f} | "
                  f"{n / o:.2f}x | {loadavg()} |", flush=True)
        runs = {"private": [], "shared": []}
        for k in range(args.repeat):
            for shared in ((False, True) if k % 2 == 0 else (True, False)):
                runs["shared" if shared else "private"].append(follow(st, marks, shared))
        o, n = statistics.median(runs["private"]), statistics.median(runs["shared"])
        print(f"| two readers following group by group: private (old: each reads) vs shared "
              f"chunks | {o:.2f} | {n:.2f} | {n / o:.2f}x | {loadavg()} |")
        st.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
