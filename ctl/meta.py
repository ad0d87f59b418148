"""`sluice ctl tso` and `generate-meta`: fresh timestamps from the TSO leader (binlogctl's meta).

Invariant: the ts printed or written is a fresh one from the current TSO leader (found through
etcd), never a local clock reading — so a drainer started at `initial-commit-ts` = that ts after a
full dump misses no transaction committed after the dump's snapshot was taken.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from sluice.core import errors
from sluice.core import ts as tsmod
from sluice.core.registry import tso_leader_key
from sluice.core.tso_client import TSOClient, read_leader

from . import render
from .context import Ctx

SAVEPOINT = "savepoint"


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("tso", parents=[common], help="a fresh timestamp from the TSO leader")
    p.set_defaults(func=tso)
    p = sub.add_parser("generate-meta", parents=[common],
                       help="the initial commit ts for a drainer starting after a full dump")
    p.add_argument("--data-dir", help=f"also write it to DIR/{SAVEPOINT} (TOML)")
    p.set_defaults(func=generate_meta)


def fresh_ts(ctx: Ctx) -> int:
    # Read the leader here rather than inside the client: the client retries a failed etcd
    # lookup until its deadline and then blames the TSO, while "etcd is down" is the real story.
    leader = read_leader(ctx.etcd, ctx.cluster_id)
    if leader is None:
        raise errors.Unavailable(f"no TSO leader registered in cluster {ctx.cluster_id} (etcd key "
                                 f"{tso_leader_key(ctx.cluster_id)}): is a `sluice tso` running?")

    async def one() -> int:
        client = TSOClient([leader.addr], ctx.cluster_id, etcd=ctx.etcd,
                           security=ctx.config.security, deadline_s=ctx.config.timeout)
        try:
            return await client.get_ts()
        finally:
            await client.close()
    # asyncio.run, not SyncTSOClient: it also finishes gRPC's internal tasks before closing the
    # loop, so nothing complains about pending tasks on stderr after the answer.
    return asyncio.run(one())


def _ts_doc(t: int) -> dict[str, object]:
    return {"ts": t, "physical_ms": tsmod.physical_ms(t), "logical": tsmod.logical(t),
            "time": render.ts_time(t)}


def tso(ctx: Ctx, args: argparse.Namespace) -> int:
    t = fresh_ts(ctx)
    if ctx.json:
        render.emit_json(ctx.out, _ts_doc(t))
    else:
        ctx.print(f"{t}  {render.ts_time(t)}  (physical {tsmod.physical_ms(t)} ms, logical "
                  f"{tsmod.logical(t)})")
    return 0


def write_savepoint(data_dir: Path, t: int) -> Path:
    """Write DIR/savepoint atomically (temp file, fsync, rename, fsync dir)."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        path = data_dir / SAVEPOINT
        text = (f"# written by `sluice ctl generate-meta` at "
                f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n"
                f"# start a drainer here with: sluice drainer --set initial-commit-ts={t}\n"
                f"initial-commit-ts = {t}\n"
                f"# {render.ts_time(t)}\n")
        fd, tmp = tempfile.mkstemp(prefix=f".{SAVEPOINT}.", dir=data_dir)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dfd = os.open(data_dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return path
    except OSError as e:
        raise errors.InvalidArgument(f"--data-dir {data_dir}: cannot write {SAVEPOINT}: "
                                     f"{e.strerror}") from None


def generate_meta(ctx: Ctx, args: argparse.Namespace) -> int:
    t = fresh_ts(ctx)
    path = write_savepoint(Path(args.data_dir), t) if args.data_dir else None
    if ctx.json:
        doc = _ts_doc(t)
        doc["initial_commit_ts"] = t
        doc["savepoint"] = str(path) if path else None
        render.emit_json(ctx.out, doc)
    else:
        ctx.print(f"initial-commit-ts = {t}  # {render.ts_time(t)}")
        if path is not None:
            ctx.print(f"wrote {path}")
    return 0
