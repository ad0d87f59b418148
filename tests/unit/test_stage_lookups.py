"""The stager's shortcuts keep the write rules (DESIGN §2: idempotent retries, AlreadyExists /
FailedPrecondition messages, producer progress):

- a prewrite above `StoreState.max_start_ts` skips its two index lookups: compared with a store
  whose bound is pinned so that every lookup is made, on random requests with retries, clashes
  and restarts;
- a request's producer progress is serialized once, from the last COMMIT carrying it: compared
  with the per-commit rule (each commit with a position or snapshot replaces that part).
"""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

from sluice.core.errors import SluiceError
from sluice.proto import sluice_pb2 as pb
from sluice.pump.storage import index as ix
from sluice.pump.storage.recovery import max_stored_start_ts
from sluice.pump.storage.storage import Storage

ALWAYS_LOOK = 1 << 63


def pw(start_ts: int, variant: int, epoch: int, part_no: int = 0, part_count: int = 0) -> bytes:
    return pb.Binlog(tp=pb.PREWRITE, start_ts=start_ts, prewrite_value=b"v%d" % variant,
                     producer_id="p", producer_epoch=epoch, part_no=part_no,
                     part_count=part_count).SerializeToString()


def cm(start_ts: int, commit_ts: int, epoch: int, offset: int | None = None,
       snapshot: int | None = None) -> bytes:
    b = pb.Binlog(tp=pb.COMMIT, start_ts=start_ts, commit_ts=commit_ts, producer_id="p",
                  producer_epoch=epoch)
    if offset is not None:
        b.position.CopyFrom(pb.Position(file_seq=1, offset=offset))
    if snapshot is not None:
        b.snapshot.CopyFrom(pb.SnapshotProgress(snapshot_id="s", chunks_done=snapshot))
    return b.SerializeToString()


def rb(start_ts: int, epoch: int) -> bytes:
    return pb.Binlog(tp=pb.ROLLBACK, start_ts=start_ts, producer_id="p",
                     producer_epoch=epoch).SerializeToString()


def outcome(st: Storage, payloads: list[bytes]) -> tuple[str, str]:
    try:
        st.write_blocking(payloads)
    except SluiceError as e:
        return type(e).__name__, str(e)
    return "ok", ""


def stored_start_ts(st: Storage) -> list[int]:
    out = []
    for prefix in (ix.S, ix.T):
        out += [ix.parse_ts_key(k) for k in st._db.iterator(prefix=prefix, include_value=False)]
    return out


class Pair:
    """The same requests to a store as it runs and to one that looks every key up."""

    def __init__(self, root: Path) -> None:
        self.dirs = (root / "fast", root / "look")
        self.fast = self.look = None  # type: ignore[assignment]
        self.open()

    def open(self) -> None:
        self.fast, self.look = Storage.open(self.dirs[0]), Storage.open(self.dirs[1])
        self.look._state.max_start_ts = ALWAYS_LOOK   # persist only ever raises it

    def restart(self) -> None:
        self.close()
        self.open()

    def close(self) -> None:
        self.fast.close()
        self.look.close()


binlog = hst.one_of(
    hst.builds(lambda s, v, e: pw(s, v, e), hst.integers(1, 12), hst.integers(0, 1),
               hst.integers(1, 2)),
    hst.builds(lambda s, d, e, o, n: cm(s, s + d, e, o, n), hst.integers(1, 12),
               hst.integers(1, 4), hst.integers(1, 2), hst.none() | hst.integers(0, 9),
               hst.none() | hst.integers(0, 9)),
    hst.builds(lambda s, e: rb(s, e), hst.integers(1, 12), hst.integers(1, 2)),
    hst.builds(lambda s, k, n, e: pw(s, 0, e, k % n, n), hst.integers(1, 12),
               hst.integers(0, 2), hst.integers(2, 3), hst.integers(1, 2)),
)
step = hst.one_of(hst.lists(binlog, min_size=1, max_size=4), hst.just("restart"))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=hst.lists(step, min_size=1, max_size=25))
def test_skipping_lookups_above_the_bound_changes_no_outcome(tmp_path_factory: pytest.TempPathFactory,
                                                             steps: list) -> None:
    """Every request gets the same answer (status and message) and leaves the same state
    (transactions, watermark, producer) whether the prewrite lookups above the stored
    start_ts bound are skipped or not, across restarts; the bound covers every stored key."""
    pair = Pair(tmp_path_factory.mktemp("pair"))
    try:
        for k, s in enumerate(steps):
            if s == "restart":
                pair.restart()
                continue
            assert outcome(pair.fast, s) == outcome(pair.look, s), f"request {k}"
            bound = pair.fast._state.max_start_ts
            assert all(ts <= bound for ts in stored_start_ts(pair.fast))
        for ts in range(1, 13):
            assert pair.fast.get_commit(ts) == pair.look.get_commit(ts)
        assert pair.fast.served_watermark == pair.look.served_watermark
        assert pair.fast.producer_state("p") == pair.look.producer_state("p")
        pair.restart()
        assert pair.fast._state.max_start_ts == max(stored_start_ts(pair.fast), default=0)
    finally:
        pair.close()


def test_recovery_reads_the_highest_stored_start_ts(tmp_path: Path) -> None:
    """After a restart the bound is the highest start_ts of any s or t entry (a rolled-back
    start_ts included), so a retry of the newest stored prewrite is still found: identical
    is accepted as stored, different content is AlreadyExists."""
    st = Storage.open(tmp_path / "p")
    assert st._state.max_start_ts == 0
    st.write_blocking([pw(5, 0, 1), pw(9, 0, 1)])
    st.write_blocking([cm(5, 6, 1), rb(9, 1)])
    st.close()
    st = Storage.open(tmp_path / "p")
    try:
        assert max_stored_start_ts(st._db) == 9 == st._state.max_start_ts
        st.write_blocking([pw(9, 0, 1)])     # the same prewrite again: stored once
        with pytest.raises(SluiceError, match="a different prewrite .part 0. is already stored "
                                              "under start_ts=9"):
            st.write_blocking([pw(9, 1, 1)])
        with pytest.raises(SluiceError, match="start_ts=5 is already committed"):
            st.write_blocking([pw(5, 0, 1, part_no=1, part_count=2)])
        st.write_blocking([pw(10, 0, 1)])
        assert st._state.max_start_ts == 10
    finally:
        st.close()


def progress_oracle(requests: list[list[tuple[int, int | None, int | None]]]
                    ) -> tuple[int, bytes | None, bytes | None]:
    """The per-commit rule: every COMMIT carrying a position (snapshot) replaces it, at the
    request's epoch."""
    epoch, pos, snap = 0, None, None
    for req in requests:
        for e, offset, chunks in req:
            epoch = max(epoch, e)
            if offset is not None:
                pos = pb.Position(file_seq=1, offset=offset).SerializeToString()
            if chunks is not None:
                snap = pb.SnapshotProgress(snapshot_id="s", chunks_done=chunks).SerializeToString()
    return epoch, pos, snap


commit_spec = hst.tuples(hst.integers(1, 3), hst.none() | hst.integers(0, 99),
                         hst.none() | hst.integers(0, 99))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=hst.lists(hst.lists(commit_spec, min_size=1, max_size=6), min_size=1, max_size=4))
def test_a_requests_progress_is_its_last_commit_carrying_it(
        tmp_path_factory: pytest.TempPathFactory,
        requests: list[list[tuple[int, int | None, int | None]]]) -> None:
    """The producer's recorded position and snapshot progress are those of the last COMMIT that
    carried each (position and snapshot separately), at the highest epoch seen, in memory and
    after a restart."""
    root = tmp_path_factory.mktemp("progress")
    st = Storage.open(root)
    ts = 10
    epoch = 0
    for req in requests:
        # epochs never go down (a lower one is StaleEpoch, tested elsewhere)
        for k, (e, o, c) in enumerate(req):
            epoch = max(epoch, e)
            req[k] = (epoch, o, c)
        starts = list(range(ts, ts + len(req)))
        st.write_blocking([pw(s, 0, req[0][0]) for s in starts])   # epochs rise in the commits
        st.write_blocking([cm(s, s + 100, e, o, c) for s, (e, o, c) in zip(starts, req)])
        ts += 200
    want = progress_oracle(requests)
    try:
        assert tuple(st._state.producers["p"]) == want
        st.close()
        st = Storage.open(root)
        assert tuple(st._state.producers["p"]) == want
    finally:
        st.close()
