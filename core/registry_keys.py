"""The name of every key Sluice keeps in etcd. Layout: docs/registry.md."""

from __future__ import annotations

from .nodes import NodeKind, check_node_id


ROOT = "/sluice"

# -- key names ---------------------------------------------------------------------------------
# Every key Sluice keeps in etcd is named here and nowhere else. Node keys sit under
# `<kind>/<node_id>/`; a *path* is relative to the cluster root (Registry.cluster_key, get_json);
# a *key* is absolute.
STATUS, ALIVE = "status", "alive"            # a node's persistent status / lease-backed heartbeat
DRAINER_LEADER = "leader"                    # drainers/<name>/leader: the active HA instance
DRAINER_CHECKPOINT = "checkpoint"            # drainers/<name>/checkpoint: Checkpoint.to_json()
STANDBY_SEGMENT = "standby"                  # drainers/<name>/standby/<addr>: waiting standbys
CONFIG_PATH = "config"                       # {"replicas": N}, shared by pumps and clients


def cluster_root(cluster_id: int) -> str:
    """`/sluice/<cluster_id>/`: everything of one cluster lives below it."""
    return f"{ROOT}/{cluster_id}/"


def tso_leader_key(cluster_id: int) -> str:
    """The TSO leader (LeaderInfo JSON, bound to the leader's lease)."""
    return f"{cluster_root(cluster_id)}tso/leader"


def tso_window_key(cluster_id: int) -> str:
    """The TSO's persisted upper bound of timestamps it may hand out."""
    return f"{cluster_root(cluster_id)}tso/window"


def drainer_epoch_path(name: str) -> str:
    """The HA epoch counter of drainer `name` (fencing)."""
    check_node_id(name)
    return f"drainer-epochs/{name}"


def producer_path(producer_id: str, leaf: str) -> str:
    """`producers/<id>/<leaf>`: per-producer values beside the node's status and alive keys
    (the registry's node listing reads only those two)."""
    check_node_id(producer_id)
    return f"{NodeKind.PRODUCER.value}/{producer_id}/{leaf}"


def rewind_path(producer_id: str) -> str:
    """A producer's pending rewind (`ctl position set`, core/rewind.py)."""
    return producer_path(producer_id, "rewind")


def signals_path(producer_id: str) -> str:
    """The prefix (without the trailing '/') of a read-only capture's etcd snapshot signals."""
    return producer_path(producer_id, "signals")


def snapshot_progress_path(producer_id: str) -> str:
    """Where a capture publishes its snapshot progress for `sluice ctl snapshot status`."""
    return producer_path(producer_id, "snapshot")


def captured_tables_path(producer_id: str) -> str:
    """The tables a capture declared it captures (a newly captured one gets a snapshot)."""
    check_node_id(producer_id)
    return f"capture-tables/{producer_id}"
