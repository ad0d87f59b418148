"""SnapshotProgress encode/decode and the emitted-prefix rule for parallel chunks."""
from __future__ import annotations

from sluice.capture.snapshot.chunks import Chunk
from sluice.capture.snapshot.progress import PrefixTracker, SnapshotState, decode, encode


def test_progress_round_trips() -> None:
    s = SnapshotState(snapshot_id="s1", tables=("d.a", "d.b"), mode="read-only",
                      current_table="d.b", last_chunk_end=(7, "k\u00e9"), max_key=(99, "zz"),
                      chunks_done=3, rows_done=3000, paused=True,
                      conditions=(("d.b", "id > 5"),), surrogate_keys=(("d.a", "u"),))
    assert decode(encode(s)) == s
    assert decode(encode(SnapshotState("s2", ("d.a",)))) == SnapshotState("s2", ("d.a",))


def chunk(i: int, last: bool = False, table: str = "d.a") -> Chunk:
    return Chunk(table=table, index=i, lower=(i * 10,) if i else None, upper=((i + 1) * 10,),
                 last=last)


def test_progress_covers_only_the_emitted_prefix() -> None:
    """Invariant: the progress recorded with a chunk covers only a prefix of the table's chunks
    that have all been emitted, even when parallel windows close out of order."""
    t = PrefixTracker(SnapshotState("s", ("d.a", "d.b"), current_table="d.a"))
    s = t.emitted(chunk(1), 10)           # chunk 1 closes before chunk 0
    assert s.chunks_done == 0 and s.last_chunk_end is None
    s = t.emitted(chunk(0), 10)
    assert s.chunks_done == 2 and s.last_chunk_end == (20,) and s.rows_done == 20
    s = t.emitted(chunk(2, last=True), 5)
    assert s.current_table == "d.b" and s.chunks_done == 0 and s.last_chunk_end is None
    s = t.emitted(chunk(0, last=True, table="d.b"), 1)
    assert s.finished and s.rows_done == 26
