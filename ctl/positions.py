"""`sluice ctl position show|set`: where a capture resumes, and a deliberate rewind or skip.

Invariant: ctl writes a rewind (`producers/<id>/rewind`, core/registry.py) only while the
producer is not alive — one etcd transaction conditioned on the alive key being absent and the
rewind key unchanged — so a running capture never has its start position changed under it.
What show reads and how a rewind's generation passes every filter: docs/capture.md ("Rewinding
or skipping").
"""
from __future__ import annotations

import argparse
import json
import time
from typing import Any

import grpc

from sluice.core import errors
from sluice.core.position import format_position, is_empty, max_position, parse_position
from sluice.core.registry import ALIVE, NodeKind, NodeState, rewind_path
from sluice.core.rewind import read_rewind
from sluice.drainer.checkpoint import read_checkpoint
from sluice.proto import sluice_pb2 as pb
from sluice.proto import sluice_pb2_grpc as pbg

from . import render
from .context import Ctx, rpc_error


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("position", parents=[common],
                       help="show a capture's source position, or set where it resumes")
    psub = p.add_subparsers(dest="position_cmd", metavar="show|set", required=True)
    s = psub.add_parser("show", parents=[common],
                        help="recorded positions per pump, pending rewind, drainers' applied ones")
    s.add_argument("producer", metavar="PRODUCER", help="producer id (the capture's producer-id)")
    s.set_defaults(func=show)
    s = psub.add_parser("set", parents=[common],
                        help="resume the (stopped) capture strictly after POSITION at its next start")
    s.add_argument("producer", metavar="PRODUCER", help="producer id (the capture's producer-id)")
    s.add_argument("position", metavar="POSITION",
                   help="a GTID state such as 0-1-99[,1-2-5], or `ctl position show` output "
                        "(e.g. 'mysql-bin.000042:1234#0 gtid=0-1-99')")
    s.set_defaults(func=set_position)


def _pump_positions(ctx: Ctx, producer_id: str) -> list[dict[str, Any]]:
    pumps, _ = ctx.registry.list(NodeKind.PUMP)
    out = []
    for info in pumps:
        if info.state == NodeState.OFFLINE:
            continue
        row: dict[str, Any] = {"pump": info.node_id, "addr": info.status.addr}
        try:
            resp = pbg.PumpStub(ctx.channel(info.status.addr)).GetProducerPosition(
                pb.GetProducerPositionReq(cluster_id=ctx.cluster_id, producer_id=producer_id,
                                          peek=True), timeout=ctx.config.timeout)
        except grpc.RpcError as e:
            row["error"] = str(rpc_error(f"pump {info.node_id} at {info.status.addr}: "
                                         "GetProducerPosition", e))
        else:
            row["epoch"] = resp.epoch
            row["position"] = resp.position if resp.has_position else None
        out.append(row)
    return out


def show(ctx: Ctx, args: argparse.Namespace) -> int:
    producer = args.producer
    info = ctx.registry.get(NodeKind.PRODUCER, producer)
    rows = _pump_positions(ctx, producer)
    if info is None and not any(r.get("position") for r in rows):
        ctx.node(NodeKind.PRODUCER, producer)   # NotFound listing the known producers
    resumes = max_position(r["position"] for r in rows if r.get("position") is not None)
    rewind, _ = read_rewind(ctx.registry, producer)
    drainers, _ = ctx.registry.list(NodeKind.DRAINER)
    applied = []
    for d in drainers:
        cp = read_checkpoint(ctx.registry, d.node_id)
        if cp is not None and producer in cp.positions:
            applied.append({"drainer": d.node_id, "position": cp.positions[producer]})
    failed = any("error" in r for r in rows)
    if ctx.json:
        render.emit_json(ctx.out, {
            "producer": producer, "alive": bool(info and info.alive),
            "epoch": info.status.epoch if info is not None else None,
            "pumps": [{**r, "position": format_position(r["position"])
                       if r.get("position") is not None else None} for r in rows],
            "resumes_after": format_position(resumes),
            "pending_rewind": format_position(rewind) if rewind is not None else None,
            "drainers": applied})
        return 1 if failed else 0
    alive = "alive" if info is not None and info.alive else "not alive"
    ctx.print(f"producer {producer} ({alive}"
              + (f", epoch {info.status.epoch})" if info is not None else ", not registered)"))
    ctx.print(render.table(["pump", "position", "epoch"], [
        [r["pump"], f"error: {r['error']}" if "error" in r else
         format_position(r["position"]) if r["position"] is not None else "none",
         str(r.get("epoch", ""))] for r in rows]))
    ctx.print(f"resumes after   {format_position(resumes)}")
    if rewind is not None:
        ctx.print(f"pending rewind  {format_position(rewind)} (taken at the capture's next start)")
    for a in applied:
        ctx.print(f"drainer {a['drainer']} applied up to {a['position']}")
    return 1 if failed else 0


def set_position(ctx: Ctx, args: argparse.Namespace) -> int:
    producer = args.producer
    want = parse_position(args.position)
    if is_empty(want) or not want.gtids:
        raise errors.InvalidArgument(
            f"position {args.position!r} has no MariaDB GTID state: the capture resumes by GTID, "
            "give one such as 0-1-99 (domain-server-seq per domain)")
    if want.generation:
        raise errors.InvalidArgument(f"position {args.position!r} sets gen=: ctl picks the "
                                     "generation itself, leave it out")
    info = ctx.node(NodeKind.PRODUCER, producer)
    if info.alive:
        raise errors.FailedPrecondition(
            f"producer {producer} is alive: stop the capture first (its position is only read "
            "at start)")
    rows = _pump_positions(ctx, producer)
    bad = [r for r in rows if "error" in r]
    if bad:
        raise errors.Unavailable(f"cannot read every pump's recorded generation: {bad[0]['error']}")
    registry = ctx.registry
    pending, rev = read_rewind(registry, producer)
    gens = [r["position"].generation for r in rows if r.get("position") is not None]
    if pending is not None:
        gens.append(pending.generation)
    doc = {"position": format_position(want), "generation": max(gens, default=0) + 1,
           "set_at_ms": int(time.time() * 1000)}
    want.generation = doc["generation"]
    etcd, key = registry.etcd, registry.cluster_key(rewind_path(producer))
    tx = etcd.tx
    alive_key = registry.key(NodeKind.PRODUCER, producer, ALIVE)
    cond = [tx.version(alive_key) == 0,
            tx.version(key) == 0 if rev == 0 else tx.mod(key) == rev]
    ok, _ = etcd.txn(cond, [tx.put(key, json.dumps(doc, sort_keys=True))])
    if not ok:
        raise errors.FailedPrecondition(
            f"producer {producer} came alive, or its rewind changed, while setting it: nothing "
            "written; stop the capture and run the command again")
    if ctx.json:
        render.emit_json(ctx.out, {"producer": producer, "position": format_position(want),
                                   "generation": want.generation})
    else:
        ctx.print(f"producer {producer}: the next start resumes after {format_position(want)}")
    return 0
