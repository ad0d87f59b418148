"""Capture metrics (Prometheus, one registry per process) and the one-log-line-per-state rule.

Invariant: every state change of the capture (connected, streaming, reconnecting, failed) is
logged exactly once, when it happens, and reflected in `sluice_capture_state`.
"""
from __future__ import annotations

import logging

from sluice.core.log import kv
from sluice.core.metrics import Metrics

log = logging.getLogger(__name__)

STATES = ("starting", "connected", "streaming", "reconnecting", "restarting", "failed", "stopped")
SNAPSHOT_STATES = ("none", "running", "paused", "finished")


class CaptureMetrics:
    def __init__(self) -> None:
        m = self.metrics = Metrics()
        self.state = m.gauge("capture_state", "1 for the capture's current state", ("state",))
        self.lag = m.gauge("capture_source_lag_seconds",
                           "now - source commit time of the last transaction committed to the "
                           "pumps; 0 when caught up (last source event a heartbeat, nothing "
                           "waiting)")
        self.txns = m.counter("capture_transactions_total", "source transactions committed to pumps")
        self.groups = m.counter("capture_groups_total", "groups committed to pumps")
        self.rows = m.counter("capture_rows_total", "row changes committed to pumps")
        self.overlapped = m.counter("capture_groups_overlapped_total",
                                    "groups whose prewrites were acknowledged while the previous "
                                    "group's commit was still in flight")
        self.reconnects = m.counter("capture_reconnects_total",
                                    "binlog connections re-opened after a loss")
        self.restarts = m.counter("capture_restarts_total",
                                  "in-process restarts (new epoch, recovery from the pumps) after "
                                  "a pump, etcd or the TSO was unreachable or the pumps were full")
        self.source_reads = m.counter("capture_source_reads_total",
                                      "socket reads of the binlog dump connection")
        self.loop_wakeups = m.counter("capture_loop_wakeups_total",
                                      "wake-ups of the event loop by the reader/snapshot threads")
        self.group_seconds = m.histogram("capture_group_seconds", "prewrite to commit ack per group",
                                         buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
        # Snapshots (docs/snapshots.md): what a progress bar would show, per table.
        self.snapshot_state = m.gauge(
            "capture_snapshot_state", "1 for the snapshot's current state", ("state",))
        self.snapshot_rows = m.counter("capture_snapshot_rows_total",
                                       "rows read by snapshot chunks", ("table",))
        self.snapshot_chunks = m.counter("capture_snapshot_chunks_total",
                                         "snapshot chunks read", ("table",))
        self.snapshot_chunk_seconds = m.histogram(
            "capture_snapshot_chunk_seconds", "one chunk's SELECT",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.snapshot_tables_left = m.gauge(
            "capture_snapshot_tables_remaining", "tables of the snapshot not finished yet")
        self.snapshot_eta = m.gauge(
            "capture_snapshot_eta_seconds", "estimated seconds left for the current table "
            "(InnoDB's row estimate / the table's rows per second so far)")
        self._current = ""
        self._snapshot = ""

    def set_snapshot_state(self, state: str, tables_left: int) -> None:
        """`none`, `running`, `paused` or `finished`, from the capture's snapshot state."""
        self.snapshot_tables_left.set(tables_left)
        if state == self._snapshot:
            return
        for s in SNAPSHOT_STATES:
            self.snapshot_state.labels(s).set(1 if s == state else 0)
        self._snapshot = state

    def on_snapshot_chunk(self, table: str, rows: int, select_s: float, eta_s: float | None) -> None:
        self.snapshot_rows.labels(table).inc(rows)
        self.snapshot_chunks.labels(table).inc()
        self.snapshot_chunk_seconds.observe(select_s)
        self.snapshot_eta.set(eta_s if eta_s is not None else 0)

    def set_state(self, state: str, **fields: object) -> None:
        if state == self._current:
            return
        for s in STATES:
            self.state.labels(s).set(1 if s == state else 0)
        self._current = state
        level = logging.ERROR if state == "failed" else logging.INFO
        log.log(level, "capture %s", state, extra=kv(**fields) if fields else None)
