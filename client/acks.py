"""What a prewrite acknowledgement promises, and prewrites cut to the pumps' size limit.

`PrewriteAck.watermark` is the highest served watermark among the acks of the pumps holding a
prewrite: a commit_ts must be above it (DESIGN §2.2), which `check_commit_ts` enforces.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from sluice.core import errors
from sluice.proto import sluice_pb2 as pb

__all__ = ["PrewriteAck", "CommitNotAcknowledged", "check_commit_ts", "split_prewrite",
           "group_calls"]


@dataclass(frozen=True)
class PrewriteAck:
    start_ts: int               # start_ts of the first prewrite written
    pumps: tuple[str, ...]      # node ids durably holding the prewrite(s) (two with replicas=2)
    watermark: int              # max served watermark over those acks: commit_ts must be > it


class CommitNotAcknowledged(errors.Unavailable):
    """No pump holding the prewrite acknowledged the Commit/Rollback in time.

    The decision is kept and re-sent when the pump is back; the pump also resolves the prewrite
    itself by asking the producer (TxnStatus) after its txn-timeout.
    """


def check_commit_ts(commit_ts: int, ack: PrewriteAck) -> None:
    """Raise FailedPrecondition unless commit_ts > every served watermark the prewrite ack saw."""
    if commit_ts <= ack.watermark:
        raise errors.FailedPrecondition(
            f"commit_ts {commit_ts} is not above the served watermark {ack.watermark} of pump(s) "
            f"{', '.join(ack.pumps)} holding the prewrite of start_ts={ack.start_ts}: the commit_ts "
            "must be fetched after write_prewrites returns (docs/transactions.md); roll the transaction back")


def split_prewrite(binlog: pb.Binlog, max_size: int) -> list[bytes]:
    """The prewrite serialized, as parts (part_no/part_count, same start_ts) of <= max_size bytes."""
    raw = binlog.SerializeToString()
    if len(raw) <= max_size:
        return [raw]
    if binlog.part_count > 1:
        raise errors.InvalidArgument(
            f"prewrite start_ts={binlog.start_ts} part {binlog.part_no} is {len(raw)} bytes, over "
            f"max_binlog_size {max_size}: pre-split parts must each fit")
    env = pb.Binlog()
    env.CopyFrom(binlog)
    env.ClearField("prewrite_value")
    # Room for the value's tag and length varint plus part_no/part_count at their largest.
    chunk = max_size - len(env.SerializeToString()) - 32
    if chunk <= 0:
        raise errors.InvalidArgument(f"max_binlog_size {max_size} leaves no room for prewrite data")
    value = binlog.prewrite_value
    count = math.ceil(len(value) / chunk)
    parts = []
    for i in range(count):
        env.prewrite_value = value[i * chunk:(i + 1) * chunk]
        env.part_no, env.part_count = i, count
        parts.append(env.SerializeToString())
    return parts


def group_calls(payloads: list[bytes], limit: int) -> list[list[bytes]]:
    """Consecutive payloads packed into calls of at most `limit` bytes (one call when it fits)."""
    calls: list[list[bytes]] = []
    cur: list[bytes] = []
    size = 0
    for p in payloads:
        if cur and size + len(p) > limit:
            calls.append(cur)
            cur, size = [], 0
        cur.append(p)
        size += len(p)
    if cur:
        calls.append(cur)
    return calls
