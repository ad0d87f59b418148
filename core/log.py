"""Structured logging: `ts level logger msg key=value ...` lines on stderr (or a file)."""
from __future__ import annotations

import logging
import sys
import time


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = f"{ts}.{int(record.msecs):03d}Z {record.levelname:<5} {record.name} {record.getMessage()}"
        fields = getattr(record, "fields", None)
        if fields:
            line += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup(level: str = "info", path: str | None = None, process: str = "") -> None:
    handler: logging.Handler = logging.FileHandler(path) if path else logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("py4j", "grpc", "asyncio", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def kv(**fields: object) -> dict[str, dict[str, object]]:
    """`log.info("group committed", extra=kv(size=16, fsync_ms=0.8))`."""
    return {"fields": fields}
