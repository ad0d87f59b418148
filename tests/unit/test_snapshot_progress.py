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


def test_the_latest_progress_over_pumps_is_the_one_recorded_at_the_greatest_position() -> None:
    """Each pump keeps the progress of the last transaction it committed; the capture resumes
    from the one recorded at the greatest source position: a new unfinished snapshot beats an
    old finished one, and a resume beats the pause before it although they look alike."""
    from sluice.capture.writer import latest_progress, pump_txns
    from sluice.proto import sluice_pb2 as pb

    def prog(sid: str, finished: bool, chunks: int, paused: bool, offset: int) -> pb.SnapshotProgress:
        p = pb.SnapshotProgress(snapshot_id=sid, tables=["d.t"], current_table="d.t",
                                chunks_done=chunks, finished=finished, paused=paused)
        p.recorded_at.CopyFrom(pb.Position(file_seq=1, offset=offset))
        return p

    old_done, new_started = prog("a", True, 9, False, 100), prog("b", False, 1, False, 200)
    assert latest_progress([old_done, new_started]).snapshot_id == "b"
    assert latest_progress([new_started, old_done]).snapshot_id == "b"
    paused, resumed = prog("b", False, 3, True, 300), prog("b", False, 3, False, 400)
    assert not latest_progress([resumed, paused]).paused
    assert latest_progress([paused, resumed]) is resumed
    # the writer stamps the position of the transaction that carries the progress
    from sluice.capture.assembler import SourceTxn
    src = SourceTxn(position=pb.Position(file_seq=2, offset=7), gtid="", server_id=0, ts_ms=0,
                    file="", offset=7, mutations=(pb.TableMutation(table_id=1),),
                    schema_snapshots=(), ddls=(), size=0,
                    snapshot=pb.SnapshotProgress(snapshot_id="c"))
    (_, pos_b, snap_b), = pump_txns([src], "src")
    assert snap_b is not None
    pos, snap = pb.Position.FromString(pos_b), pb.SnapshotProgress.FromString(snap_b)
    assert snap.recorded_at == pos and pos == src.position
    assert src.snapshot is not None and not src.snapshot.HasField("recorded_at")
