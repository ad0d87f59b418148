"""`sluice ctl checkpoint show|set`: a drainer's checkpoint in etcd (drainer/checkpoint.py's key).

Invariant: ctl writes a drainer's checkpoint only while that drainer is not alive — the write is
one etcd transaction conditioned on the drainer's alive key being absent (and on the checkpoint
and status keys not having changed since they were read), so a drainer starting at the same
moment either sees the new checkpoint or makes the write fail; it is never overwritten unseen.

A set is a deliberate rewind or skip (DESIGN §2.9): it replaces the per-producer positions with
the ones given (none by default, which resets the drainer's per-producer filter), keeps the sink
state and schema history, raises `dispatched_upper` to at least the old checkpoint so a rewound
drainer replays in safe mode (idempotent) up to where it had been, and mirrors the new commit ts
into the drainer's status (what pumps' GC reads).
"""
from __future__ import annotations

import argparse
import dataclasses

from sluice.core import errors
from sluice.core import ts as tsmod
from sluice.core.position import parse_position
from sluice.core.registry import ALIVE, STATUS, NodeKind, NodeStatus
from sluice.drainer.checkpoint import encode_positions, read_checkpoint
from sluice.drainer.sink import Checkpoint

from . import render
from .context import Ctx
from .txns import ts_arg

CAS_ATTEMPTS = 20


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("checkpoint", parents=[common], help="show or set a drainer's checkpoint")
    csub = p.add_subparsers(dest="checkpoint_cmd", metavar="show|set", required=True)
    s = csub.add_parser("show", parents=[common], help="show a drainer's checkpoint")
    s.add_argument("name", metavar="NAME", help="drainer name (node id)")
    s.set_defaults(func=show)
    s = csub.add_parser("set", parents=[common],
                        help="set a drainer's checkpoint (the drainer must not be alive)")
    s.add_argument("name", metavar="NAME", help="drainer name (node id)")
    s.add_argument("--commit-ts", type=ts_arg, required=True, metavar="TS",
                   help="everything with commit ts <= TS counts as applied; the drainer "
                        "resumes after it")
    s.add_argument("--position", action="append", default=[], metavar="PRODUCER=POS",
                   help="a producer's last applied position (repeatable); the others are reset")
    s.set_defaults(func=set_checkpoint)


def _doc(name: str, cp: Checkpoint, status: NodeStatus | None, alive: bool) -> dict[str, object]:
    return {
        "name": name, "commit_ts": cp.commit_ts, "commit_time": render.ts_time(cp.commit_ts),
        "lag_seconds": round(tsmod.lag_seconds(cp.commit_ts), 3),
        "positions": dict(sorted(cp.positions.items())), "sink_state": cp.sink_state,
        "dispatched_upper": cp.dispatched_upper,
        "schema_bytes": len(cp.schema) if cp.schema is not None else 0,
        "status_checkpoint": status.checkpoint if status is not None else None,
        "drainer_state": status.state.value if status is not None else None,
        "alive": alive,
    }


def show(ctx: Ctx, args: argparse.Namespace) -> int:
    name = args.name
    info = ctx.registry.get(NodeKind.DRAINER, name)
    cp = read_checkpoint(ctx.registry, name)
    if cp is None:
        if info is None:
            ctx.node(NodeKind.DRAINER, name)   # raises NotFound listing the known drainers
        assert info is not None
        raise errors.NotFound(f"drainer {name!r} has no checkpoint in etcd yet (its status says "
                              f"checkpoint {info.status.checkpoint}); it starts from its "
                              "initial-commit-ts")
    status = info.status if info is not None else None
    alive = bool(info and info.alive)
    if ctx.json:
        render.emit_json(ctx.out, _doc(name, cp, status, alive))
        return 0
    ctx.print(f"drainer {name}" + (f" ({status.state.value}, alive: {'yes' if alive else 'no'})"
                                   if status is not None else " (not registered)"))
    ctx.print(f"  commit ts         {render.ts_text(cp.commit_ts)}, lag "
              f"{render.duration(tsmod.lag_seconds(cp.commit_ts))}")
    if status is not None and status.checkpoint != cp.commit_ts:
        ctx.print(f"  status mirror     {render.ts_text(status.checkpoint)} (differs: the drainer "
                  "writes it right after the checkpoint)")
    ctx.print(f"  dispatched upper  {render.ts_text(cp.dispatched_upper)}")
    ctx.print(f"  schema history    {len(cp.schema) if cp.schema is not None else 0} bytes")
    ctx.print(f"  sink state        {render.json_inline(cp.sink_state)}")
    if cp.positions:
        ctx.print(render.table(["  PRODUCER", "POSITION"],
                               [[f"  {k}", v] for k, v in sorted(cp.positions.items())]))
    else:
        ctx.print("  positions         none")
    return 0


def _parse_positions(items: list[str]) -> dict[str, str]:
    positions = {}
    for item in items:
        producer, eq, text = item.partition("=")
        if not eq or not producer.strip():
            raise errors.InvalidArgument(f"--position {item!r}: want PRODUCER=POSITION, e.g. "
                                         "capture-1='mysql-bin.000042:1234#0'")
        producer = producer.strip()
        if producer in positions:
            raise errors.InvalidArgument(f"--position: producer {producer!r} given twice")
        positions[producer] = parse_position(text)
    return encode_positions(positions)


def set_checkpoint(ctx: Ctx, args: argparse.Namespace) -> int:
    name, commit_ts = args.name, args.commit_ts
    positions = _parse_positions(args.position)
    reg = ctx.registry
    etcd = reg.etcd
    tx = etcd.tx
    cp_key = reg.drainer_checkpoint_key(name)
    alive_key = reg.key(NodeKind.DRAINER, name, ALIVE)
    status_key = reg.key(NodeKind.DRAINER, name, STATUS)
    for _ in range(CAS_ATTEMPTS):
        info = reg.get(NodeKind.DRAINER, name)
        if info is not None and info.alive:
            raise errors.FailedPrecondition(
                f"drainer {name} is alive: a running drainer overwrites its checkpoint at its "
                f"next save; pause it (`sluice ctl pause-drainer {name} --wait`) and stop its "
                "process, or wait until its alive key expires, then set the checkpoint")
        raw, meta = etcd.get(cp_key)
        old = Checkpoint.from_json(raw) if raw is not None else None
        new = Checkpoint(
            commit_ts=commit_ts, positions=positions,
            sink_state=old.sink_state if old else {}, schema=old.schema if old else None,
            dispatched_upper=max(old.dispatched_upper, old.commit_ts) if old else 0)
        compare = [tx.version(alive_key) == 0,
                   tx.version(cp_key) == 0 if raw is None else tx.mod(cp_key) == meta.mod_revision]
        puts = [tx.put(cp_key, new.to_json())]
        if info is not None:
            st = dataclasses.replace(info.status, checkpoint=commit_ts,
                                     update_ts=max(tsmod.now_ts(), info.status.update_ts + 1))
            compare.append(tx.mod(status_key) == info.mod_revision)
            puts.append(tx.put(status_key, st.to_json()))
        else:
            compare.append(tx.version(status_key) == 0)
        ok, _ = etcd.txn(compare, puts)
        if ok:
            break
    else:
        raise errors.Unavailable(f"drainer {name}: its keys kept changing under {CAS_ATTEMPTS} "
                                 "attempts to set the checkpoint; is it running?")
    if info is None:
        ctx.warn(f"no drainer {name!r} is registered in cluster {ctx.cluster_id} yet: it starts "
                 "from this checkpoint when it first runs with that name")
    if ctx.json:
        render.emit_json(ctx.out, _doc(name, new, reg.get(NodeKind.DRAINER, name).status
                                       if info is not None else None, False))
    else:
        before = render.ts_text(old.commit_ts) if old else "none"
        ctx.print(f"drainer {name}: checkpoint {before} -> {render.ts_text(commit_ts)}; "
                  f"positions {'set for ' + ', '.join(sorted(positions)) if positions else 'reset'}")
    return 0
