"""The capture's native row decode alone: `sluice_native.RowDecoder.decode` on 200-row INSERT and
100-pair UPDATE bodies of a six-column table (BIGINT, INT UNSIGNED, utf8 VARCHAR, DECIMAL(10,2),
DATETIME, TIMESTAMP(6)), CPU ns per row change.

For old-vs-new comparisons of the native core (a refactor of native/src must not slow it): each
variant is a directory holding a built `sluice_native` (e.g. the unpacked wheel of a baseline
tree: `git archive <rev> | tar -x -C DIR`, `maturin build --release` there, `python -m zipfile -e
WHEEL OUT`). Each run is a child process importing the module from its directory; variants
alternate, their order rotating each round. Every variant must produce the same bytes (a digest),
or the run stops. The parent prints each variant's median with the load average (1 min) beside
every run, and each variant's ratio to the first.

Run: .venv/bin/python bench/native_rowdecode.py --variant old=/tmp/base-wheel --variant new=/tmp/new-wheel
       [--rounds 12] [--repeat 3000]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import struct
import subprocess
import sys
import time

SPEC = [("id", "int", 8, False), ("k", "int", 4, True), ("name", "text", 1, "utf-8", False),
        ("price", "decimal", 10, 2), ("created", "datetime2", 0), ("ts", "timestamp2", 6)]


def _row(i: int) -> bytes:
    """One FULL row image of SPEC (null bitmap, then the columns' binlog layouts)."""
    ymd = ((2026 * 13 + 11) << 5) | 28
    created = (((ymd << 17) | (9 << 12) | (1 << 6) | i % 60) + 0x80_0000_0000).to_bytes(5, "big")
    name = f"customer-{i:06d}-é".encode()
    return (b"\x00" + struct.pack("<qI", i, i * 7) + bytes([len(name)]) + name
            + bytes([0x80, 0, 0x30, 0x39, 12]) + created
            + struct.pack(">I", 1_764_000_000 + i) + (i % 1_000_000).to_bytes(3, "big"))


def child(path: str, repeat: int) -> None:
    sys.path.insert(0, path)
    import sluice_native
    if not sluice_native.__file__.startswith(path):
        raise SystemExit(f"sluice_native imported from {sluice_native.__file__}, not {path}")
    dec = sluice_native.RowDecoder(SPEC)
    inserts = b"".join(_row(i) for i in range(200))
    updates = b"".join(_row(i) + _row(i + 1) for i in range(100))
    digest = hashlib.sha256()
    for body, tp, n in ((inserts, 1, 200), (updates, 2, 100)):
        out, count = dec.decode(body, tp)
        if count != n:
            raise SystemExit(f"decoded {count} changes, expected {n}")
        digest.update(out)
    t0 = time.process_time()
    for _ in range(repeat):
        dec.decode(inserts, 1)
        dec.decode(updates, 2)
    ns = (time.process_time() - t0) / (repeat * 300) * 1e9
    print(json.dumps({"ns_per_row": ns, "digest": digest.hexdigest(), "load": os.getloadavg()[0]}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", action="append", default=[], help="label=DIR holding sluice_native")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--repeat", type=int, default=3000)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.repeat)
        return
    if not a.variant:
        ap.error("give at least one --variant label=DIR")
    variants = [v.split("=", 1) for v in a.variant]
    runs: dict[str, list[float]] = {label: [] for label, _ in variants}
    digests: set[str] = set()
    for r in range(a.rounds):
        for label, path in variants[r % len(variants):] + variants[:r % len(variants)]:
            out = subprocess.run([sys.executable, __file__, "--child", os.path.abspath(path),
                                  "--repeat", str(a.repeat)], capture_output=True, text=True)
            if out.returncode:
                raise SystemExit(f"variant {label} failed: {out.stderr.strip()}")
            res = json.loads(out.stdout)
            digests.add(res["digest"])
            if len(digests) != 1:
                raise SystemExit(f"variant {label} decoded different bytes")
            runs[label].append(res["ns_per_row"])
            print(f"round {r} {label}: {res['ns_per_row']:.0f} ns/row (load {res['load']:.1f})", flush=True)
    base = statistics.median(runs[variants[0][0]])
    for label, _ in variants:
        med = statistics.median(runs[label])
        print(f"{label}: median {med:.0f} ns/row over {len(runs[label])} runs, {med / base:.3f}x {variants[0][0]}")


if __name__ == "__main__":
    main()
