"""`MergeStrategy`: what the drainer needs from a merge of its pumps' streams.

Two implementations keep the same rules (drainer/merger.py's module invariant): `Merger`, the
tuple merge, and `ColumnarMerge` (drainer/columnar.py), which also takes and emits Arrow columns
for a raw sink and is proven equal to `Merger` by tests/unit/test_columnar.py. The syncer and
the pumps use only this protocol.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from sluice.proto import sluice_pb2 as pb

if TYPE_CHECKING:
    from sluice.drainer.columnar import ColumnBatch, Segment
    from sluice.drainer.merger import MergeStats

__all__ = ["MergeStrategy", "new_merge"]


class MergeStrategy(Protocol):
    """Sources push complete transactions in their commit order and advance watermarks; a pop
    returns, in commit order, everything at or below the smallest watermark of the sources."""

    def add_source(self, source_id: str, after_ts: int) -> bool:
        """Wait for source_id from after_ts on; False if it is in the merge already."""

    def remove_source(self, source_id: str) -> bool:
        """Stop waiting for source_id (what it pushed is still merged)."""

    def sources(self) -> dict[str, int]:
        """source id -> its watermark."""

    def advance(self, source_id: str, watermark: int) -> None:
        """Everything of source_id with commit_ts <= watermark has been pushed."""

    def push_many(self, source_id: str, items: Sequence[Any]) -> None:
        """Merge items (drainer.merger.MergeItem tuples) of one source, in its commit order."""

    def push_segment(self, source_id: str, seg: Segment) -> None:
        """Merge a drainer.columnar.Segment of one source (a reader made `columnar`)."""

    def pop_ready(self, limit: int | None = None) -> list[Any] | ColumnBatch:
        """What is ready, in commit order: merge items, or a ColumnBatch (columnar route)."""

    @property
    def merge_watermark(self) -> int:
        """Largest T such that everything <= T from every source was emitted; never decreases."""

    def pending(self, source_id: str | None = None) -> int:
        """Transactions buffered for source_id, or in all."""

    def holding_source(self) -> str | None:
        """The source whose watermark holds the merge while something waits on it."""

    def producer_positions(self) -> dict[str, pb.Position]:
        """Each producer's last emitted position."""

    def stats(self) -> MergeStats:
        """Emitted and dropped counts."""

    def summary(self) -> str:
        """How the merge went, for the log line at stop ("" when there is nothing to say)."""


def new_merge(columnar: bool, initial_ts: int, positions: dict[str, pb.Position],
              dedupe_window: int) -> MergeStrategy:
    """The merge for a drainer: columnar for a sink taking merged columns, else tuples."""
    if columnar:
        from sluice.drainer.columnar import ColumnarMerge   # pyarrow: only when used
        return ColumnarMerge(initial_ts, positions, dedupe_window)
    from sluice.drainer.merger import Merger
    return Merger(initial_ts, positions, dedupe_window)
