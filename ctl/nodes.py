"""`sluice ctl` node commands: list pumps, drainers and producers; change their states.

Invariant: ctl changes a node's state only along a legal transition (registry LEGAL_TRANSITIONS,
compare-and-swap) unless `--force` is given, and never takes a pump out of the merge silently:
`mark-lost` on a cluster with replicas=1 requires `--force` and says that the binlogs not yet
drained from that pump are lost.

ctl only writes the requested state (pausing, closing); the node itself finishes the transition
(a pump once nothing on it is unresolved, publishing its final max commit ts; a drainer once it
stopped pulling) — `--wait` follows it there.
"""
from __future__ import annotations

import argparse
import dataclasses
import time

from sluice.core import errors
from sluice.core.registry import (CONFIG_PATH, LEGAL_TRANSITIONS, STANDBY_SEGMENT, NodeInfo,
                                  NodeKind, NodeState, NodeStatus)

from . import render
from .context import SINGULAR, Ctx

# The state a node reaches by itself after ctl asked for the transient one.
FINAL = {NodeState.PAUSING: NodeState.PAUSED, NodeState.CLOSING: NodeState.OFFLINE}
WAIT_POLL_S = 0.2
LOST_LABEL = "lost"


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    for kind in (NodeKind.PUMP, NodeKind.DRAINER, NodeKind.PRODUCER):
        p = sub.add_parser(kind.value, parents=[common], help=f"list the {kind.value}")
        p.set_defaults(func=_lister(kind))
    for kind in (NodeKind.PUMP, NodeKind.DRAINER, NodeKind.PRODUCER):
        s = SINGULAR[kind]
        # Producers have no pause/offline protocol: only update-producer (e.g. --force back
        # online after a mistaken offline).
        for verb, state, what in ((("pause", NodeState.PAUSING, "paused"),
                                   ("offline", NodeState.CLOSING, "offline"))
                                  if kind != NodeKind.PRODUCER else ()):
            p = sub.add_parser(f"{verb}-{s}", parents=[common],
                               help=f"ask a {s} to become {what} (sets {state.value})")
            p.add_argument("node_id", metavar="ID")
            _add_wait(p)
            p.set_defaults(func=_state_changer(kind, state), force=False)
        p = sub.add_parser(f"update-{s}", parents=[common], help=f"set a {s}'s state")
        p.add_argument("node_id", metavar="ID")
        p.add_argument("--state", required=True, choices=[st.value for st in NodeState])
        p.add_argument("--force", action="store_true",
                       help="allow an illegal transition (prints a warning)")
        _add_wait(p)
        p.set_defaults(func=_state_changer(kind, None))
    p = sub.add_parser("mark-lost", parents=[common],
                       help="take a dead pump out of every drainer's merge (offline + lost label)")
    p.add_argument("node_id", metavar="ID")
    p.add_argument("--force", action="store_true",
                   help="also when it loses data (replicas=1) or the pump is still alive")
    p.set_defaults(func=mark_lost)


def _add_wait(p: argparse.ArgumentParser) -> None:
    p.add_argument("--wait", action="store_true",
                   help="wait until the node reaches the final state (paused / offline)")
    p.add_argument("--wait-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="give up waiting after this long (exit 1); default 60")


def _lister(kind: NodeKind):  # type: ignore[no-untyped-def]
    return lambda ctx, args: list_nodes(ctx, kind)


def _state_changer(kind: NodeKind, state: NodeState | None):  # type: ignore[no-untyped-def]
    def run(ctx: Ctx, args: argparse.Namespace) -> int:
        target = state or NodeState(args.state)
        return change_state(ctx, kind, args.node_id, target, force=args.force, wait=args.wait,
                            wait_timeout=args.wait_timeout)
    return run


def list_nodes(ctx: Ctx, kind: NodeKind) -> int:
    nodes, _ = ctx.registry.list(kind)
    waiting = live_standbys(ctx) if kind == NodeKind.DRAINER else {}
    # The `standby` label is written by the active instance, so it is stale (or missing) exactly
    # when an operator needs it most: after the active one died. Show the live standby keys.
    nodes = [_with_standbys(n, waiting.pop(n.node_id, [])) if kind == NodeKind.DRAINER else n
             for n in nodes]
    if ctx.json:
        rows = [render.node_dict(n) for n in nodes]
        rows += [{"node_id": name, "kind": kind.value, "state": None, "alive": False,
                  "standbys": addrs} for name, addrs in sorted(waiting.items())]
        render.emit_json(ctx.out, rows)
    else:
        ctx.print(render.nodes_table(kind, nodes))
        for name, addrs in sorted(waiting.items()):
            ctx.print(f"drainer {name}: no active instance yet; standbys waiting at {', '.join(addrs)}")
    return 0


def live_standbys(ctx: Ctx) -> dict[str, list[str]]:
    """Drainer name -> addresses of its standbys whose lease-backed keys exist now."""
    prefix = ctx.registry.kind_prefix(NodeKind.DRAINER)
    kvs, _ = ctx.registry.etcd.get_prefix(prefix)
    out: dict[str, list[str]] = {}
    for _, meta in kvs:
        name, sep, addr = meta.key.decode()[len(prefix):].partition(f"/{STANDBY_SEGMENT}/")
        if sep and addr:
            out.setdefault(name, []).append(addr)
    return {k: sorted(v) for k, v in out.items()}


def _with_standbys(info: NodeInfo, addrs: list[str]) -> NodeInfo:
    labels = {k: v for k, v in info.status.labels.items() if k != "standby"}
    if addrs:
        labels["standby"] = ",".join(addrs)
    return dataclasses.replace(info, status=dataclasses.replace(info.status, labels=labels))


def change_state(ctx: Ctx, kind: NodeKind, node_id: str, state: NodeState, force: bool = False,
                 wait: bool = False, wait_timeout: float = 60.0) -> int:
    s = SINGULAR[kind]
    info = ctx.node(kind, node_id)
    old = info.state
    final = FINAL.get(state)
    if final is not None and old == final and not force:
        # Asking a paused pump to pause (an offline one to go offline) is done, not illegal.
        if ctx.json:
            d = render.node_dict(info)
            d["previous_state"] = old.value
            render.emit_json(ctx.out, d)
        else:
            ctx.print(f"{s} {node_id}: already {old.value}")
        return 0
    legal = old == state or state in LEGAL_TRANSITIONS[old]
    if not legal and not force:
        raise errors.FailedPrecondition(_illegal(s, node_id, old, state))
    if not legal:
        ctx.warn(f"forcing {s} {node_id} from {old.value} to {state.value}, which is not a legal "
                 "transition: the node may not act on it")
    try:
        new = ctx.registry.set_state(kind, node_id, state, force=force)
    except errors.IllegalTransition as e:   # the state changed under us since we read it
        raise errors.FailedPrecondition(
            _illegal(s, node_id, NodeState(e.old), NodeState(e.new))) from None
    except errors.NotFound:
        ctx.node(kind, node_id)   # raises with the list of known ids
        raise
    if final is not None and not info.alive and new.state == state:
        ctx.warn(f"{s} {node_id} is not alive: it becomes {final.value} when it runs again")
    if not ctx.json:
        change = "already " + new.state.value if old == new.state else f"{old.value} -> {new.state.value}"
        ctx.print(f"{s} {node_id}: {change}")
    result = ctx.node(kind, node_id)
    if wait and final is not None:
        result = wait_for_state(ctx, kind, node_id, final, state, wait_timeout)
        if not ctx.json:
            extra = (f" (final max commit ts {render.ts_text(result.status.max_commit_ts)})"
                     if kind == NodeKind.PUMP else "")
            ctx.print(f"{s} {node_id}: {final.value}{extra}")
    if ctx.json:
        d = render.node_dict(result)
        d["previous_state"] = old.value
        render.emit_json(ctx.out, d)
    return 0


def _illegal(s: str, node_id: str, old: NodeState, new: NodeState) -> str:
    legal = ", ".join(sorted(x.value for x in LEGAL_TRANSITIONS[old])) or "none, offline is final"
    return (f"{s} {node_id}: illegal state transition {old.value} -> {new.value} "
            f"(legal from {old.value}: {legal}; --force overrides)")


def wait_for_state(ctx: Ctx, kind: NodeKind, node_id: str, final: NodeState,
                   transient: NodeState, timeout: float) -> NodeInfo:
    """Poll until the node's state is `final`; DeadlineExceeded (exit 1) after timeout."""
    s = SINGULAR[kind]
    deadline = time.monotonic() + timeout
    while True:
        info = ctx.node(kind, node_id)
        if info.state == final:
            return info
        if info.state != transient:
            raise errors.FailedPrecondition(
                f"{s} {node_id} moved to {info.state.value} while waiting for {final.value}")
        if time.monotonic() >= deadline:
            why = ("it is not alive, so nothing finishes the transition until it runs again"
                   if not info.alive else
                   "a pump finishes once no prewrite on it is unresolved (see `sluice ctl "
                   "txn-status`)" if kind == NodeKind.PUMP else
                   "a drainer finishes once it has stopped pulling and saved its checkpoint")
            raise errors.DeadlineExceeded(
                f"{s} {node_id} is still {info.state.value} after {timeout:g}s: {why}")
        time.sleep(WAIT_POLL_S)


def replicas(ctx: Ctx) -> int:
    """The cluster's replicas setting (etcd `config` {"replicas": N}; absent: 1)."""
    value = ctx.registry.get_json(CONFIG_PATH)
    if value is None:
        return 1
    try:
        n = int(value.get("replicas", 1))
    except (AttributeError, TypeError, ValueError):
        raise errors.InvalidArgument(
            f"cluster {ctx.cluster_id} config {ctx.registry.cluster_key(CONFIG_PATH)} is "
            f"unreadable: {value!r} (want {{\"replicas\": N}})") from None
    return max(1, n)


def mark_lost(ctx: Ctx, args: argparse.Namespace) -> int:
    node_id, force = args.node_id, args.force
    info = ctx.node(NodeKind.PUMP, node_id)
    n = replicas(ctx)
    if info.alive and not force:
        raise errors.FailedPrecondition(
            f"pump {node_id} is alive (its heartbeat is current), so it is not lost: take it out "
            f"with `sluice ctl offline-pump {node_id}`, or add --force")
    if n <= 1 and not force:
        raise errors.FailedPrecondition(
            f"pump {node_id}: cluster {ctx.cluster_id} keeps one copy of each binlog "
            "(replicas=1), so marking it lost removes it from every drainer's merge and the "
            f"binlogs on it that no drainer has applied yet are LOST; rerun with --force to "
            "accept that data loss")
    if n <= 1:
        ctx.warn(f"pump {node_id} marked lost with replicas=1: binlogs on it that no drainer has "
                 "applied yet are lost")

    def lost(old: NodeStatus) -> NodeStatus:
        return dataclasses.replace(old, state=NodeState.OFFLINE,
                                   labels={**old.labels, LOST_LABEL: "true"})
    ctx.registry.update(NodeKind.PUMP, node_id, lost, force=True)
    result = ctx.node(NodeKind.PUMP, node_id)
    if ctx.json:
        d = render.node_dict(result)
        d["previous_state"] = info.state.value
        render.emit_json(ctx.out, d)
    else:
        ctx.print(f"pump {node_id}: {info.state.value} -> offline (lost); drainers stop waiting "
                  "for it")
    return 0
