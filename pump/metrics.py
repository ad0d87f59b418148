"""Pump metrics: writes, bytes, group size, fsync latency, unresolved, watermark lag, storage."""
from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from sluice.core import ts
from sluice.core.metrics import Metrics

if TYPE_CHECKING:
    from .storage.storage import Storage


class PumpMetrics:
    def __init__(self, storage: "Storage") -> None:
        self.storage = storage
        m = self.m = Metrics("sluice_pump")
        self.binlogs = m.counter("binlogs_written_total", "binlogs acknowledged")
        self.bytes = m.counter("bytes_written_total", "payload bytes acknowledged")
        self.requests = m.counter("write_requests_total", "write requests acknowledged")
        self.pullers = m.gauge("pullers", "open PullBinlogs streams")
        self.unresolved = m.gauge("unresolved_prewrites", "prewrites without commit or rollback")
        self.unresolved_checks = m.counter("txn_status_checks_total", "TxnStatus questions asked")
        self.stuck = m.gauge("stuck_prewrites", "prewrites unresolved past txn-timeout that "
                             "nobody could resolve (an operator must: see `sluice ctl pumps`)")
        self.stuck_oldest = m.gauge("stuck_prewrite_oldest_start_ts",
                                    "start_ts of the oldest stuck prewrite (0: none)")
        self.stuck_age = m.gauge("stuck_prewrite_age_seconds",
                                 "age of the oldest stuck prewrite (0: none)")
        self.watermark = m.gauge("served_watermark", "served watermark (ts)")
        self.watermark_lag = m.gauge("watermark_lag_seconds", "now minus served watermark time")
        self.storage_bytes = m.gauge("storage_bytes", "bytes in value-log segments")
        self.group_size = m.gauge("group_size", "binlogs in the last group commit")
        self.fsync_ms = m.gauge("fsync_latency_ms", "last fdatasync latency")

    def on_write(self, payloads: list[bytes]) -> None:
        self.requests.inc()
        self.binlogs.inc(len(payloads))
        self.bytes.inc(sum(map(len, payloads)))

    def on_alerts(self, alerts: list[dict[str, object]]) -> None:
        self.stuck.set(len(alerts))
        if alerts:
            oldest = min(alerts, key=lambda a: int(a["start_ts"]))  # type: ignore[arg-type]
            self.stuck_oldest.set(int(oldest["start_ts"]))  # type: ignore[arg-type]
            self.stuck_age.set(max(0.0, time.time() - int(oldest["since_ms"]) / 1000))  # type: ignore[arg-type]
        else:
            self.stuck_oldest.set(0)
            self.stuck_age.set(0)

    def serve(self, addr: str) -> None:
        self.m.serve(addr)

    async def loop(self) -> None:
        while True:
            st = self.storage.stats()
            wm = self.storage.served_watermark
            self.unresolved.set(st.get("unresolved", 0))
            self.watermark.set(wm)
            self.watermark_lag.set(ts.lag_seconds(wm))
            self.storage_bytes.set(st.get("storage_bytes", 0))
            self.group_size.set(st.get("last_group_size", 0))
            self.fsync_ms.set(st.get("last_fsync_ms", 0))
            await asyncio.sleep(1.0)
