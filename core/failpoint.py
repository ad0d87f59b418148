"""Failpoints: named points in the code that a test can make sleep, raise or exit.

Enabled by the environment variable SLUICE_FAILPOINTS, read once per process:

    SLUICE_FAILPOINTS="pump-after-vlog-sync=exit(137);tso-before-reply=sleep(3000)"

Each term is `name=[P%][N*]action[(arg)][@K]` (pingcap/failpoint's grammar plus `@K`):
- `P%`  trigger with probability P (0-100),
- `N*`  trigger at most N times,
- `@K`  stay silent for the first K-1 hits (trigger from the K-th hit on),
- actions: `off`, `sleep(ms)`, `raise(message)`, `exit(code)` (os._exit, like kill -9 at that
  point: no cleanup, no flush), `pause` (sleep forever; the test kills the process).

A process-wide table is the one piece of global state we allow: failpoints are test wiring read
from the environment, and threading a handle through every call site would obscure the code that
matters. With no variable set, `inject` is one dict lookup.
"""
from __future__ import annotations

import asyncio
import logging
import os
import random
import re
import threading
import time
from dataclasses import dataclass, field

from .errors import ConfigError, FailpointError

ENV = "SLUICE_FAILPOINTS"
log = logging.getLogger(__name__)

_TERM = re.compile(
    r"^(?:(?P<pct>\d+(?:\.\d+)?)%)?(?:(?P<count>\d+)\*)?(?P<action>off|sleep|raise|exit|pause)"
    r"(?:\((?P<arg>[^)]*)\))?(?:@(?P<start>\d+))?$")


@dataclass
class _Point:
    name: str
    action: str
    arg: str = ""
    pct: float = 100.0
    count: int | None = None
    start: int = 1
    hits: int = 0
    fired: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def should_fire(self) -> bool:
        with self.lock:
            self.hits += 1
            if self.action == "off" or self.hits < self.start:
                return False
            if self.count is not None and self.fired >= self.count:
                return False
            if self.pct < 100 and random.random() * 100 >= self.pct:
                return False
            self.fired += 1
            return True


def parse(spec: str) -> dict[str, _Point]:
    """Parse a SLUICE_FAILPOINTS value; raises ConfigError naming the bad term."""
    points: dict[str, _Point] = {}
    for term in filter(None, (t.strip() for t in spec.split(";"))):
        name, sep, body = term.partition("=")
        m = _TERM.match(body.strip()) if sep else None
        if not m or not name.strip():
            raise ConfigError(f"{ENV}: cannot parse failpoint term {term!r} "
                              "(expected name=[P%][N*]off|sleep(ms)|raise(msg)|exit(code)|pause[@K])")
        points[name.strip()] = _Point(
            name=name.strip(), action=m["action"], arg=m["arg"] or "",
            pct=float(m["pct"]) if m["pct"] else 100.0,
            count=int(m["count"]) if m["count"] else None,
            start=int(m["start"]) if m["start"] else 1)
    return points


_points: dict[str, _Point] = parse(os.environ.get(ENV, ""))


def enable(name: str, action: str) -> None:
    """Enable a failpoint in this process (in-process tests)."""
    _points.update(parse(f"{name}={action}"))


def disable(name: str) -> None:
    _points.pop(name, None)


def active(name: str) -> bool:
    return name in _points


def _fire(point: _Point) -> float:
    """Performs the non-sleeping actions; returns seconds to sleep (0 for none)."""
    log.warning("failpoint %s fired: %s(%s)", point.name, point.action, point.arg)
    if point.action == "exit":
        os._exit(int(point.arg or 137))
    if point.action == "raise":
        raise FailpointError(point.arg or f"failpoint {point.name}")
    if point.action == "pause":
        return float("inf")
    return float(point.arg or 0) / 1000.0


def inject(name: str) -> None:
    """Evaluate failpoint `name` (blocking sleep: use from threads or sync code)."""
    point = _points.get(name)
    if point is None or not point.should_fire():
        return
    delay = _fire(point)
    while delay > 0:
        step = min(delay, 3600.0)
        time.sleep(step)
        delay -= step


async def ainject(name: str) -> None:
    """Evaluate failpoint `name` from a coroutine (the sleep does not block the loop)."""
    point = _points.get(name)
    if point is None or not point.should_fire():
        return
    delay = _fire(point)
    while delay > 0:
        step = min(delay, 3600.0)
        await asyncio.sleep(step)
        delay -= step
