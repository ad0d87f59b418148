"""A tiny drainer stand-in that drives the MySQL sink in its own process, for kill -9 tests.

It rebuilds the same transactions from a seed (`build`), resumes after the checkpoint saved in
--state (what a drainer persists: commit_ts and dispatched_upper, written atomically after each
flush), applies the rest in chunks, flushing every few chunks, and exits 0 when done. Failpoints
(SLUICE_FAILPOINTS, e.g. `mysql-sink-after-commit=exit(137)@30`) make it die at chosen points.

    python -m tests.support.mysql_sink_driver --port P --password X --db D --state S.json
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
from sluice.drainer.sinks.mysql import MySQLSink, MySQLSinkConfig
from sluice.drainer.txn import Txn
from tests.support.rows import RandomWorkload, Table, col, history_of, prewrite_value, txn

FIRST_TS = 1000


def build(seed: int, db: str, count: int, keys: int) -> tuple[list[Txn], RandomWorkload, Table, list[tuple]]:
    """Random transactions (no keyless table: safe mode cannot make those idempotent) with a
    CREATE, inserts, an ALTER ADD COLUMN and inserts using the column spliced in the middle.
    Returns (transactions, workload with its model, the final `extra` table, its expected rows)."""
    wl = RandomWorkload(seed, db, keys=keys, keyless=False)
    values: list[Any] = [wl.next_value() for _ in range(count)]
    v1 = Table(990, db, "extra", [col("id", "int(11)", nullable=False), col("a", "int(11)")], ["id"])
    v2 = v1.add_column(col("b", "varchar(8)"))
    mid = count // 2
    values[mid:mid] = [
        prewrite_value(ddl=v1.create_ddl("CREATE TABLE extra (id int NOT NULL PRIMARY KEY, a int)")),
        prewrite_value(v1.mutation(*[v1.insert(id=i, a=i) for i in range(5)])),
        prewrite_value(ddl=v2.alter_ddl("ALTER TABLE extra ADD COLUMN b varchar(8)")),
        prewrite_value(v2.mutation(*[v2.insert(id=i, a=i, b=f"b{i}") for i in range(5, 9)],
                                   v2.update(dict(id=0, a=0, b=None), dict(b="zero")))),
    ]
    txns = [txn(prewrite_value(snapshots=wl.tables), FIRST_TS)]
    txns += [txn(v, FIRST_TS + 1 + i) for i, v in enumerate(values)]
    expected = sorted([(0, 0, "zero")] + [(i, i, None) for i in range(1, 5)]
                      + [(i, i, f"b{i}") for i in range(5, 9)])
    return txns, wl, v2, expected


def load_state(path: Path) -> dict[str, int]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {"commit_ts": 0, "dispatched_upper": 0}


def save_state(path: Path, state: dict[str, int]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


async def main(args: argparse.Namespace) -> None:
    txns, _, _, _ = build(args.seed, args.db, args.txns, args.keys)
    history = history_of(txns)
    state_path = Path(args.state)
    state = load_state(state_path)
    cfg = MySQLSinkConfig(port=args.port, password=args.password, checkpoint_schema=args.cp_schema,
                          worker_count=args.workers, txn_batch=args.batch,
                          dispatched_upper_lead_ms=0)
    sink = MySQLSink(cfg, history, epoch=1, name="crash")
    await sink.open(Checkpoint(state["commit_ts"], dispatched_upper=state["dispatched_upper"]))
    print(json.dumps({"start": state["commit_ts"], "safe_until": sink.safe_until}), flush=True)
    pending = [t for t in txns if t.commit_ts > state["commit_ts"]]
    for n, i in enumerate(range(0, len(pending), args.chunk), start=1):
        await sink.apply(pending[i:i + args.chunk])
        if n % args.flush_every == 0:
            await sink.flush()
            cp = sink.checkpoint()
            save_state(state_path, {"commit_ts": cp.commit_ts,
                                    "dispatched_upper": cp.sink_state["dispatched_upper"]})
    await sink.flush()
    cp = sink.checkpoint()
    save_state(state_path, {"commit_ts": cp.commit_ts, "dispatched_upper": cp.sink_state["dispatched_upper"]})
    await sink.close()
    print(json.dumps({"done": cp.commit_ts}), flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--password", required=True)
    ap.add_argument("--db", required=True)
    ap.add_argument("--cp-schema", required=True)
    ap.add_argument("--state", required=True)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--txns", type=int, default=600)
    ap.add_argument("--keys", type=int, default=100)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--chunk", type=int, default=25)
    ap.add_argument("--flush-every", type=int, default=4)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(main(ap.parse_args()))
