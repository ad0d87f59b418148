"""Output of `sluice ctl`: aligned text tables for people, JSON for scripts.

Invariant: nothing ctl prints reveals a secret — a DSN's password (a producer's
`labels["outbox-dsn"]`) is always masked, in tables and in JSON alike.
"""
from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any, TextIO

from sluice.core import ts as tsmod
from sluice.core.secrets import mask_dsn  # noqa: F401 - re-exported for ctl
from sluice.core.registry import NodeInfo, NodeKind

# Labels whose value is a DSN (may carry a password).
DSN_LABELS = ("outbox-dsn",)



def safe_labels(labels: dict[str, str]) -> dict[str, str]:
    return {k: (mask_dsn(v) if k in DSN_LABELS else v) for k, v in sorted(labels.items())}


def ts_time(ts: int) -> str:
    """A ts's physical time in UTC with milliseconds, e.g. 2024-05-01T12:00:00.123Z ("-" for 0)."""
    if ts <= 0:
        return "-"
    ms = tsmod.physical_ms(ts)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def ts_text(ts: int) -> str:
    """`<ts> (<utc time>)`, or "-" for 0 (never set)."""
    return "-" if ts <= 0 else f"{ts} ({ts_time(ts)})"


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    if seconds < 86400:
        return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
    return f"{int(seconds // 86400)}d{int(seconds % 86400 // 3600):02d}h"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces; an empty table says so."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    lines = ["  ".join(h.ljust(widths[i]) for i, h in enumerate(headers)).rstrip()]
    lines += ["  ".join(c.ljust(widths[i]) for i, c in enumerate(row)).rstrip() for row in cells]
    return "\n".join(lines)


def node_dict(info: NodeInfo) -> dict[str, Any]:
    """A node as JSON: every status field, alive, and readable times (labels masked)."""
    st = info.status
    d: dict[str, Any] = {
        "node_id": st.node_id, "kind": st.kind.value, "addr": st.addr, "state": st.state.value,
        "alive": info.alive, "score": st.score, "epoch": st.epoch, "update_ts": st.update_ts,
        "update_time": ts_time(st.update_ts), "labels": safe_labels(st.labels),
    }
    if st.kind == NodeKind.PUMP:
        d["max_commit_ts"] = st.max_commit_ts
        d["max_commit_time"] = ts_time(st.max_commit_ts)
        d["alerts"] = [{**a, "age_seconds": round(alert_age(a), 1)} for a in st.alerts]
    elif st.kind == NodeKind.DRAINER:
        d["checkpoint"] = st.checkpoint
        d["checkpoint_time"] = ts_time(st.checkpoint)
        d["lag_seconds"] = round(tsmod.lag_seconds(st.checkpoint), 3) if st.checkpoint else None
        # the pump and stuck start_ts holding its merge (drainer/pumps.py `held_by`)
        d["held_by"] = st.labels.get("held-by") or None
    return d


def _labels_text(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in safe_labels(labels).items()) or "-"


def nodes_table(kind: NodeKind, nodes: Sequence[NodeInfo]) -> str:
    headers = ["NODE", "ADDRESS", "STATE", "ALIVE"]
    if kind == NodeKind.PUMP:
        headers += ["MAX COMMIT TS"]
    elif kind == NodeKind.DRAINER:
        headers += ["CHECKPOINT", "LAG"]
    headers += ["SCORE", "EPOCH", "UPDATED", "LABELS"]
    rows = []
    for info in nodes:
        st = info.status
        row: list[object] = [st.node_id, st.addr or "-", st.state.value,
                             "yes" if info.alive else "no"]
        if kind == NodeKind.PUMP:
            row.append(ts_text(st.max_commit_ts))
        elif kind == NodeKind.DRAINER:
            row.append(ts_text(st.checkpoint))
            row.append(duration(tsmod.lag_seconds(st.checkpoint)) if st.checkpoint else "-")
        row += [st.score, st.epoch, ts_text(st.update_ts), _labels_text(st.labels)]
        rows.append(row)
    if not rows:
        return f"no {kind.value} registered"
    lines = [table(headers, rows)]
    for info in nodes:
        lines += [alert_text(a) for a in info.status.alerts]
    return "\n".join(lines)


def alert_age(alert: dict[str, Any]) -> float:
    since = alert.get("since_ms") or 0
    return max(0.0, time.time() - int(since) / 1000) if since else 0.0


def alert_text(alert: dict[str, Any]) -> str:
    """One stuck prewrite a pump published (pump/loops.py), with the command that ends it."""
    return (f"ALERT pump {alert.get('pump')}: prewrite start_ts={alert.get('start_ts')} of "
            f"producer {alert.get('producer')!r} unresolved for {duration(alert_age(alert))} "
            f"and holds every drainer: {alert.get('reason')}\n"
            f"  decide it: {alert.get('command')}")


def emit_json(out: TextIO, value: Any) -> None:
    out.write(json.dumps(value, indent=2, sort_keys=True) + "\n")


def json_inline(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
