"""`sluice ctl txn-status` / `resolve-txn`: look at, and force, the fate of a prewrite.

Invariant: one transaction, one commit_ts (DESIGN §2.5) — resolve-txn writes a decision only on
pumps where the prewrite is still unresolved, and refuses (changing nothing) when any reachable
pump already holds a different decision for that start_ts. Without an explicit `--commit-ts` or
`--rollback` it takes the producer's answer (Producer.TxnStatus) and refuses when the producer
says unknown: ctl never guesses.

Asking a producer is not read-only: TxnStatus decides by writing (DESIGN §5), so a transaction
the producer had not decided yet is decided (rolled back) by the question.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import grpc

from sluice.core import errors
from sluice.core.registry import NodeInfo, NodeKind, NodeState
from sluice.proto import sluice_pb2 as pb
from sluice.proto import sluice_pb2_grpc as pbg

from . import render
from .context import Ctx, exit_code, rpc_error

STATE_NAMES = {
    pb.TXN_UNKNOWN: "unknown",
    pb.TXN_COMMITTED: "committed",
    pb.TXN_ROLLED_BACK: "rolled back",
    pb.TXN_NOT_FOUND: "not found",
    pb.TXN_STATE_UNSPECIFIED: "unspecified",
}


def ts_arg(text: str) -> int:
    """argparse type for a TSO timestamp: a positive integer."""
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad ts {text!r}: want a positive integer "
                                         "(a TSO timestamp)") from None
    if value <= 0 or value >= 1 << 63:
        raise argparse.ArgumentTypeError(f"bad ts {text!r}: want 1 .. 2^63-1")
    return value


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("txn-status", parents=[common],
                       help="what every pump and the producer know about a transaction")
    _add_start_ts(p)
    p.add_argument("--producer", help="producer id to ask (default: the only registered one)")
    p.add_argument("--pumps-only", action="store_true",
                   help="do not ask the producer (asking makes an undecided producer decide)")
    p.set_defaults(func=txn_status)

    p = sub.add_parser("resolve-txn", parents=[common],
                       help="commit or roll back an unresolved prewrite on the pumps holding it")
    _add_start_ts(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--commit-ts", type=ts_arg, metavar="TS", help="commit it at this commit_ts")
    g.add_argument("--rollback", action="store_true", help="roll it back")
    p.add_argument("--producer", help="producer to ask when no decision is given "
                                      "(default: the only registered one)")
    p.set_defaults(func=resolve_txn)


def _add_start_ts(p: argparse.ArgumentParser) -> None:
    # Positional, or --start-ts (the spelling pump log lines suggest); exactly one of them.
    p.add_argument("start_ts", type=ts_arg, metavar="START_TS", nargs="?")
    p.add_argument("--start-ts", type=ts_arg, dest="start_ts_flag", metavar="START_TS",
                   help=argparse.SUPPRESS)


def start_ts_of(args: argparse.Namespace) -> int:
    pos, flag = args.start_ts, getattr(args, "start_ts_flag", None)
    if pos is not None and flag is not None and pos != flag:
        raise errors.InvalidArgument(f"two different start ts given: {pos} and --start-ts {flag}")
    value = pos if pos is not None else flag
    if value is None:
        raise errors.InvalidArgument("START_TS is required (the transaction's start ts)")
    return value


@dataclass(frozen=True)
class PumpAnswer:
    node_id: str
    addr: str
    state: int | None = None       # pb.TxnState; None when the pump did not answer
    commit_ts: int = 0
    error: str = ""
    fail_code: int = 1             # with error: 2 when the pump refused the request itself

    def text(self) -> str:
        if self.error:
            return f"error: {self.error}"
        assert self.state is not None
        if self.state == pb.TXN_COMMITTED:
            return f"committed at {render.ts_text(self.commit_ts)}"
        if self.state == pb.TXN_UNKNOWN:
            return "unknown (prewrite held here, unresolved)"
        if self.state == pb.TXN_NOT_FOUND:
            return "not found (no prewrite here)"
        return STATE_NAMES.get(self.state, str(self.state))

    def to_dict(self) -> dict[str, object]:
        return {"pump": self.node_id, "addr": self.addr,
                "state": STATE_NAMES.get(self.state, "") if self.state is not None else None,
                "commit_ts": self.commit_ts, "error": self.error or None}


@dataclass(frozen=True)
class Decision:
    commit_ts: int | None       # None: roll back
    source: str                 # who decided: "--commit-ts", "--rollback", "producer p1"

    def text(self) -> str:
        what = (f"commit at {render.ts_text(self.commit_ts)}" if self.commit_ts is not None
                else "roll back")
        return f"{what} (from {self.source})"


def ask_pumps(ctx: Ctx, start_ts: int) -> list[PumpAnswer]:
    """GetCommit(start_ts) on every non-offline pump; unreachable ones carry an error."""
    pumps, _ = ctx.registry.list(NodeKind.PUMP)
    out = []
    for info in pumps:
        if info.state == NodeState.OFFLINE:
            continue
        out.append(_get_commit(ctx, info.node_id, info.status.addr, start_ts))
    return out


def _get_commit(ctx: Ctx, node_id: str, addr: str, start_ts: int) -> PumpAnswer:
    try:
        resp = pbg.PumpStub(ctx.channel(addr)).GetCommit(
            pb.GetCommitReq(cluster_id=ctx.cluster_id, start_ts=start_ts),
            timeout=ctx.config.timeout)
    except grpc.RpcError as e:
        err = rpc_error(f"pump {node_id} at {addr}: GetCommit", e)
        return PumpAnswer(node_id, addr, error=str(err))
    return PumpAnswer(node_id, addr, resp.state, resp.commit_ts)


def pick_producer(ctx: Ctx, producer_id: str | None) -> NodeInfo | None:
    """The producer to ask: the named one (NotFound if unknown), else the only non-offline one."""
    if producer_id:
        return ctx.node(NodeKind.PRODUCER, producer_id)
    producers, _ = ctx.registry.list(NodeKind.PRODUCER)
    live = [p for p in producers if p.state != NodeState.OFFLINE and p.status.addr]
    return live[0] if len(live) == 1 else None


def producer_candidates(ctx: Ctx) -> list[str]:
    producers, _ = ctx.registry.list(NodeKind.PRODUCER)
    return [p.node_id for p in producers if p.state != NodeState.OFFLINE and p.status.addr]


def ask_producer(ctx: Ctx, info: NodeInfo, start_ts: int) -> pb.TxnStatusResp:
    addr = info.status.addr
    if not addr:
        raise errors.FailedPrecondition(f"producer {info.node_id} has no registered address")
    try:
        return pbg.ProducerStub(ctx.channel(addr)).TxnStatus(
            pb.TxnStatusReq(cluster_id=ctx.cluster_id, start_ts=start_ts),
            timeout=ctx.config.timeout)
    except grpc.RpcError as e:
        raise rpc_error(f"producer {info.node_id} at {addr}: TxnStatus", e) from None


def txn_status(ctx: Ctx, args: argparse.Namespace) -> int:
    start_ts = start_ts_of(args)
    answers = ask_pumps(ctx, start_ts)
    producer_doc: dict[str, object] = {"asked": False}
    producer_line = ""
    failed = any(a.error for a in answers)
    if not args.pumps_only:
        info = pick_producer(ctx, args.producer)
        if info is None:
            cands = producer_candidates(ctx)
            why = ("none registered" if not cands else
                   f"{len(cands)} registered ({', '.join(cands)}): pass --producer")
            producer_line = f"producer: not asked ({why})"
            producer_doc["reason"] = why
        else:
            producer_doc.update(producer=info.node_id, addr=info.status.addr)
            try:
                resp = ask_producer(ctx, info, start_ts)
            except errors.SluiceError as e:
                failed = True
                producer_doc["error"] = str(e)
                producer_line = f"producer {info.node_id}: error: {e}"
            else:
                producer_doc.update(asked=True, state=STATE_NAMES.get(resp.state, str(resp.state)),
                                    commit_ts=resp.commit_ts)
                what = STATE_NAMES.get(resp.state, str(resp.state))
                if resp.state == pb.TXN_COMMITTED:
                    what += f" at {render.ts_text(resp.commit_ts)}"
                producer_line = f"producer {info.node_id} at {info.status.addr}: {what}"
    else:
        producer_line = "producer: not asked (--pumps-only)"
        producer_doc["reason"] = "--pumps-only"
    if ctx.json:
        render.emit_json(ctx.out, {"start_ts": start_ts, "start_time": render.ts_time(start_ts),
                                   "pumps": [a.to_dict() for a in answers],
                                   "producer": producer_doc})
    else:
        ctx.print(f"start_ts {render.ts_text(start_ts)}")
        if answers:
            ctx.print(render.table(["PUMP", "ADDRESS", "ANSWER"],
                                   [[a.node_id, a.addr, a.text()] for a in answers]))
        else:
            ctx.print("no pump that is not offline is registered")
        ctx.print(producer_line)
    for a in answers:
        if a.error:
            ctx.err.write(f"sluice ctl: {a.error}\n")
    if "error" in producer_doc:
        ctx.err.write(f"sluice ctl: {producer_doc['error']}\n")
    return 1 if failed else 0


def decide(ctx: Ctx, args: argparse.Namespace, start_ts: int) -> Decision:
    if args.commit_ts is not None:
        if args.commit_ts <= start_ts:
            raise errors.InvalidArgument(f"commit ts {args.commit_ts} must be greater than "
                                         f"start ts {start_ts}")
        return Decision(args.commit_ts, "--commit-ts")
    if args.rollback:
        return Decision(None, "--rollback")
    info = pick_producer(ctx, args.producer)
    if info is None:
        cands = producer_candidates(ctx)
        raise errors.FailedPrecondition(
            f"no decision given and no single producer to ask ("
            + ("none registered" if not cands else f"registered: {', '.join(cands)}")
            + "): pass --producer ID, or decide with --commit-ts TS or --rollback")
    resp = ask_producer(ctx, info, start_ts)
    source = f"producer {info.node_id}"
    if resp.state == pb.TXN_COMMITTED:
        if resp.commit_ts <= start_ts:
            raise errors.SluiceError(f"producer {info.node_id} says start_ts {start_ts} "
                                     f"committed at {resp.commit_ts}, which is not after it: "
                                     "refusing to write it")
        return Decision(resp.commit_ts, source)
    if resp.state == pb.TXN_ROLLED_BACK:
        return Decision(None, source)
    raise errors.FailedPrecondition(
        f"producer {info.node_id} says start_ts {start_ts} is "
        f"{STATE_NAMES.get(resp.state, str(resp.state))}: refusing to guess; decide with "
        "--commit-ts TS or --rollback")


def _agrees(a: PumpAnswer, d: Decision) -> bool:
    if d.commit_ts is None:
        return a.state == pb.TXN_ROLLED_BACK
    return a.state == pb.TXN_COMMITTED and a.commit_ts == d.commit_ts


def resolve_txn(ctx: Ctx, args: argparse.Namespace) -> int:
    start_ts = start_ts_of(args)
    decision = decide(ctx, args, start_ts)
    answers = ask_pumps(ctx, start_ts)
    decided = [a for a in answers if a.state in (pb.TXN_COMMITTED, pb.TXN_ROLLED_BACK)]
    conflicts = [a for a in decided if not _agrees(a, decision)]
    if conflicts:
        raise errors.FailedPrecondition(
            f"start_ts {start_ts}: refusing to {decision.text()}: "
            + "; ".join(f"pump {a.node_id} already has it {a.text()}" for a in conflicts)
            + " (one transaction has one commit ts); nothing was changed")
    pending = [a for a in answers if a.state == pb.TXN_UNKNOWN]
    unreachable = [a for a in answers if a.error]
    if not pending and not decided and not unreachable:
        raise errors.NotFound(f"no pump holds a prewrite with start_ts {start_ts} "
                              f"(asked {', '.join(a.node_id for a in answers) or 'no pump'})")
    results: list[PumpAnswer] = []
    for a in answers:
        if a.state == pb.TXN_UNKNOWN:
            results.append(_resolve_one(ctx, a, start_ts, decision))
        else:
            results.append(a)
    failed = [r for r in results if r.error]
    if ctx.json:
        render.emit_json(ctx.out, {
            "start_ts": start_ts, "decision": {
                "commit_ts": decision.commit_ts, "rollback": decision.commit_ts is None,
                "source": decision.source},
            "resolved": [r.node_id for r, a in zip(results, answers)
                         if a.state == pb.TXN_UNKNOWN and not r.error],
            "pumps": [r.to_dict() for r in results]})
    else:
        ctx.print(f"start_ts {render.ts_text(start_ts)}: {decision.text()}")
        rows = []
        for r, a in zip(results, answers):
            if a.state == pb.TXN_UNKNOWN and not r.error:
                note = f"resolved: {r.text()}"
            elif a.state in (pb.TXN_COMMITTED, pb.TXN_ROLLED_BACK):
                note = f"already {r.text()}"
            else:
                note = r.text()
            rows.append([r.node_id, r.addr, note])
        ctx.print(render.table(["PUMP", "ADDRESS", "RESULT"], rows))
        if failed:
            ctx.print("some pumps were not resolved (see above); the command is safe to rerun")
    for r in failed:
        ctx.err.write(f"sluice ctl: {r.error}\n")
    return max((r.fail_code for r in failed), default=0)


def _resolve_one(ctx: Ctx, a: PumpAnswer, start_ts: int, d: Decision) -> PumpAnswer:
    req = pb.ResolveTxnReq(cluster_id=ctx.cluster_id, start_ts=start_ts)
    if d.commit_ts is None:
        req.rollback = True
    else:
        req.commit_ts = d.commit_ts
    try:
        resp = pbg.PumpStub(ctx.channel(a.addr)).ResolveTxn(req, timeout=ctx.config.timeout)
    except grpc.RpcError as e:
        err = rpc_error(f"pump {a.node_id} at {a.addr}: ResolveTxn", e)
        if e.code() == grpc.StatusCode.ALREADY_EXISTS:
            # Resolved meanwhile (the pump asked the producer itself): report what it holds.
            now = _get_commit(ctx, a.node_id, a.addr, start_ts)
            if not now.error and _agrees(now, d):
                return now
        return PumpAnswer(a.node_id, a.addr, error=str(err), fail_code=exit_code(err))
    return PumpAnswer(a.node_id, a.addr, resp.state,
                      d.commit_ts if resp.state == pb.TXN_COMMITTED and d.commit_ts else 0)

