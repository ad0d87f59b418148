"""The drainer's pump reader turning PullBinlogs responses into merge tuples (drainer/reader.py).

Invariant: a reader hands the merge only complete transactions in its pump's commit order, and a
watermark only once everything at or below it was handed over — whichever description the pump
sent (packed arrays, TxnMeta envelopes, or none), the same tuples come out.
"""
from __future__ import annotations

from sluice.drainer.reader import PumpReader
from sluice.drainer.txn import unframe
from sluice.proto import sluice_pb2 as pb
from sluice.core.wire import frame_head, packed_meta, txn_meta
from tests.support.binlogs import commit, prewrite


class Target:
    def __init__(self) -> None:
        self.items: list[tuple] = []
        self.watermark = 0
        self.binlogs = 0

    def deliver(self, pump_id: str, items: list[tuple], watermark: int, binlogs: int) -> None:
        self.items += items
        self.watermark = watermark
        self.binlogs += binlogs


def stream() -> list[list[bytes]]:
    """Entries in commit order: plain txns, a FAKE, a txn whose COMMIT carries a position."""
    out = [[prewrite(10, b"a"), commit(10, 11)], [prewrite(12, b"b"), commit(12, 13)],
           [pb.Binlog(tp=pb.FAKE, start_ts=14, commit_ts=14).SerializeToString()]]
    c = pb.Binlog(tp=pb.COMMIT, start_ts=15, commit_ts=16, producer_id="cap",
                  position=pb.Position(file_seq=1, offset=7))
    out.append([prewrite(15, b"c", producer="cap"), c.SerializeToString()])
    out.append([prewrite(17, b"d", part_no=0, part_count=2),
                prewrite(17, b"e", part_no=1, part_count=2), commit(17, 18)])
    return out


def response(entries: list[list[bytes]], how: str, watermark: int = 20) -> bytes:
    frames, cts, sts, ends, fakes, positioned, metas = [], [], [], [], [], [], []
    end = 0
    for i, binlogs in enumerate(entries):
        for b in binlogs:
            frames += [frame_head(len(b)), b]
            end += len(frame_head(len(b))) + len(b)
        last = pb.Binlog.FromString(binlogs[-1])
        cts.append(last.commit_ts)
        sts.append(last.start_ts)
        ends.append(end)
        if last.tp == pb.FAKE:
            fakes.append(i)
        if last.HasField("position"):
            positioned.append(i)
        metas += txn_meta(binlogs[-1], len(binlogs))
    meta = {"packed": packed_meta(cts, sts, ends, fakes, positioned), "txns": b"".join(metas),
            "none": b""}[how]
    return b"".join(frames) + meta + pb.PullBinlogsResp(watermark=watermark).SerializeToString()


def read(raw: bytes, after: int = 0) -> Target:
    t = Target()
    r = PumpReader("pump-1", "127.0.0.1:1", after, t, cluster_id=1, consumer_id="d")
    resp = pb.PullBinlogsResp.FromString(raw)
    if resp.txn_end:
        r._response_packed(raw, resp)
    elif resp.txns:
        r._response_meta(resp.binlogs, resp.txns, resp.watermark)
    else:
        r._response(resp.binlogs, resp.watermark, {})
    return t


def plain(items: list[tuple]) -> list[tuple]:
    """Comparable tuples: framed payloads unframed, positions serialized."""
    return [(ct, st, src, prod, pos.SerializeToString() if pos is not None else None,
             unframe(payload), fake) for ct, st, src, prod, pos, payload, fake in items]


def test_every_description_yields_the_same_complete_transactions_in_commit_order() -> None:
    """A reader hands the merge only complete transactions in its pump's commit order, and a
    watermark only once everything at or below it was handed over — whichever description the
    pump sent (packed arrays, TxnMeta envelopes, or none), the same tuples come out."""
    entries = stream()
    want = plain(read(response(entries, "none")).items)
    assert [(i[0], i[1]) for i in want] == [(11, 10), (13, 12), (16, 15), (18, 17)]
    assert want[2][3] == "cap"
    assert want[2][4] == pb.Position(file_seq=1, offset=7).SerializeToString()
    assert want[3][5] == entries[4]
    for how in ("packed", "txns"):
        t = read(response(entries, how))
        assert t.watermark == 20 and t.binlogs == 10
        got = plain(t.items)
        # Only positioned COMMITs name their producer when described (unpositioned: unused).
        assert [g[:3] + g[4:] for g in got] == [w[:3] + w[4:] for w in want]
        assert got[2][3] == "cap"
    # An inclusive resume: what is at or below `after` was delivered already.
    assert [i[0] for i in read(response(entries, "packed"), after=13).items] == [16, 18]


def test_packed_metadata_that_does_not_match_the_response_is_decoded_instead() -> None:
    """Offsets that do not cut the response at binlog frames are not trusted: the response is
    decoded and the same transactions come out."""
    entries = stream()
    raw = response(entries, "packed")
    resp = pb.PullBinlogsResp.FromString(raw)
    bad = pb.PullBinlogsResp()
    bad.CopyFrom(resp)
    bad.txn_end[0] += 1
    frames_end = resp.txn_end[-1]
    tampered = raw[:frames_end] + pb.PullBinlogsResp(
        txn_commit_ts=bad.txn_commit_ts, txn_start_ts=bad.txn_start_ts, txn_end=bad.txn_end,
        fake_index=bad.fake_index, positioned_index=bad.positioned_index,
        watermark=20).SerializeToString()
    assert plain(read(tampered).items) == plain(read(response(entries, "none")).items)


def test_an_undecodable_positioned_commit_is_corrupt_txn_naming_pump_and_commit_ts() -> None:
    """A packed entry marked positioned whose COMMIT cannot be read (natively, txnjoin.rs
    commit_position) is CorruptTxn naming the pump, start_ts and commit_ts; with skip-corrupt it
    alone is dropped and the other transactions and the watermark still go to the merge."""
    import pytest
    from sluice.drainer.txn import CorruptTxn

    good = response(stream(), "packed")
    # entry 3's COMMIT (positioned): its position's last varint cut (same length, same offsets)
    pos = pb.Binlog(position=pb.Position(file_seq=1, offset=7)).SerializeToString()
    assert good.count(pos) == 1
    raw = good.replace(pos, pos[:-1] + b"\xff")
    resp = pb.PullBinlogsResp.FromString(raw)
    resp_ct = list(resp.txn_commit_ts)
    assert 3 in resp.positioned_index
    r = PumpReader("pump-1", "127.0.0.1:1", 0, Target(), cluster_id=1, consumer_id="d")
    with pytest.raises(CorruptTxn, match=rf"pump pump-1 \(start_ts {resp.txn_start_ts[3]}, "
                                         rf"commit_ts {resp_ct[3]}\): undecodable commit binlog: "):
        r._response_packed(raw, resp)
    t = Target()
    r = PumpReader("pump-1", "127.0.0.1:1", 0, t, cluster_id=1, consumer_id="d", skip_corrupt=True)
    r._response_packed(raw, resp)
    assert [i[0] for i in t.items] == [11, 13, 18] and t.watermark == 20 and r.skipped == 1
