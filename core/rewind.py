"""A producer's pending rewind: `ctl position set` writes it, the capture takes it at start.

`/<cluster>/producers/<producer_id>/rewind` = {"position": text, "generation": N, "set_at_ms"}.
The capture resumes strictly after `position` and stamps every position it writes with
generation N, which orders after every position of a lower generation (core/position.py), so the
pumps' recorded positions and the drainers' per-producer filters follow the rewind unasked.
"""
from __future__ import annotations

from sluice.core.position import parse_position
from sluice.core.registry import Registry, rewind_path
from sluice.proto import sluice_pb2 as pb

__all__ = ["read_rewind", "delete_rewind"]


def read_rewind(registry: Registry, producer_id: str) -> tuple[pb.Position | None, int]:
    """(the pending rewind position with its generation, or None; the key's mod revision)."""
    doc, rev = registry.get_json_rev(rewind_path(producer_id))
    if doc is None:
        return None, 0
    pos = parse_position(doc["position"])
    pos.generation = int(doc["generation"])
    return pos, rev


def delete_rewind(registry: Registry, producer_id: str) -> None:
    registry.etcd.delete(registry.cluster_key(rewind_path(producer_id)))
