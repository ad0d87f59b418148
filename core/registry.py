"""The etcd registry of pumps, drainers and producers, and how their changes are watched.

Invariants: a node leaves only by state (its `alive` key vanishing never changes `status`);
status writes are compare-and-swap on mod_revision, so none is lost; a watcher never misses a
final state (it re-lists when its watch fails). The parts: core/nodes.py (kinds, states,
transitions, status records), core/registry_keys.py (every key's name), core/heartbeat.py.
Key layout, states and watch semantics: docs/registry.md. Everything here blocks; asyncio callers
use `asyncio.to_thread`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from pyetcd import utils as etcd_utils

from .errors import EtcdUnavailable, InvalidArgument, NotFound
from .etcd import Etcd
from .heartbeat import Heartbeat
from .nodes import (LEGAL_TRANSITIONS, NodeInfo, NodeKind, NodeState, NodeStatus, OnChange,
                    check_node_id, check_transition)
from .registry_keys import (ALIVE, CONFIG_PATH, DRAINER_CHECKPOINT, DRAINER_LEADER, ROOT,
                            STANDBY_SEGMENT, STATUS, captured_tables_path, cluster_root,
                            drainer_epoch_path, producer_path, rewind_path, signals_path,
                            snapshot_progress_path, tso_leader_key, tso_window_key)
from .ts import now_ts

__all__ = ["ALIVE", "CAS_MAX_ATTEMPTS", "CONFIG_PATH", "DRAINER_CHECKPOINT", "DRAINER_LEADER",
           "LEGAL_TRANSITIONS", "ROOT", "STANDBY_SEGMENT", "STATUS", "Heartbeat", "NodeInfo",
           "NodeKind", "NodeState", "NodeStatus", "OnChange", "Registry", "Watcher",
           "captured_tables_path", "check_node_id", "check_transition", "cluster_root",
           "drainer_epoch_path", "producer_path", "rewind_path", "signals_path",
           "snapshot_progress_path", "tso_leader_key", "tso_window_key"]

log = logging.getLogger(__name__)


# A CAS loop that keeps losing for this long is not contention any more: something is wrong.
CAS_MAX_ATTEMPTS = 1000


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
