"""`sluice cluster status` and `sluice cluster logs`."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sluice.core import ts as tsmod
from sluice.core.errors import ConfigError

from .cluster_config import Layout
from .cluster_state import (BACKOFF, FAILED, PENDING, STOPPED, STOPPING, Recorded, State,
                            read_state, running)
from .cluster_health import Health, port_open
from .cluster_procs import supervisor_running, tail


# ---------------------------------------------------------------------------------------------
# status
# ---------------------------------------------------------------------------------------------

def _down_state(r: Recorded) -> str:
    """The STATE of a process that does not run: what the supervisor knows, never the
    registry's last word (a killed pump stays `online` there until its key expires)."""
    if r.want == "stop" or r.status == STOPPED:
        return "stopped"
    return {BACKOFF: "restarting", FAILED: "failed", PENDING: "starting",
            STOPPING: "stopping"}.get(r.status, "dead")


def _rows(state: State, health: Health) -> list[dict[str, Any]]:
    rows = []
    for r in state.processes:
        up = running(r)
        row: dict[str, Any] = {"process": r.name, "pid": r.pid, "running": up, "state": "",
                               "alive": "", "restarts": r.restarts, "exit": r.exit_text(),
                               "restart": r.restart, "want": r.want, "address": r.addr,
                               "lag": ""}
        try:
            if not up:
                row["state"] = _down_state(r)
            elif r.kind == "etcd":
                row["state"] = "ready" if health.etcd_ready() else "down"
            elif r.kind == "tso":
                row["state"] = health.tso_role(r)
            elif r.kind in ("pump", "drainer", "capture"):
                info = health.node(r.kind, r.node_id)
                role = health.drainer_role(r) if r.kind == "drainer" and _is_ha(r) else ""
                if role:
                    row["role"] = role
                if role in ("standby", "waiting"):
                    row["state"] = role
                elif info is not None:
                    row["state"], row["alive"] = info.state.value, info.alive
                    if r.kind == "drainer":
                        row["lag"] = round(tsmod.lag_seconds(info.status.checkpoint), 1)
                        row["checkpoint"] = info.status.checkpoint
                else:
                    row["state"] = "unregistered"
            else:
                row["state"] = "listening" if port_open(r.addr) else "down"
        except Exception as e:  # noqa: BLE001 - status shows what it can
            row["state"] = f"? ({type(e).__name__})"
        rows.append(row)
    return rows


def _is_ha(r: Recorded) -> bool:
    """A drainer run as a member of an HA group (`standby = true` in its [[drainers]])."""
    if r.standby:
        return True
    try:
        import tomllib
        return bool(tomllib.loads(Path(r.config_path).read_text()).get("ha", False))
    except (OSError, ValueError):
        return False


def _print_status(state: State, health: Health, as_json: bool) -> list[dict[str, Any]]:
    rows = _rows(state, health)
    sup = state.supervisor
    supervised = supervisor_running(state)
    if as_json:
        print(json.dumps({"cluster_id": state.cluster_id, "etcd": state.etcd, "processes": rows,
                          "supervisor": {"pid": sup.pid if sup else 0, "running": supervised}},
                         indent=2))
        return rows
    cols = ("process", "pid", "running", "state", "alive", "restarts", "exit", "address", "lag")
    shown = [[_cell(f"{row[c]} ({row['role']})" if c == "state" and row.get("role") == "active"
                    else row[c], c) for c in cols] for row in rows]
    widths = [max(len(c), *(len(s[i]) for s in shown)) if shown else len(c)
              for i, c in enumerate(cols)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(cols, widths)).rstrip())
    for s in shown:
        print("  ".join(v.ljust(w) for v, w in zip(s, widths)).rstrip())
    if not supervised:
        print("supervisor not running: nothing is restarted (`sluice cluster up` starts it)")
    return rows


def _cell(v: Any, col: str) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if col == "lag" and v != "":
        return f"{v}s"
    if col == "restarts" and v == 0:
        return ""
    return str(v)


def cmd_status(args: argparse.Namespace, layout: Layout) -> int:
    state = read_state(layout)
    if state is None or not state.processes:
        print(f"no cluster running in {layout.root}")
        return 1
    health = Health(state)
    try:
        rows = _print_status(state, health, args.json)
    finally:
        health.close()
    # A process stopped on purpose is as it should be; one that should run and does not is not.
    return 0 if all(r["running"] for r in rows if r["want"] == "run") else 1


def cmd_logs(args: argparse.Namespace, layout: Layout) -> int:
    state = read_state(layout)
    if state is None:
        raise ConfigError(f"no cluster in {layout.root}")
    if args.process == "supervisor":
        targets = [("supervisor", str(layout.log("supervisor")))]
    elif args.process:
        targets = [(args.process, state.find(args.process).log)]
    else:
        targets = [(r.name, r.log) for r in state.processes]
        if not targets:   # after `down`: the logs are still there
            targets = [(p.stem, str(p)) for p in sorted((layout.root / "logs").glob("*.log"))]
    for name, path in targets:
        if len(targets) > 1:
            print(f"==> {name} ({path}) <==")
        for line in tail(path, args.lines):
            print(line)
    if args.follow:
        with contextlib.suppress(KeyboardInterrupt):
            for name, line in _follow(targets):
                print(f"{name:<14}| {line}" if len(targets) > 1 else line, flush=True)
    return 0


def _follow(targets: list[tuple[str, str]]) -> Iterator[tuple[str, str]]:
    offsets = {}
    for _, path in targets:
        with contextlib.suppress(FileNotFoundError):
            offsets[path] = os.path.getsize(path)
    partial: dict[str, str] = {}
    while True:
        for name, path in targets:
            try:
                with open(path, "rb") as f:
                    f.seek(offsets.get(path, 0))
                    data = f.read()
            except FileNotFoundError:
                continue
            offsets[path] = offsets.get(path, 0) + len(data)
            text = partial.pop(path, "") + data.decode(errors="replace")
            *lines, rest = text.split("\n")
            if rest:
                partial[path] = rest
            for line in lines:
                yield name, line
        time.sleep(0.2)
