"""The etcd registry of pumps, drainers and producers, their states, and every key's name.

Invariants: a node leaves only by state (its `alive` key vanishing never changes `status`);
states change only along LEGAL_TRANSITIONS; status writes are compare-and-swap on mod_revision,
so none is lost; a watcher never misses a final state (it re-lists when its watch fails).
Key layout, states and watch semantics: docs/registry.md. Everything here blocks; asyncio callers
use `asyncio.to_thread`.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyetcd import utils as etcd_utils

from . import failpoint
from .errors import EtcdUnavailable, IllegalTransition, InvalidArgument, NotFound
from .etcd import Etcd
from .ts import now_ts

log = logging.getLogger(__name__)

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


# A CAS loop that keeps losing for this long is not contention any more: something is wrong.
CAS_MAX_ATTEMPTS = 1000


class NodeKind(enum.StrEnum):
    PUMP = "pumps"
    DRAINER = "drainers"
    PRODUCER = "producers"


class NodeState(enum.StrEnum):
    ONLINE = "online"
    PAUSING = "pausing"
    PAUSED = "paused"
    CLOSING = "closing"
    OFFLINE = "offline"


# TiDB-Binlog's state machine. Staying in the same state is always allowed (a restarting node
# re-registers its state). `pausing -> closing` lets an admin take a pausing node offline;
# `pausing -> online` is not allowed because a pausing node has not finished draining.
LEGAL_TRANSITIONS: dict[NodeState, frozenset[NodeState]] = {
    NodeState.ONLINE: frozenset({NodeState.PAUSING, NodeState.CLOSING}),
    NodeState.PAUSING: frozenset({NodeState.PAUSED, NodeState.CLOSING}),
    NodeState.PAUSED: frozenset({NodeState.ONLINE, NodeState.CLOSING}),
    NodeState.CLOSING: frozenset({NodeState.OFFLINE}),
    NodeState.OFFLINE: frozenset(),
}


def check_transition(node_id: str, old: NodeState, new: NodeState, force: bool = False) -> None:
    """Raise IllegalTransition unless old -> new is legal (or forced)."""
    if force or old == new or new in LEGAL_TRANSITIONS[old]:
        return
    raise IllegalTransition(node_id, old.value, new.value)


def check_node_id(node_id: str) -> None:
    if not node_id or "/" in node_id or node_id.strip() != node_id:
        raise InvalidArgument(f"invalid node id {node_id!r}: must be non-empty, without '/' "
                              "or surrounding spaces")


@dataclass(frozen=True)
class NodeStatus:
    """The persistent status of one node (the `status` key)."""

    node_id: str
    kind: NodeKind
    addr: str
    state: NodeState
    max_commit_ts: int = 0   # pump: the final max commit ts it published
    checkpoint: int = 0      # drainer: its durable checkpoint (inclusive)
    score: int = 0
    epoch: int = 0
    update_ts: int = 0       # stamped by the registry on every write (local clock ts)
    labels: dict[str, str] = field(default_factory=dict)
    # pump: prewrites it could not resolve past txn-timeout, each {pump, start_ts, producer,
    # since_ms, reason, command} (pump/loops.py); empty when nothing is stuck
    alerts: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d["kind"], d["state"] = self.kind.value, self.state.value
        return json.dumps(d, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, data: bytes | str) -> NodeStatus:
        d = json.loads(data)
        known = {f.name for f in dataclasses.fields(cls)}
        # Unknown fields come from a newer version of Sluice: ignore them rather than fail.
        d = {k: v for k, v in d.items() if k in known}
        d["kind"], d["state"] = NodeKind(d["kind"]), NodeState(d["state"])
        d["labels"] = dict(d.get("labels") or {})
        d["alerts"] = [dict(a) for a in d.get("alerts") or [] if isinstance(a, dict)]
        return cls(**d)

    def same_content(self, other: NodeStatus) -> bool:
        """Equal apart from update_ts (a write that changes nothing is skipped)."""
        return dataclasses.replace(self, update_ts=0) == dataclasses.replace(other, update_ts=0)


@dataclass(frozen=True)
class NodeInfo:
    """A node as seen in etcd: its status, whether its alive key exists, the status revision."""

    status: NodeStatus
    alive: bool
    mod_revision: int = 0

    @property
    def node_id(self) -> str:
        return self.status.node_id

    @property
    def state(self) -> NodeState:
        return self.status.state


OnChange = Callable[[NodeKind, str, "NodeInfo | None"], None]


class Registry:
    """Nodes and cluster-level values of one cluster in etcd."""

    def __init__(self, etcd: Etcd, cluster_id: int) -> None:
        self.etcd = etcd
        self.cluster_id = cluster_id
        self.root = cluster_root(cluster_id)

    # -- keys ------------------------------------------------------------------------------
    def kind_prefix(self, kind: NodeKind) -> str:
        return f"{self.root}{NodeKind(kind).value}/"

    def node_prefix(self, kind: NodeKind, node_id: str) -> str:
        check_node_id(node_id)
        return f"{self.kind_prefix(kind)}{node_id}/"

    def key(self, kind: NodeKind, node_id: str, part: str = STATUS) -> str:
        if part not in (STATUS, ALIVE):
            raise InvalidArgument(f"unknown node key part {part!r} ({STATUS} or {ALIVE})")
        return self.node_prefix(kind, node_id) + part

    def drainer_leader_key(self, name: str) -> str:
        return self.node_prefix(NodeKind.DRAINER, name) + DRAINER_LEADER

    def drainer_checkpoint_key(self, name: str) -> str:
        return self.node_prefix(NodeKind.DRAINER, name) + DRAINER_CHECKPOINT

    def drainer_standby_prefix(self, name: str) -> str:
        return f"{self.node_prefix(NodeKind.DRAINER, name)}{STANDBY_SEGMENT}/"

    def drainer_epoch_key(self, name: str) -> str:
        return self.cluster_key(drainer_epoch_path(name))

    def signals_prefix(self, producer_id: str) -> str:
        return self.cluster_key(signals_path(producer_id)) + "/"

    def cluster_key(self, path: str) -> str:
        path = path.strip("/")
        if not path:
            raise InvalidArgument("empty cluster key path")
        return self.root + path

    def exists(self) -> bool:
        """Whether anything of this cluster is in etcd. Nothing marks a cluster as created: the
        first TSO writes its window and every node its status, all under the cluster's root, so
        a cluster id with no key at all is one no process of ours has ever run with."""
        return self.etcd.has_prefix(self.root)

    # -- nodes -----------------------------------------------------------------------------
    def register(self, status: NodeStatus, force: bool = False) -> NodeStatus:
        """Create the node's status, or replace an existing one along a legal transition."""
        check_node_id(status.node_id)
        return self._cas_status(status.kind, status.node_id, lambda _old: status,
                                force=force, create=True)

    def get(self, kind: NodeKind, node_id: str) -> NodeInfo | None:
        prefix = self.node_prefix(kind, node_id)
        kvs, _ = self.etcd.get_prefix(prefix)
        nodes = _group(kind, prefix=self.kind_prefix(kind), kvs=kvs)
        return nodes.get(node_id)

    def list(self, kind: NodeKind) -> tuple[list[NodeInfo], int]:
        """Every node of a kind (sorted by id) and the revision they were read at."""
        kvs, revision = self.etcd.get_prefix(self.kind_prefix(kind))
        nodes = _group(kind, prefix=self.kind_prefix(kind), kvs=kvs)
        return [nodes[k] for k in sorted(nodes)], revision

    def update(self, kind: NodeKind, node_id: str, fn: Callable[[NodeStatus], NodeStatus],
               force: bool = False) -> NodeStatus:
        """Apply fn to the current status with compare-and-swap; returns the stored status.

        fn may be called several times (once per conflicting write); it must be pure. Raises
        NotFound for an unknown node and IllegalTransition for an illegal state change.
        """
        return self._cas_status(kind, node_id, fn, force=force, create=False)

    def set_state(self, kind: NodeKind, node_id: str, state: NodeState,
                  force: bool = False) -> NodeStatus:
        return self.update(kind, node_id, lambda s: dataclasses.replace(s, state=NodeState(state)),
                           force=force)

    def delete(self, kind: NodeKind, node_id: str) -> bool:
        """Remove a node's keys (admin only: nodes leave by state, see the module docstring)."""
        check_node_id(node_id)
        prefix = f"{self.kind_prefix(kind)}{node_id}/"
        tx = self.etcd.tx
        ok, responses = self.etcd.txn(
            [], [tx.delete(prefix, range_end=etcd_utils.prefix_range_end(prefix.encode()))])
        deleted = bool(responses and responses[0].response_delete_range.deleted)
        log.warning("registry: deleted node %s/%s", NodeKind(kind).value, node_id)
        return ok and deleted

    def _cas_status(self, kind: NodeKind, node_id: str, fn: Callable[[NodeStatus], NodeStatus],
                    force: bool, create: bool) -> NodeStatus:
        kind = NodeKind(kind)
        key = self.key(kind, node_id, STATUS)
        tx = self.etcd.tx
        for _ in range(CAS_MAX_ATTEMPTS):
            raw, meta = self.etcd.get(key)
            if raw is None:
                if not create:
                    raise NotFound(f"no {kind.value} node {node_id!r} in cluster {self.cluster_id}")
                new = fn(None)  # type: ignore[arg-type]
                self._check_identity(new, kind, node_id)
                new = dataclasses.replace(new, update_ts=now_ts())
                ok, _ = self.etcd.txn([tx.version(key) == 0], [tx.put(key, new.to_json())])
            else:
                old = NodeStatus.from_json(raw)
                new = fn(old)
                self._check_identity(new, kind, node_id)
                check_transition(node_id, old.state, new.state, force)
                if new.same_content(old):
                    return old
                new = dataclasses.replace(new, update_ts=max(now_ts(), old.update_ts + 1))
                ok, _ = self.etcd.txn([tx.mod(key) == meta.mod_revision],
                                      [tx.put(key, new.to_json())])
            if ok:
                return new
        raise EtcdUnavailable(f"registry: {key} kept changing under {CAS_MAX_ATTEMPTS} "
                              "compare-and-swap attempts")

    @staticmethod
    def _check_identity(status: NodeStatus, kind: NodeKind, node_id: str) -> None:
        if status.node_id != node_id or NodeKind(status.kind) != kind:
            raise InvalidArgument(f"status of {kind.value}/{node_id} cannot become "
                                  f"{status.kind.value}/{status.node_id}")

    def heartbeat(self, kind: NodeKind, node_id: str, ttl: int) -> Heartbeat:
        """A (not yet started) Heartbeat for the node's alive key."""
        value = json.dumps({"node_id": node_id, "pid": os.getpid(), "host": socket.gethostname()})
        return Heartbeat(self.etcd, self.key(kind, node_id, ALIVE), value, ttl)

    def watch(self, kind: NodeKind, on_change: OnChange,
              since: tuple[list[NodeInfo], int] | None = None, resync_s: float = 5.0) -> Watcher:
        """A started Watcher (see Watcher)."""
        w = Watcher(self, kind, on_change, since=since, resync_s=resync_s)
        w.start()
        return w

    # -- cluster-level values ----------------------------------------------------------------
    def get_json_rev(self, path: str) -> tuple[Any, int]:
        """(value or None, mod_revision or 0 when absent)."""
        raw, meta = self.etcd.get(self.cluster_key(path))
        if raw is None:
            return None, 0
        return json.loads(raw), meta.mod_revision

    def get_json(self, path: str) -> Any:
        return self.get_json_rev(path)[0]

    def put_json(self, path: str, value: Any) -> int:
        """Unconditional write; returns its revision."""
        return self.etcd.put(self.cluster_key(path), json.dumps(value, sort_keys=True))

    def cas_json(self, path: str, expect_mod_revision: int, value: Any) -> bool:
        """Write only if the key's mod_revision is still expect_mod_revision (0: absent)."""
        key = self.cluster_key(path)
        tx = self.etcd.tx
        cond = tx.version(key) == 0 if expect_mod_revision == 0 else tx.mod(key) == expect_mod_revision
        ok, _ = self.etcd.txn([cond], [tx.put(key, json.dumps(value, sort_keys=True))])
        return ok

    def update_json(self, path: str, fn: Callable[[Any], Any]) -> Any:
        """Compare-and-swap loop: store fn(current or None); returns what was stored."""
        for _ in range(CAS_MAX_ATTEMPTS):
            old, rev = self.get_json_rev(path)
            new = fn(old)
            if self.cas_json(path, rev, new):
                return new
        raise EtcdUnavailable(f"registry: {self.cluster_key(path)} kept changing under "
                              f"{CAS_MAX_ATTEMPTS} compare-and-swap attempts")


def _split(prefix: str, key: bytes | str) -> tuple[str, str] | None:
    k = key.decode() if isinstance(key, bytes) else key
    if not k.startswith(prefix):
        return None
    node_id, sep, part = k[len(prefix):].partition("/")
    if not sep or part not in (STATUS, ALIVE):
        return None
    return node_id, part


def _group(kind: NodeKind, prefix: str, kvs: list[tuple[bytes, Any]]) -> dict[str, NodeInfo]:
    statuses: dict[str, tuple[NodeStatus, int]] = {}
    alive: set[str] = set()
    for value, meta in kvs:
        split = _split(prefix, meta.key)
        if split is None:
            continue
        node_id, part = split
        if part == ALIVE:
            alive.add(node_id)
        else:
            statuses[node_id] = (_parse_status(node_id, value), meta.mod_revision)
    return {nid: NodeInfo(st, nid in alive, rev) for nid, (st, rev) in statuses.items()}


def _parse_status(node_id: str, value: bytes) -> NodeStatus:
    try:
        return NodeStatus.from_json(value)
    except (ValueError, KeyError, TypeError) as e:
        raise InvalidArgument(f"registry: unreadable status of node {node_id!r}: {e}") from None


class Heartbeat:
    """A lease-backed key kept alive by a background thread.

    Keepalive every ttl/3. If the lease is lost (it expired while etcd or this process was
    stalled), a new lease is granted and the key put again — unless `reacquire=False` (leader
    keys), in which case the heartbeat stops and `lost` becomes true.
    """

    FAILPOINT = "registry-heartbeat-keepalive"

    def __init__(self, etcd: Etcd, key: str, value: bytes | str, ttl: int,
                 reacquire: bool = True) -> None:
        if ttl < 1:
            raise InvalidArgument(f"heartbeat ttl must be >= 1 s, got {ttl}")
        self.etcd, self.key, self.value, self.ttl = etcd, key, value, int(ttl)
        self.reacquire = reacquire
        self._lock = threading.Lock()
        self._lease_id: int | None = None
        self._alive_until = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost = False
        self.reacquired = 0  # how many times the lease was lost and granted again

    @property
    def lease_id(self) -> int | None:
        with self._lock:
            return self._lease_id

    def alive_until_monotonic(self) -> float:
        """Monotonic send time of the last acknowledged keepalive (or grant) + its TTL."""
        with self._lock:
            return self._alive_until

    def start(self) -> Heartbeat:
        """Grant the lease and put the key now (raises EtcdUnavailable), then keep it alive."""
        self._acquire()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat {self.key}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and revoke the lease (which deletes the key)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        lease = self.lease_id
        if lease is not None and not self.lost:
            try:
                self.etcd.revoke(lease)
            except EtcdUnavailable as e:
                log.warning("heartbeat %s: revoke failed, key expires with its lease: %s", self.key, e)
        with self._lock:
            self._lease_id, self._alive_until = None, 0.0

    def _acquire(self) -> None:
        sent = time.monotonic()
        lease = self.etcd.grant(self.ttl)
        with self._lock:
            self._lease_id = lease
        self.etcd.put(self.key, self.value, lease=lease)
        with self._lock:
            self._alive_until = sent + self.ttl

    def _run(self) -> None:
        interval = max(self.ttl / 3.0, 0.1)
        retry = min(interval, 0.5)
        need_acquire = failing = False
        wait = interval
        while not self._stop.wait(wait):
            try:
                failpoint.inject(self.FAILPOINT)
                if need_acquire:
                    self._acquire()
                    need_acquire = False
                    self.reacquired += 1
                    log.warning("heartbeat %s: lease was lost; granted a new one and put the key "
                                "again", self.key)
                    wait = interval
                else:
                    sent = time.monotonic()
                    lease = self.lease_id
                    remaining = self.etcd.keepalive(lease) if lease is not None else 0
                    if remaining > 0:
                        with self._lock:
                            self._alive_until = sent + min(remaining, self.ttl)
                        wait = interval
                    else:
                        with self._lock:
                            self._alive_until = 0.0
                        if not self.reacquire:
                            self.lost = True
                            log.warning("heartbeat %s: lease lost; not reacquiring", self.key)
                            return
                        need_acquire, wait = True, 0.0
            except EtcdUnavailable as e:
                # Once per outage at warning level: retries every 0.5 s would flood the log.
                if not failing:
                    log.warning("heartbeat %s: %s; retrying", self.key, e)
                failing, wait = True, retry
                continue
            if failing:
                log.info("heartbeat %s: etcd reachable again", self.key)
                failing = False


class Watcher:
    """Delivers every change of a kind's nodes to on_change(kind, node_id, NodeInfo | None).

    Status and alive changes are both changes; None means the node's status key is gone (admin
    delete). Baseline: `since=(nodes, R)` from a `Registry.list` the caller already acted on
    (DESIGN §2.4: list at R, watch from R+1); without it the watcher lists itself and delivers
    every existing node first. Callbacks run on the watcher's own thread, in order.

    pyetcd reports a dead stream (etcd restarted, connection closed) by calling the callback
    with the gRPC error — or with None when the stream ended without one, e.g. when another call
    on the same client failed and the library closed its watcher — and a compacted start
    revision with RevisionCompactedError. All three lead to: re-list, deliver the differences,
    watch again from the new revision. Every `resync_s` without a watch response the watcher
    also re-lists (a stream can stall without an error); events at or below the re-list's
    revision are then dropped, since the list already reflects them.
    """

    QUEUE_SIZE = 1024

    def __init__(self, registry: Registry, kind: NodeKind, on_change: OnChange,
                 since: tuple[list[NodeInfo], int] | None = None, resync_s: float = 5.0) -> None:
        self.registry, self.kind, self.on_change = registry, NodeKind(kind), on_change
        self.prefix = registry.kind_prefix(kind)
        self.resync_s = resync_s
        self._since = since
        # Node view: status (with its revision) and alive flag, independently, as etcd has them.
        self._status: dict[str, tuple[NodeStatus, int]] = {}
        self._alive: set[str] = set()
        self._delivered: dict[str, NodeInfo] = {}
        self._floor = 0          # events at or below this revision are already reflected
        self.revision = 0        # highest revision seen (list or watch header)
        self._gen = 0
        self._watch_id: int | None = None
        self._q: queue.Queue[tuple[int, Any]] = queue.Queue(self.QUEUE_SIZE)
        self._overflow = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.resyncs = 0         # re-lists after a failure or a stall (observability, tests)

    # -- public ----------------------------------------------------------------------------
    def start(self) -> Watcher:
        """Establish the baseline and the watch now (raises EtcdUnavailable), then run."""
        pending: list[tuple[str, NodeInfo | None]] = []
        if self._since is not None:
            nodes, rev = self._since
            self._load(nodes, rev)
            self._delivered = {n.node_id: n for n in nodes}
        else:
            nodes, rev = self.registry.list(self.kind)
            self._load(nodes, rev)
            pending = [(n.node_id, n) for n in nodes]
        self._watch_from(self._floor + 1)
        self._thread = threading.Thread(target=self._run, args=(pending,),
                                        name=f"watch {self.prefix}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._cancel()
        try:
            self._q.put_nowait((-1, None))
        except queue.Full:
            pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def nodes(self) -> dict[str, NodeInfo]:
        """The view as last delivered to on_change."""
        with self._lock:
            return dict(self._delivered)

    # -- internals -------------------------------------------------------------------------
    def _load(self, nodes: list[NodeInfo], revision: int) -> None:
        self._status = {n.node_id: (n.status, n.mod_revision) for n in nodes}
        self._alive = {n.node_id for n in nodes if n.alive}
        self._floor = revision
        self.revision = max(self.revision, revision)

    def _view(self, node_id: str) -> NodeInfo | None:
        st = self._status.get(node_id)
        if st is None:
            return None
        return NodeInfo(st[0], node_id in self._alive, st[1])

    def _deliver(self, node_id: str) -> None:
        info = self._view(node_id)
        with self._lock:
            if self._delivered.get(node_id) == info:
                return
            if info is None:
                self._delivered.pop(node_id, None)
            else:
                self._delivered[node_id] = info
        try:
            self.on_change(self.kind, node_id, info)
        except Exception:  # noqa: BLE001 - a consumer bug must not kill the watch
            log.exception("watcher %s: on_change failed for %s", self.prefix, node_id)

    def _callback(self, gen: int, item: Any) -> None:
        # Runs on pyetcd's stream thread: never block it (it also has to deliver the created
        # response of our next watch), so a full queue is a flag that forces a re-list.
        if gen != self._gen or self._stop.is_set():
            return
        try:
            self._q.put_nowait((gen, item))
        except queue.Full:
            self._overflow = True

    def _watch_from(self, revision: int) -> None:
        self._cancel()
        self._gen += 1
        gen = self._gen
        self._watch_id = self.registry.etcd.watch_prefix(
            self.prefix, lambda item: self._callback(gen, item), start_revision=revision)

    def _cancel(self) -> None:
        if self._watch_id is not None:
            self.registry.etcd.cancel_watch(self._watch_id)
            self._watch_id = None

    def _run(self, pending: list[tuple[str, NodeInfo | None]]) -> None:
        try:
            self._loop(pending)
        finally:
            self._cancel()  # a watch re-created while stop() ran must not outlive the thread

    def _loop(self, pending: list[tuple[str, NodeInfo | None]]) -> None:
        for node_id, _ in pending:
            self._deliver(node_id)
        last_response = time.monotonic()
        while not self._stop.is_set():
            if self._overflow:
                self._overflow = False
                log.warning("watcher %s: event queue overflowed; re-listing", self.prefix)
                self._resync(rewatch=True)
                continue
            timeout = max(0.05, self.resync_s - (time.monotonic() - last_response))
            try:
                gen, item = self._q.get(timeout=timeout)
            except queue.Empty:
                # Quiet for resync_s: re-list; if that shows a change the stream did not bring,
                # the stream is stalled: watch again.
                changed = self._resync(rewatch=False)
                if changed:
                    log.info("watcher %s: re-list found changes the watch missed; re-watching",
                             self.prefix)
                    self._resync(rewatch=True)
                last_response = time.monotonic()
                continue
            if self._stop.is_set():
                return
            if gen != self._gen:
                continue
            last_response = time.monotonic()
            if isinstance(item, Exception) or item is None:
                log.info("watcher %s: watch ended (%s); re-listing",
                         self.prefix, type(item).__name__ if item is not None else "stream closed")
                self._resync(rewatch=True)
                continue
            self._apply(item)

    def _apply(self, response: Any) -> None:
        header_rev = int(getattr(response.header, "revision", 0) or 0)
        for event in response.events:
            split = _split(self.prefix, event.key)
            rev = int(event.mod_revision)
            if split is None or rev <= self._floor:
                continue
            node_id, part = split
            is_put = type(event).__name__ == "PutEvent"
            if part == ALIVE:
                if is_put:
                    self._alive.add(node_id)
                else:
                    self._alive.discard(node_id)
            elif is_put:
                try:
                    self._status[node_id] = (NodeStatus.from_json(event.value), rev)
                except (ValueError, KeyError, TypeError) as e:
                    log.error("watcher %s: unreadable status of %s at revision %d: %s",
                              self.prefix, node_id, rev, e)
                    continue
            else:
                self._status.pop(node_id, None)
            self.revision = max(self.revision, rev)
            self._deliver(node_id)
        self.revision = max(self.revision, header_rev)

    def _resync(self, rewatch: bool) -> bool:
        """Re-list (retrying while etcd is down), deliver the differences; maybe watch again.

        Returns whether the list differed from what had been delivered.
        """
        backoff = 0.1
        while not self._stop.is_set():
            try:
                if rewatch:
                    self._cancel()
                nodes, rev = self.registry.list(self.kind)
                self.resyncs += 1
                known = set(self._status) | {n.node_id for n in nodes}
                self._load(nodes, rev)
                with self._lock:
                    before = dict(self._delivered)
                for node_id in sorted(known):
                    self._deliver(node_id)
                with self._lock:
                    changed = before != self._delivered
                if rewatch:
                    self._watch_from(rev + 1)
                return changed
            except Exception as e:  # noqa: BLE001 - etcd down, compacted again, timeouts
                if backoff == 0.1:  # first failure of this outage; later ones are the same story
                    log.warning("watcher %s: re-list/watch failed, retrying: %s", self.prefix, e)
                rewatch = True
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 1.0)
        return False
