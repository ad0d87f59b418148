"""The capture writer's former message path, kept only as the differential tests' oracle
(tests/unit/test_client_binlogs.py): a group's PREWRITE and COMMIT binlogs built as pb.Binlog
messages, with a pb.Position copied per pump transaction, as capture/writer.py and
client/commit.py did before the binlogs were built as wire bytes (client/binlogs.py)."""
from __future__ import annotations

from typing import Any

from sluice.proto import sluice_pb2 as pb


def pump_txns(group: list[Any], source_name: str) -> list[tuple[bytes, pb.Position,
                                                                 pb.SnapshotProgress | None]]:
    out = []
    for i, st in enumerate(group):
        if st.empty and i != len(group) - 1:
            continue
        values = st.prewrite_values(source_name)
        for j, v in enumerate(values):
            pos = pb.Position()
            pos.CopyFrom(st.position)
            pos.sub_seq = st.position.sub_seq + j
            snap = st.snapshot
            if snap is not None:
                snap = pb.SnapshotProgress()
                snap.CopyFrom(st.snapshot)
                snap.recorded_at.CopyFrom(pos)
            out.append((v, pos, snap))
    return out


def prewrites(items: list[tuple[bytes, pb.Position, pb.SnapshotProgress | None]],
              producer_id: str, epoch: int, generation: int, first_start: int,
              now_ms: int) -> list[pb.Binlog]:
    if generation:
        for _, pos, snap in items:
            pos.generation = generation
            if snap is not None and snap.HasField("recorded_at"):
                snap.recorded_at.generation = generation
    return [pb.Binlog(tp=pb.PREWRITE, start_ts=first_start + i, prewrite_value=v,
                      producer_id=producer_id, producer_epoch=epoch, position=pos,
                      snapshot=snap, ts_ms=now_ms)
            for i, (v, pos, snap) in enumerate(items)]


def commits(prewrites: list[pb.Binlog], commit_ts: int) -> list[pb.Binlog]:
    return [pb.Binlog(tp=pb.COMMIT, start_ts=p.start_ts, commit_ts=commit_ts + i,
                      producer_id=p.producer_id, producer_epoch=p.producer_epoch,
                      position=p.position if p.HasField("position") else None,
                      snapshot=p.snapshot if p.HasField("snapshot") else None,
                      ts_ms=p.ts_ms)
            for i, p in enumerate(prewrites)]
