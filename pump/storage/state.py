"""The storage's durable handles and in-memory state, shared by its stages.

Only the committer thread mutates it (recovery runs before that thread starts); readers in other
threads take `served`, `gc_ts` and `schema` as they are (each is replaced, never mutated).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import plyvel

from .options import StorageConfig

from .gc import SegmentSummary
from .records import SchemaPin, ProducerRecord
from .sorter import Sorter
from .vlog import ValueLog


def new_stats() -> dict[str, Any]:
    return {"groups": 0, "group_binlogs": 0, "group_requests": 0, "last_group_binlogs": 0,
            "max_group_binlogs": 0, "fsync_seconds_total": 0.0, "fsync_count": 0,
            "fsync_last_seconds": 0.0, "rejected_requests": 0}


@dataclass
class StoreState:
    data_dir: Path
    options: StorageConfig
    db: plyvel.DB
    vlog: ValueLog
    sorter: Sorter = field(default_factory=Sorter)
    served: int = 0                      # the served watermark
    # At least every start_ts of an `s` or `t` index entry (recovery reads it from the index,
    # persist raises it with every group; GC only lowers the truth): the stager skips the two
    # index lookups of a prewrite whose start_ts is above it (a fresh TSO timestamp, the usual
    # case), which cannot find anything. Unknown until recovery: every lookup is made.
    max_start_ts: int = 1 << 63
    gc_ts: int = 0
    producers: dict[str, ProducerRecord] = field(default_factory=dict)
    summaries: dict[int, SegmentSummary] = field(default_factory=dict)
    # table_id -> its schema pins, sorted by commit_ts
    schema: dict[int, tuple[SchemaPin, ...]] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=new_stats)
