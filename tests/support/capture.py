"""Shared helpers for capture tests: start `sluice capture`, read the pumps' own output, drive a
source workload and compare source, pumps and file sink (exactly once, source order).
"""
from __future__ import annotations

import datetime as dt
import json
import random
import signal
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pymysql

from sluice.core.rowcodec import row_to_dict
from sluice.drainer.txn import SchemaHistory, Txn
from sluice.proto import sluice_pb2 as pb
from tests.support.binlogs import TS
from tests.support.cluster import Cluster, set_args
from tests.support.mariadb import MariaDBServer
from tests.support.procs import Proc, free_port, sluice_argv, wait_until

PUMPS = ["pump-1", "pump-2"]


# ------------------------------------------------------------------------------------------------
# helpers (shared with tests/fault/test_capture_crash.py)
# ------------------------------------------------------------------------------------------------

def start_capture(cluster: Cluster, source: MariaDBServer, producer_id: str, *, name: str = "",
                  env: dict[str, str] | None = None, source_name: str = "",
                  **settings: object) -> Proc:
    """Start `sluice capture` for `source` (stopped with the cluster, by pid). The replica
    server-id is derived from the producer id, so two processes of one producer share it, as
    two copies of one config would."""
    name = name or producer_id
    full: dict[str, object] = {
        "producer-id": producer_id, "cluster-id": cluster.cluster_id, "etcd": cluster.etcd,
        "tso": cluster.tso_addrs, "start-position": "latest", "heartbeat-s": 0.5,
        "group-max-wait-ms": 5, "metrics-addr": f"127.0.0.1:{free_port()}",
        "source.host": "127.0.0.1", "source.port": source.port, "source.user": source.user,
        "source.password": source.password,
        "source.server-id": 20000 + zlib.crc32(producer_id.encode()) % 10000,
        "source.name": source_name or producer_id,
    }
    full.update(settings)
    proc = Proc(name, sluice_argv("capture", *set_args(full)), cluster.workdir / f"{name}.log",
                env=env).start()
    cluster.procs.append(proc)
    return proc


def wait_streaming(proc: Proc, timeout: float = 30, nth: int = 1) -> None:
    """Until the capture logged its nth `streaming` (it then reads from its start position)."""
    def streaming() -> bool:
        assert proc.alive(), f"{proc.name} exited:\n{proc.log_text()[-3000:]}"
        return proc.log_text().count("capture streaming") >= nth
    wait_until(streaming, timeout, 0.1, what=f"{proc.name} to stream")


def capture_metrics(proc: Proc) -> dict[str, float]:
    """The capture's /metrics as {"name{labels}": value}."""
    import urllib.request
    addr = next(a.split("=", 1)[1].strip('"') for a in proc.argv if a.startswith("metrics-addr="))
    text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=2).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def kill_binlog_dumps(db: MariaDBServer) -> int:
    """KILL every binlog dump connection on the source (a lost replication connection)."""
    ids = [r[0] for r in db.execute("SELECT ID FROM information_schema.PROCESSLIST "
                                    "WHERE COMMAND LIKE 'Binlog Dump%'")]
    for i in ids:
        db.execute(f"KILL {int(i)}")
    return len(ids)


def gtid_of(txn: Txn) -> str:
    src = txn.source
    return src.gtid if src is not None else ""


def gtid_key(gtid: str) -> tuple[int, int, int]:
    d, s, n = (int(x) for x in gtid.split("-"))
    return d, s, n


class PumpLog:
    """Every transaction the pumps serve through their own PullBinlogs after `after` (a
    commit_ts), collected incrementally; one copy per (pump, start_ts)."""

    def __init__(self, cluster: Cluster, after: int) -> None:
        self.cluster = cluster
        self.after = dict.fromkeys(cluster.pumps, after)
        self._txns: dict[tuple[str, int], Txn] = {}
        self.ts = TS(cluster.tso_addrs, cluster.cluster_id)

    def close(self) -> None:
        self.ts.close()

    def pull(self, until_ts: int, per_pump_s: float = 3.0) -> bool:
        """Read each pump up to watermark `until_ts` (or for per_pump_s); True if all got there."""
        complete = True
        for name, handle in self.cluster.pumps.items():
            if self.after[name] >= until_ts:
                continue
            ch, stub = handle.stub()
            parts: dict[int, list[bytes]] = {}
            try:
                stream = stub.PullBinlogs(pb.PullBinlogsReq(
                    cluster_id=self.cluster.cluster_id, after_commit_ts=self.after[name],
                    consumer_id="capture-test"), timeout=per_pump_s)
                for resp in stream:
                    for raw in resp.binlogs:
                        b = pb.Binlog.FromString(raw)
                        if b.tp == pb.PREWRITE:
                            parts.setdefault(b.start_ts, []).append(raw)
                        elif b.tp == pb.COMMIT:
                            self._txns[(name, b.start_ts)] = Txn.from_binlogs(
                                parts.pop(b.start_ts), raw, name)
                    self.after[name] = max(self.after[name], resp.watermark)
                    if resp.watermark >= until_ts:
                        stream.cancel()
                        break
            except grpc.RpcError as e:
                if e.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
                                    grpc.StatusCode.UNAVAILABLE):
                    raise
                complete = False
            finally:
                ch.close()
        return complete

    def txns(self, producer_id: str | None = None) -> list[Txn]:
        """Collected transactions in commit order (of one producer, if given)."""
        out = [t for t in self._txns.values() if producer_id is None or t.producer_id == producer_id]
        return sorted(out, key=lambda t: t.commit_ts)

    def wait_for(self, done: Callable[[], bool], timeout: float, watch: tuple[Proc, ...] = (),
                 what: str = "the pumps to hold the source's transactions") -> None:
        """Pull until done() (after a pull that reached a fresh ts on every pump)."""
        end = time.monotonic() + timeout
        while True:
            for p in watch:
                assert p.alive(), f"{p.name} exited ({p.popen.returncode}):\n{p.log_text()[-4000:]}"  # type: ignore[union-attr]
            if self.pull(self.ts.get()) and done():
                return
            if time.monotonic() > end:
                raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(0.2)


def gtid_range(before: str, after: str) -> list[str]:
    """Every GTID written between two @@gtid_binlog_pos values (all domains)."""
    def parse(text: str) -> dict[int, tuple[int, int]]:
        out = {}
        for part in filter(None, text.split(",")):
            d, s, n = (int(x) for x in part.split("-"))
            out[d] = (s, n)
        return out
    b, a = parse(before), parse(after)
    out = []
    for d, (s, n) in sorted(a.items()):
        first = b.get(d, (s, 0))[1] + 1
        out += [f"{d}-{s}-{i}" for i in range(first, n + 1)]
    return out


def gtid_pos(db: MariaDBServer) -> str:
    return str(db.execute("SELECT @@GLOBAL.gtid_binlog_pos")[0][0] or "")


def assert_exactly_once(txns: list[Txn], want: list[str]) -> None:
    """Each wanted source GTID is in exactly one pump transaction, and nothing else is."""
    got = Counter(gtid_of(t) for t in txns if gtid_of(t))
    twice = sorted((g for g, n in got.items() if n > 1), key=gtid_key)
    missing = sorted(set(want) - set(got), key=gtid_key)
    extra = sorted(set(got) - set(want), key=gtid_key)
    assert not twice, f"{len(twice)} source GTIDs committed more than once, first {twice[:5]}"
    assert not missing, f"{len(missing)} source GTIDs missing, first {missing[:5]}"
    assert not extra, f"{len(extra)} unexpected GTIDs, first {extra[:5]}"


def assert_source_order(txns: list[Txn]) -> None:
    """Commit order equals source order, per GTID domain (txns are in commit order)."""
    last: dict[int, int] = {}
    for t in txns:
        g = gtid_of(t)
        if not g:
            continue
        d, _, n = gtid_key(g)
        assert n > last.get(d, 0), f"GTID {g} committed after seq {last[d]} of domain {d}"
        last[d] = n


def _plain(v: Any) -> Any:
    if isinstance(v, dt.datetime) and v.tzinfo is not None:
        return v.replace(tzinfo=None)
    return v


def final_tables(txns: list[Txn]) -> dict[tuple[str, str], dict[Any, dict[str, Any]]]:
    """Table contents after applying the transactions in commit order, decoded the drainer's
    way; DDL effects (rename, truncate, drop) applied by name."""
    history = SchemaHistory()
    state: dict[tuple[str, str], dict[Any, dict[str, Any]]] = {}
    for t in txns:
        history.apply(t)
        ddl = t.ddl
        if ddl is not None:
            name = (ddl.schema_name, ddl.table_name)
            if ddl.tp == pb.RENAME_TABLE:
                state[name] = state.pop((ddl.old_schema_name, ddl.old_table_name), {})
            elif ddl.tp in (pb.TRUNCATE_TABLE, pb.DROP_TABLE):
                state.pop(name, None)
        for ev in t.rows(history):
            rows = state.setdefault((ev.schema, ev.table), {})
            if ev.before is not None:
                rows.pop(row_to_dict(ev.before, ev.table_info)["id"], None)
            if ev.after is not None:
                after = {k: _plain(v) for k, v in row_to_dict(ev.after, ev.table_info).items()}
                rows[after["id"]] = after
    return state


def source_table(db: MariaDBServer, schema: str, table: str) -> dict[Any, dict[str, Any]]:
    conn = db.connect(schema)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM `{table}`")
            cols = [c[0] for c in cur.description]
            return {r[0]: dict(zip(cols, r)) for r in cur.fetchall()}
    finally:
        conn.close()


def assert_same_rows(want: dict[Any, dict[str, Any]], got: dict[Any, dict[str, Any]], what: str) -> None:
    assert sorted(got) == sorted(want), f"{what}: keys differ: missing {sorted(set(want) - set(got))[:5]}, extra {sorted(set(got) - set(want))[:5]}"
    for k, row in want.items():
        # A row last written before an ADD COLUMN has no value for it: NULL in the source too.
        g = {c: got[k].get(c) for c in row}
        assert g == row, f"{what}: row {k} differs: source {row}, pumps {got[k]}"


class SourceLoad:
    """Random transactions (inserts, updates, deletes; 1-3 statements) over three tables of one
    source database, through one connection. `names` follows the renames the test makes."""

    TABLES = {
        "acct": "CREATE TABLE {db}.acct (id INT PRIMARY KEY, name VARCHAR(32) NOT NULL, "
                "bal DECIMAL(12,2), ts DATETIME(6)) ENGINE=InnoDB",
        "item": "CREATE TABLE {db}.item (id BIGINT PRIMARY KEY, qty INT NOT NULL, note TEXT) "
                "ENGINE=InnoDB",
        "log": "CREATE TABLE {db}.log (id INT AUTO_INCREMENT PRIMARY KEY, msg VARCHAR(64)) "
               "ENGINE=InnoDB",
    }

    def __init__(self, db: MariaDBServer, schema: str, seed: int = 1) -> None:
        self.db, self.schema = db, schema
        self.rng = random.Random(seed)
        self.conn = self._connect()
        self.ids: dict[str, set[int]] = {"acct": set(), "item": set()}
        self.next_id = 0
        self.names = {"acct": "acct", "item": "item", "log": "log"}
        self.extra_acct_column = False
        self.committed = 0

    def _connect(self) -> Any:
        return pymysql.connect(host="127.0.0.1", port=self.db.port, user=self.db.user,
                               password=self.db.password, charset="utf8mb4", autocommit=False)

    def create(self) -> None:
        self.ddl(f"CREATE DATABASE IF NOT EXISTS {self.schema}")
        for sql in self.TABLES.values():
            self.ddl(sql.format(db=self.schema))

    def ddl(self, sql: str) -> None:
        with self.conn.cursor() as cur:
            cur.execute(sql)
        self.conn.commit()

    def close(self) -> None:
        self.conn.close()

    def _statement(self, cur: Any) -> None:
        r = self.rng.random()
        s = self.schema
        table = self.rng.choice(["acct", "acct", "item", "item", "log"])
        name = self.names[table]
        ids = self.ids.get(table, set())
        if table == "log":
            cur.execute(f"INSERT INTO {s}.{name} (msg) VALUES (%s)", (f"m{self.rng.randrange(10**6)}",))
        elif r < 0.5 or len(ids) < 20:
            self.next_id += 1
            i = self.next_id
            if table == "acct":
                ts = dt.datetime(2024, 1, 1) + dt.timedelta(microseconds=self.rng.randrange(10**12))
                if self.extra_acct_column:
                    cur.execute(f"INSERT INTO {s}.{name} VALUES (%s,%s,%s,%s,%s)",
                                (i, f"n{i}", f"{self.rng.randrange(10**6)}.25", ts, f"e{i}@x"))
                else:
                    cur.execute(f"INSERT INTO {s}.{name} VALUES (%s,%s,%s,%s)",
                                (i, f"n{i}", f"{self.rng.randrange(10**6)}.25", ts))
            else:
                cur.execute(f"INSERT INTO {s}.{name} VALUES (%s,%s,%s)",
                            (i, self.rng.randrange(1000), "note ✓ " * self.rng.randrange(4)))
            ids.add(i)
        elif r < 0.85:
            i = self.rng.choice(sorted(ids))
            if table == "acct":
                cur.execute(f"UPDATE {s}.{name} SET bal = bal + 1, name = %s WHERE id = %s",
                            (f"u{self.rng.randrange(1000)}", i))
            else:
                cur.execute(f"UPDATE {s}.{name} SET qty = qty + 1 WHERE id = %s", (i,))
        else:
            i = self.rng.choice(sorted(ids))
            cur.execute(f"DELETE FROM {s}.{name} WHERE id = %s", (i,))
            ids.discard(i)

    def run(self, n: int, stop: threading.Event | None = None, pace_s: float = 0.0) -> int:
        """n transactions (fewer if `stop` is set); returns how many were committed."""
        done = 0
        for _ in range(n):
            if stop is not None and stop.is_set():
                break
            with self.conn.cursor() as cur:
                for _ in range(self.rng.randint(1, 3)):
                    self._statement(cur)
            self.conn.commit()
            done += 1
            if pace_s:
                time.sleep(pace_s)
        self.committed += done
        return done


def read_file_sink_txns(out_dir: Path) -> list[dict[str, Any]]:
    """The file sink's data transactions in file order: {id (GTID), commit_ts, rows: [(db.table, op, id)]}."""
    txns: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for path in sorted(out_dir.glob("binlog-*.jsonl")):
        for line in path.read_text().splitlines():
            ev = json.loads(line)
            if ev.get("status") == "BEGIN":
                current = {"id": ev["id"], "commit_ts": ev["commit_ts"], "rows": []}
            elif ev.get("status") == "END":
                assert current is not None and current["id"] == ev["id"]
                txns.append(current)
                current = None
            elif "op" in ev:
                assert current is not None
                img = ev["after"] if ev["after"] is not None else ev["before"]
                current["rows"].append((f"{ev['source']['db']}.{ev['source']['table']}", ev["op"], img["id"]))
    assert current is None, "the file sink's output ends inside a transaction"
    return txns


def pump_rows(t: Txn, history: SchemaHistory) -> list[tuple[str, str, Any]]:
    out = []
    for ev in t.rows(history):
        img = ev.after if ev.after is not None else ev.before
        assert img is not None
        out.append((f"{ev.schema}.{ev.table}", ev.op, row_to_dict(img, ev.table_info, json=True)["id"]))
    return out


def assert_file_sink_matches(out_dir: Path, txns: list[Txn], timeout: float = 60) -> None:
    """The drainer's file sink holds the pumps' data transactions, in commit order, with the
    same rows (the GTID is the Debezium transaction id)."""
    history = SchemaHistory()
    want = []
    for t in txns:
        history.apply(t)
        rows = pump_rows(t, history)
        if rows:
            want.append({"id": gtid_of(t), "commit_ts": t.commit_ts, "rows": rows})

    def caught_up() -> bool:
        got = read_file_sink_txns(out_dir) if out_dir.exists() else []
        return bool(got) and got[-1]["commit_ts"] >= want[-1]["commit_ts"]
    wait_until(caught_up, timeout, 0.3, what="the drainer's file sink to catch up")
    got = [t for t in read_file_sink_txns(out_dir) if t["commit_ts"] <= want[-1]["commit_ts"]]
    assert [t["commit_ts"] for t in got] == sorted(t["commit_ts"] for t in got)
    assert len(got) == len(want), f"file sink has {len(got)} data transactions, pumps {len(want)}"
    for g, w in zip(got, want):
        assert g == w, f"file sink {g} != pumps {w}"


# ------------------------------------------------------------------------------------------------
# fixtures
# ------------------------------------------------------------------------------------------------
