"""`sluice ctl snapshot execute|stop|pause|resume|status --producer ID`: a capture's snapshots
through its etcd signal channel, or its source's signal table (docs/snapshots.md).

Invariant: ctl only ever writes a signal the capture would accept — the JSON is parsed with the
capture's own parser before it is written, so a bad regex or filter is refused here (exit 2) and
never reaches the capture. Through etcd (the default) it writes nothing to the source database;
with `--signal-table DB.TABLE --source DSN` it inserts the Debezium signal row there instead
(the capture reads it from the binlog: an execute-snapshot then runs in signal-table mode).

A signal is `{"id", "type", "data"}` under `/sluice/<cluster>/producers/<ID>/signals/<id>`; the
capture applies it (an execute-snapshot from etcd runs in read-only mode), commits its effect to
the pumps, then deletes the key. `status` shows the progress the capture publishes at
`/sluice/<cluster>/producers/<ID>/snapshot` and the signals not applied yet; `--wait` (on the
signal commands) waits until the capture took the signal.
"""
from __future__ import annotations

import argparse
import json
import time
import uuid

from sluice.capture.snapshot.signals import parse_etcd_signal, parse_signal
from sluice.core import errors
from sluice.core.registry import NodeKind, snapshot_progress_path
from sluice.core.table import quote_ident

from . import render
from .context import Ctx

WAIT_POLL_S = 0.2


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("snapshot", parents=[common],
                       help="start, stop, pause, resume or show a capture's snapshot")
    ssub = p.add_subparsers(dest="snapshot_cmd", metavar="execute|stop|pause|resume|status",
                            required=True)
    for verb, what in (("execute", "snapshot tables (read-only mode: nothing is written to the "
                                   "source)"),
                       ("stop", "stop the snapshot (all tables, or --tables)"),
                       ("pause", "pause the snapshot after the chunks in flight"),
                       ("resume", "resume a paused snapshot"),
                       ("status", "the snapshot's progress and pending signals")):
        s = ssub.add_parser(verb, parents=[common], help=what)
        s.add_argument("--producer", required=True, metavar="ID", help="the capture's producer id")
        if verb in ("execute", "stop"):
            s.add_argument("--tables", required=verb == "execute", default="",
                           metavar="REGEX,...",
                           help="comma-separated regexes, full match on db.table")
        if verb == "execute":
            s.add_argument("--condition", "--where", dest="condition", default="", metavar="SQL",
                           help="additional condition for every selected table's chunk SELECT")
            s.add_argument("--surrogate-key", default="", metavar="COLUMN",
                           help="chunk keyless tables by this unique NOT NULL column")
        if verb != "status":
            s.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                           help="wait until the capture applied the signal (etcd channel)")
            s.add_argument("--signal-table", default="", metavar="DB.TABLE",
                           help="send through the source's signal table (with --source) instead "
                                "of etcd")
            s.add_argument("--source", default="", metavar="DSN",
                           help="the source for --signal-table: mysql://user:password@host:port")
        s.set_defaults(func=status if verb == "status" else _sender(verb))


def _sender(verb: str):  # type: ignore[no-untyped-def]
    def send(ctx: Ctx, args: argparse.Namespace) -> int:
        data: dict[str, object] = {}
        if getattr(args, "tables", ""):
            data["data-collections"] = [t.strip() for t in args.tables.split(",") if t.strip()]
        if verb == "execute":
            data["type"] = "incremental"
            if args.condition:
                data["additional-conditions"] = [
                    {"data-collection": t, "filter": args.condition}
                    for t in data["data-collections"]]  # type: ignore[union-attr]
            if args.surrogate_key:
                data["surrogate-key"] = args.surrogate_key
        sid = f"ctl-{uuid.uuid4().hex[:12]}"
        doc = {"id": sid, "type": f"{verb}-snapshot", "data": data}
        if args.signal_table or args.source:
            return _send_to_table(ctx, args, doc)
        key = ctx.keys.signals_prefix(args.producer) + sid
        value = json.dumps(doc, sort_keys=True)
        parse_etcd_signal(key, value)     # InvalidSignal (exit 2) before anything is written
        if ctx.registry.get(NodeKind.PRODUCER, args.producer) is None:
            ctx.warn(f"producer {args.producer!r} is not registered in cluster "
                     f"{ctx.cluster_id}; the signal waits for a capture with that id")
        ctx.etcd.put(key, value)
        if args.wait > 0:
            end = time.monotonic() + args.wait
            while ctx.etcd.get(key)[0] is not None:
                if time.monotonic() > end:
                    raise errors.Unavailable(f"signal {sid} written at {key} but not applied by "
                                             f"{args.producer} within {args.wait}s (is the "
                                             "capture running?)")
                time.sleep(WAIT_POLL_S)
        if ctx.json:
            render.emit_json(ctx.out, {"key": key, "signal": doc, "applied": args.wait > 0})
        else:
            ctx.print(f"{verb}-snapshot signal {sid} written for {args.producer}"
                      + (" and applied" if args.wait > 0 else ""))
        return 0
    return send


def _send_to_table(ctx: Ctx, args: argparse.Namespace, doc: dict[str, object]) -> int:
    """Insert the signal as a row of the source's signal table (Debezium's id, type, data)."""
    if not (args.signal_table and args.source):
        raise errors.InvalidArgument("--signal-table and --source go together (the signal "
                                     "table DB.TABLE and the source DSN that holds it)")
    if args.wait > 0:
        raise errors.InvalidArgument("--wait needs the etcd channel: the capture does not "
                                     "delete signal-table rows; follow it with `ctl snapshot "
                                     "status`")
    db, dot, table = args.signal_table.partition(".")
    if not dot or not db or not table:
        raise errors.InvalidArgument(f"--signal-table {args.signal_table!r}: want DB.TABLE")
    data = json.dumps(doc["data"], sort_keys=True)
    parse_signal(doc["id"], doc["type"], data)   # InvalidSignal (exit 2) before the insert
    from .verify import MySQLSide   # pymysql only for this path
    side = MySQLSide(args.source)
    try:
        side.query(f"INSERT INTO {quote_ident(db)}.{quote_ident(table)} (id, type, data) "
                   "VALUES (%s, %s, %s)", (doc["id"], doc["type"], data))
    except Exception as e:  # noqa: BLE001 - pymysql errors: name the table and the cause
        raise errors.FailedPrecondition(f"cannot insert the signal into {args.signal_table} on "
                                        f"{side.name}: {e}") from None
    finally:
        side.close()
    if ctx.json:
        render.emit_json(ctx.out, {"signal_table": args.signal_table, "signal": doc})
    else:
        ctx.print(f"{doc['type']} signal {doc['id']} inserted into {args.signal_table} for "
                  f"{args.producer}")
    return 0


def status(ctx: Ctx, args: argparse.Namespace) -> int:
    raw, _ = ctx.etcd.get(ctx.registry.cluster_key(snapshot_progress_path(args.producer)))
    progress = json.loads(raw) if raw is not None else None
    kvs, _ = ctx.etcd.get_prefix(ctx.registry.signals_prefix(args.producer))
    pending = []
    for value, _meta in kvs:
        try:
            pending.append(json.loads(value))
        except ValueError:
            pending.append({"raw": value.decode("utf-8", "replace")})
    if ctx.json:
        render.emit_json(ctx.out, {"producer": args.producer, "snapshot": progress,
                                   "pending_signals": pending})
        return 0
    if progress is None:
        ctx.print(f"producer {args.producer}: no snapshot recorded")
    else:
        p = progress
        state = ("finished" if p["finished"] else "paused" if p["paused"] else "running")
        ctx.print(f"producer {args.producer}: snapshot {p['snapshot_id']} ({p['mode']}) {state}")
        ctx.print(render.table(
            ["tables", "current", "chunks", "rows"],
            [[",".join(p["tables"]), p["current_table"] or "-", p["chunks_done"],
              p["rows_done"]]]))
    for s in pending:
        ctx.print(f"pending signal {s.get('id', '?')}: {s.get('type', '?')} {s.get('data', '')}")
    return 0
