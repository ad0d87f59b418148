"""Prometheus metrics: one registry per process (no global default registry)."""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

log = logging.getLogger(__name__)
_M = TypeVar("_M")


class Metrics:
    """Holds a process's metrics; `serve(addr)` exposes them at http://addr/metrics."""

    def __init__(self, namespace: str = "sluice") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.namespace = namespace
        self._metrics: dict[str, Any] = {}

    # A component opened twice in one process (a sink reopened) asks for the same metric again:
    # hand back the one already registered rather than fail on a duplicate name.
    def counter(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
        return self._made(name, lambda: Counter(name, doc, labels, namespace=self.namespace,
                                                registry=self.registry))

    def gauge(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
        return self._made(name, lambda: Gauge(name, doc, labels, namespace=self.namespace,
                                              registry=self.registry))

    def histogram(self, name: str, doc: str, labels: tuple[str, ...] = (),
                  buckets: tuple[float, ...] = Histogram.DEFAULT_BUCKETS) -> Histogram:
        return self._made(name, lambda: Histogram(name, doc, labels, namespace=self.namespace,
                                                  registry=self.registry, buckets=buckets))

    def _made(self, name: str, make: Callable[[], _M]) -> _M:
        if name not in self._metrics:
            self._metrics[name] = make()
        return self._metrics[name]  # type: ignore[return-value]

    def serve(self, addr: str) -> None:
        """Start the /metrics endpoint on host:port (empty addr: disabled)."""
        if not addr:
            return
        host, _, port = addr.rpartition(":")
        start_http_server(int(port), addr=host or "127.0.0.1", registry=self.registry)
        log.info("metrics at http://%s/metrics", addr)
