"""Building binlogs and timestamps for tests (real TSO timestamps: pumps order by them)."""
from __future__ import annotations

import grpc

from sluice.proto import sluice_pb2 as pb
from sluice.proto import sluice_pb2_grpc as pbg


class TS:
    """Blocking GetTS against a list of TSO addresses (follows whichever answers)."""

    def __init__(self, addrs: list[str], cluster_id: int) -> None:
        self.addrs, self.cluster_id = addrs, cluster_id
        self.channels = {a: grpc.insecure_channel(a) for a in addrs}

    def get(self, count: int = 1) -> int:
        last: Exception | None = None
        for _ in range(50):
            for addr, ch in self.channels.items():
                try:
                    return pbg.TSOStub(ch).GetTS(pb.GetTSReq(cluster_id=self.cluster_id,
                                                             count=count), timeout=2).first_ts
                except grpc.RpcError as e:
                    last = e
            import time
            time.sleep(0.1)
        raise AssertionError(f"no TSO answered: {last}")

    def close(self) -> None:
        for ch in self.channels.values():
            ch.close()


def pv(text: str) -> bytes:
    """A valid serialized PrewriteValue whose content is `text` (pumps refuse prewrite values
    that do not decode): distinct texts make distinct values, len(text) sets the size."""
    return pb.PrewriteValue(schema_version=1, source=pb.SourceInfo(name=text)).SerializeToString()


def prewrite(start_ts: int, value: bytes = b"", producer: str = "test-producer", epoch: int = 0,
             part_no: int = 0, part_count: int = 0) -> bytes:
    if not value:
        value = pb.PrewriteValue(schema_version=1).SerializeToString()
    return pb.Binlog(tp=pb.PREWRITE, start_ts=start_ts, prewrite_value=value, producer_id=producer,
                     producer_epoch=epoch, part_no=part_no, part_count=part_count).SerializeToString()


def commit(start_ts: int, commit_ts: int, producer: str = "test-producer", epoch: int = 0,
           position: pb.Position | None = None) -> bytes:
    b = pb.Binlog(tp=pb.COMMIT, start_ts=start_ts, commit_ts=commit_ts, producer_id=producer,
                  producer_epoch=epoch)
    if position is not None:
        b.position.CopyFrom(position)
    return b.SerializeToString()


def rollback(start_ts: int, producer: str = "test-producer") -> bytes:
    return pb.Binlog(tp=pb.ROLLBACK, start_ts=start_ts, producer_id=producer).SerializeToString()


def decode(payload: bytes) -> pb.Binlog:
    return pb.Binlog.FromString(payload)


class LibraryColumn:
    """A column as mysql-replication's TableMapEvent lists it (the fields SchemaTracker reads)."""

    def __init__(self, name: str, type_: int) -> None:
        self.name, self.type, self.unsigned = name, type_, False
        self.collation_name = self.character_set_name = None
        self.enum_values = self.set_values = None


class LibraryOptionalMetadata:
    """A TableMap's optional metadata with the first column as the primary key."""

    simple_primary_key_list = [0]
    primary_keys_with_prefix: dict = {}
