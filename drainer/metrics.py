"""Drainer metrics: checkpoint lag, per-pump watermarks and queues, throughput, merge health.

A crashed pump stalls the merge by design (DESIGN §2.4); `sluice_drainer_merge_holding{pump}`
and the per-pump watermark show which pump holds it.
"""
from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from sluice.core import ts
from sluice.core.metrics import Metrics

if TYPE_CHECKING:
    from .main import Drainer


class DrainerMetrics:
    def __init__(self, server: "Drainer") -> None:
        self.server = server
        m = self.m = Metrics("sluice_drainer")
        self.checkpoint = m.gauge("checkpoint_ts", "durable checkpoint (inclusive ts)")
        self.lag = m.gauge("checkpoint_lag_seconds", "now minus the checkpoint's physical time")
        self.merge_watermark = m.gauge("merge_watermark", "everything <= this ts was emitted")
        self.pump_watermark = m.gauge("pump_watermark", "watermark read from each pump", ("pump",))
        self.pump_pending = m.gauge("pump_pending_txns", "merge-buffered transactions per pump",
                                    ("pump",))
        self.holding = m.gauge("merge_holding", "1 for the pump whose watermark holds the merge",
                               ("pump",))
        self.held_by = m.gauge("merge_held_by_start_ts", "start_ts of the stuck prewrite (a "
                               "pump's alert) that holds the merge, by pump; absent: none",
                               ("pump",))
        self.pumps = m.gauge("pumps_in_merge", "pumps the merge waits on")
        self.txns = m.counter("txns_total", "transactions handed to the sink")
        self.binlogs = m.counter("binlogs_total", "binlogs handed to the sink")
        self.rate = m.gauge("binlogs_per_second", "binlogs handed to the sink per second (last 5 s)")
        self.reconnects = m.counter("pump_reconnects_total", "pump stream reconnects", ("pump",))
        self.skipped = m.counter("corrupt_skipped_total", "transactions dropped by skip-corrupt")
        self.duplicates = m.gauge("duplicates_dropped", "copies of emitted transactions dropped")
        self.saves = m.counter("checkpoint_saves_total", "checkpoints saved")
        self.ha_active = m.gauge("ha_active", "1 while this instance is the active drainer of its "
                                 "name, 0 while it waits as a standby")
        self.epoch = m.gauge("epoch", "this instance's epoch (0 until it took one)")
        self.filtered = m.counter("filtered_txns_total",
                                  "transactions the [filter] rules dropped entirely")
        self._known: set[str] = set()
        self._held: set[str] = set()

    def serve(self, addr: str) -> None:
        self.m.serve(addr)

    def on_reader_event(self, pump_id: str, what: str) -> None:
        if what == "reconnect":
            self.reconnects.labels(pump_id).inc()
        elif what == "skipped":
            self.skipped.inc()

    def on_checkpoint(self, commit_ts: int) -> None:
        self.saves.inc()
        self.checkpoint.set(commit_ts)

    async def loop(self) -> None:
        last_t, last_n = time.monotonic(), 0.0
        while True:
            await asyncio.sleep(1.0)
            s = self.server
            self.lag.set(ts.lag_seconds(s.durable_ts))
            merger = s.merger
            if merger is not None:
                self.merge_watermark.set(merger.merge_watermark)
                sources = merger.sources()
                hold = merger.holding_source()
                self.pumps.set(len(sources))
                for pump_id in self._known - set(sources):
                    for g in (self.pump_watermark, self.pump_pending, self.holding):
                        try:
                            g.remove(pump_id)
                        except KeyError:
                            pass
                self._known = set(sources)
                for pump_id, wm in sources.items():
                    self.pump_watermark.labels(pump_id).set(wm)
                    self.pump_pending.labels(pump_id).set(merger.pending(pump_id))
                    self.holding.labels(pump_id).set(1 if pump_id == hold else 0)
                self.duplicates.set(merger.stats().duplicates_dropped)
                held = s.held_by()
                for pump_id in self._held - ({held[0]} if held else set()):
                    try:
                        self.held_by.remove(pump_id)
                    except KeyError:
                        pass
                self._held = {held[0]} if held else set()
                if held is not None:
                    self.held_by.labels(held[0]).set(int(held[1].get("start_ts") or 0))
            now = time.monotonic()
            if now - last_t >= 5.0:
                n = s.binlogs_out
                self.rate.set((n - last_n) / (now - last_t))
                last_t, last_n = now, n
