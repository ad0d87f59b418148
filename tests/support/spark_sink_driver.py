"""A tiny drainer stand-in that drives the Spark sink in its own process, for kill -9 tests.

It rebuilds the same transactions from a seed (`build`), resumes after the checkpoint saved in
`<state-dir>/<name>.json` (what a drainer persists: the sink's checkpoint, written atomically after
each flush), applies the rest in chunks with a flush after every chunk (one micro-batch per chunk,
so batch boundaries are deterministic), and exits 0 when done. Failpoints (SLUICE_FAILPOINTS, e.g.
`spark-before-marker=exit(137)@2`) make it die at chosen points of the commit protocol.

    python -m tests.support.spark_sink_driver --warehouse W --state-dir S --name N
        [--current-state equality-deletes]

Prints one JSON line per sink: {"name", "start" (drainer checkpoint), "committed" (the sink's
marker table on open), "open_state" (its checkpoint state on open), "skipped", "done"}.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any

from sluice.drainer.sink import Checkpoint
from sluice.drainer.txn import Txn
from sluice.spark_sink.config import SparkSinkConfig
from sluice.spark_sink.sink import SparkSink
from tests.support.rows import RandomWorkload, history_of
from tests.support.spark import TEST_CONF

FIRST_TS = 1 << 40
SEED, TXNS, KEYS, CHUNK = 11, 239, 120, 80   # 240 txns with the schema one: 3 batches
EPOCH = 1


def build(seed: int = SEED, count: int = TXNS, keys: int = KEYS,
          schema: str = "shop") -> tuple[list[Txn], RandomWorkload]:
    """Deterministic random transactions over three keyed tables (inserts, updates, deletes,
    primary-key changes, unique-key swaps) and the workload holding the expected end state."""
    wl = RandomWorkload(seed, schema, keys=keys, max_rows=4, keyless=False)
    return wl.transactions(count, FIRST_TS), wl


def sink_config(warehouse: str, name: str, current_state: str = "delete") -> SparkSinkConfig:
    """The sink `name` with its own namespaces in the shared catalog (the same shape as
    tests/support/spark.py's SparkEnv.sink_config, so a test session reads it)."""
    return SparkSinkConfig(
        master="local[1]", warehouse=warehouse, shuffle_partitions=1, log_level="ERROR",
        meta_database=f"m_{name}", database=f"{name}_{{schema}}",
        batch_rows=1_000_000, batch_interval=3600.0, maintenance_every=0,
        current_state=current_state, spark_conf={**TEST_CONF, "spark.driver.memory": "512m"})


def load_state(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {"commit_ts": 0, "sink_state": {}}


def save_state(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


async def drive_one(warehouse: str, state_dir: Path, name: str, chunk: int,
                    spark: Any = None, current_state: str = "delete") -> dict[str, Any]:
    """Drive sink `name` (keeping its current tables by `current_state`) from its saved
    checkpoint to the end (in `spark`, or this process's own session); the JSON summary
    line's fields."""
    txns, _ = build()
    # The drainer records schema history before a batch reaches the sink; the whole history up
    # front is equivalent here (every version is keyed by commit_ts).
    schema = history_of(txns)
    state_path = state_dir / f"{name}.json"
    state = load_state(state_path)
    sink = SparkSink(sink_config(warehouse, name, current_state), schema, source_name="src", epoch=EPOCH,
                     spark=spark, owner="d-crash")
    await sink.open(Checkpoint(state["commit_ts"], sink_state=state.get("sink_state", {})))
    opened = sink.checkpoint()
    # Resume from the drainer's checkpoint, like PullBinlogs(after_commit_ts=checkpoint): the
    # sink itself skips whatever its marker table already holds beyond that.
    pending = [t for t in txns if t.commit_ts > state["commit_ts"]]
    for i in range(0, len(pending), chunk):
        await sink.apply(pending[i:i + chunk])
        await sink.flush()
        cp = sink.checkpoint()
        save_state(state_path, {"commit_ts": cp.commit_ts, "sink_state": cp.sink_state})
    await sink.flush()
    cp = sink.checkpoint()
    save_state(state_path, {"commit_ts": cp.commit_ts, "sink_state": cp.sink_state})
    await sink.close()
    return {"name": name, "start": state["commit_ts"], "committed": opened.commit_ts,
            "open_state": opened.sink_state, "skipped": sink.skipped, "done": cp.commit_ts}


async def main(args: argparse.Namespace) -> None:
    state_dir = Path(args.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    for name in args.name:
        out = await drive_one(args.warehouse, state_dir, name, args.chunk,
                              current_state=args.current_state)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TZ", "UTC")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    ap = argparse.ArgumentParser()
    ap.add_argument("--warehouse", required=True)
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--name", action="append", required=True)
    ap.add_argument("--chunk", type=int, default=CHUNK)
    ap.add_argument("--current-state", default="delete")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(main(ap.parse_args()))
