"""The drainer checkpoint in etcd: `Checkpoint.to_json()` at `/sluice/<cluster>/drainers/<name>/checkpoint`.

Invariant: checkpoints are inclusive (DESIGN §2.6) — a saved checkpoint says "everything with
commit_ts <= commit_ts is durable in the sink", so it is written only with what the sink reported
durable after a flush; the drainer's status `checkpoint` field mirrors its commit_ts (pumps' GC
reads that) and is written after the key, so GC never runs ahead of the stored checkpoint.

`read_checkpoint` / `write_checkpoint` are the functions `sluice ctl checkpoint` uses; ctl writes
only while the drainer is not alive (a running drainer would overwrite it at its next save).
"""
from __future__ import annotations

import dataclasses
import logging

from sluice.core.errors import NotFound
from sluice.core.position import format_position, parse_position
from sluice.core.registry import NodeKind, NodeStatus, Registry
from sluice.drainer.sink import Checkpoint
from sluice.proto import sluice_pb2 as pb

log = logging.getLogger(__name__)

__all__ = ["read_checkpoint", "write_checkpoint", "encode_positions",
           "decode_positions"]


def read_checkpoint(registry: Registry, name: str) -> Checkpoint | None:
    """The stored checkpoint of drainer `name`, or None if it never saved one (blocking)."""
    raw, _ = registry.etcd.get(registry.drainer_checkpoint_key(name))
    if raw is None:
        return None
    return Checkpoint.from_json(raw)


def write_checkpoint(registry: Registry, name: str, cp: Checkpoint,
                     mirror_status: bool = True) -> None:
    """Store cp as drainer `name`'s checkpoint, then mirror its commit_ts into the drainer's status.

    Blocking. The status mirror is skipped (with a log line) when the drainer has no status yet.
    """
    registry.etcd.put(registry.drainer_checkpoint_key(name), cp.to_json())
    if not mirror_status:
        return

    def mirror(old: NodeStatus) -> NodeStatus:
        return dataclasses.replace(old, checkpoint=cp.commit_ts)
    try:
        registry.update(NodeKind.DRAINER, name, mirror)
    except NotFound:
        # Every first start saves a checkpoint before registering: expected, not news.
        log.debug("drainer %s has no status yet; checkpoint %d stored without a status mirror",
                 name, cp.commit_ts)


def encode_positions(positions: dict[str, pb.Position]) -> dict[str, str]:
    """Producer positions as the checkpoint stores them (`core.position.format_position`)."""
    return {pid: format_position(pos) for pid, pos in sorted(positions.items())}


def decode_positions(positions: dict[str, str]) -> dict[str, pb.Position]:
    return {pid: parse_position(text) for pid, text in positions.items()}

