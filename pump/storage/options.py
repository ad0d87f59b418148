"""Storage options: the `[storage]` table of pump.toml (docs/config.md) — one type for both."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StorageConfig:
    segment_size: int = 512 << 20
    max_binlog_size: int = 64 << 20
    max_inflight_bytes: int = 256 << 20
    # Refuse new prewrites when free disk is below this many bytes; 0 turns the guard off.
    stop_write_at_available_space: int = 10 << 30
    sync: bool = True       # False only for tests that do not test durability


# The name the storage API has always used; the same type.
StorageOptions = StorageConfig
