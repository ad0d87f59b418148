"""Drainer HA: one active drainer per name, elected by an etcd lease, fenced by an epoch (DESIGN §6).

Keys, under `/sluice/<cluster>/`:

    drainers/<name>/leader          lease-backed: {"addr", "epoch", "lease", "ttl", "pid", "host"}
    drainers/<name>/standby/<addr>  lease-backed, one per waiting standby (shown by the active
                                    as the `standby` label of the drainer's status)
    drainer-epochs/<name>           persistent: {"epoch", "addr", "ttl", "released"}

Invariants:
- **Epochs strictly increase across takeovers**: the epoch counter is bumped in the same etcd
  transaction that creates the leader key, conditioned on the leader key being absent and the
  counter unchanged since it was read. The counter lives outside the node's key prefix, so even
  `ctl delete` of the drainer does not reset it (a downstream that stored epoch N keeps fencing
  everything below it).
- **A stale drainer writes nothing**: the active writes only while its lease is certainly alive
  (core/lease.py: monotonic send time of the last acknowledged keepalive + TTL − margin),
  checked right before every hand-over to the sink and every etcd write; its checkpoint write is
  a transaction conditioned on the epoch counter's revision (any takeover changes it), so a
  stale drainer can never overwrite the new one's checkpoint; the sink fences every write by the
  epoch passed in its context (MySQL, Spark). When the lease is not certainly alive the drainer
  exits at once, without flushing anything (see DrainerServer).
- **The standby waits TTL + margin after the active's lease is gone** (measured on its own
  monotonic clock from when it saw the leader key absent) before campaigning, so a write the old
  active started just before its deadline has landed before the new active opens the sink — unless
  the old one *released* (clean stop: the counter is marked released in the transaction that
  deletes the leader key), which proves it writes nothing more.

With `ha = false` the drainer takes an epoch all the same (sinks always fence) but holds no
leader key and never waits: the single-drainer behaviour is unchanged. It refuses to start while
an HA drainer of the same name holds the leader key.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from sluice.core.errors import ConfigError, EtcdUnavailable, NotFound, StaleEpoch
from sluice.core.etcd import Etcd
from sluice.core.keywatch import KeyWatch
from sluice.core.lease import LeaseKeeper
from sluice.core.registry import Heartbeat, NodeKind, NodeStatus, Registry
from sluice.drainer.checkpoint import read_checkpoint
from sluice.drainer.sink import Checkpoint

log = logging.getLogger(__name__)

__all__ = ["DrainerFenced", "LeadershipLost", "Term", "Election", "FencedCheckpointStore",
           "read_leader", "read_epoch",
           "list_standbys"]


class DrainerFenced(StaleEpoch):
    """Another drainer of the same name took a newer epoch: this one must write nothing more."""


class LeadershipLost(StaleEpoch):
    """The active drainer's lease is not certainly alive any more."""


@dataclasses.dataclass(frozen=True)
class LeaderInfo:
    addr: str
    epoch: int
    lease: int
    ttl: int
    pid: int = 0
    host: str = ""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: bytes | str) -> LeaderInfo:
        d = json.loads(raw)
        return cls(addr=str(d["addr"]), epoch=int(d["epoch"]), lease=int(d.get("lease", 0)),
                   ttl=int(d.get("ttl", 0)), pid=int(d.get("pid", 0)), host=str(d.get("host", "")))


@dataclasses.dataclass(frozen=True)
class EpochRecord:
    epoch: int
    addr: str = ""
    ttl: int = 0
    released: bool = False

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: bytes | str) -> EpochRecord:
        d = json.loads(raw)
        return cls(epoch=int(d["epoch"]), addr=str(d.get("addr", "")), ttl=int(d.get("ttl", 0)),
                   released=bool(d.get("released", False)))


def read_leader(registry: Registry, name: str) -> LeaderInfo | None:
    raw, _ = registry.etcd.get(registry.drainer_leader_key(name))
    return None if raw is None else LeaderInfo.from_json(raw)


def read_epoch(registry: Registry, name: str) -> EpochRecord | None:
    raw, _ = registry.etcd.get(registry.drainer_epoch_key(name))
    return None if raw is None else EpochRecord.from_json(raw)


def list_standbys(registry: Registry, name: str) -> list[str]:
    """Addresses of the standbys of drainer `name` that are alive now (sorted)."""
    prefix = registry.drainer_standby_prefix(name)
    kvs, _ = registry.etcd.get_prefix(prefix)
    return sorted(meta.key.decode()[len(prefix):] for _, meta in kvs)


@dataclasses.dataclass(frozen=True)
class Term:
    """This process's tenure as the active drainer."""

    epoch: int
    epoch_rev: int            # mod_revision of the epoch counter written with our bump
    lease: int | None         # the leader lease (ha); None without ha
    ttl: int


class Election:
    """Takes (and gives back) the right to be drainer `name`'s active instance. Blocking calls."""

    def __init__(self, registry: Registry, name: str, addr: str, *, ha: bool, ttl: int,
                 margin_s: float, keepalive_etcd: Etcd | None = None,
                 on_lost: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, poll_s: float = 0.1) -> None:
        self.registry = registry
        self.etcd = registry.etcd
        self.name, self.addr = name, addr
        self.ha = ha
        self.ttl = int(ttl)
        self.margin_s = margin_s
        self.keepalive_etcd = keepalive_etcd or registry.etcd
        self.on_lost = on_lost
        self.clock = clock
        self.poll_s = poll_s
        self.leader_key = registry.drainer_leader_key(name)
        self.epoch_key = registry.drainer_epoch_key(name)
        self.term: Term | None = None
        self.keeper: LeaseKeeper | None = None
        self._standby_hb: Heartbeat | None = None

    # -- taking the epoch -----------------------------------------------------------------------
    def take_without_ha(self) -> Term:
        """ha = false: bump the epoch (no leader key, no waiting); refuse if an HA drainer is active."""
        tx = self.etcd.tx
        for _ in range(100):
            leader_raw, _ = self.etcd.get(self.leader_key)
            if leader_raw is not None:
                info = LeaderInfo.from_json(leader_raw)
                raise ConfigError(
                    f"drainer {self.name} is active under HA at {info.addr} (epoch {info.epoch}): "
                    "stop it first, or start this one with ha = true to run as its standby")
            raw, meta = self.etcd.get(self.epoch_key)
            old = EpochRecord.from_json(raw) if raw is not None else None
            new = EpochRecord(epoch=(old.epoch if old else 0) + 1, addr=self.addr, ttl=0)
            ok, resp = self.etcd.txn(
                [tx.version(self.leader_key) == 0, self._unchanged(meta)],
                [tx.put(self.epoch_key, new.to_json()), tx.get(self.epoch_key)])
            if ok:
                self.term = Term(new.epoch, resp[1][0][1].mod_revision, None, 0)
                log.info("drainer %s took epoch %d (ha off)", self.name, new.epoch)
                return self.term
        raise EtcdUnavailable(f"drainer {self.name}: the epoch counter {self.epoch_key} kept "
                              "changing; is another drainer with this name starting?")

    def campaign(self, stop: threading.Event) -> Term | None:
        """ha = true: wait as a standby until this instance is the active one (None if stopped).

        Registers a lease-backed standby key while waiting, so `ctl drainers` can show it.
        """
        self._standby_hb = Heartbeat(self.etcd, self.registry.drainer_standby_prefix(self.name) + self.addr,
                                     json.dumps({"addr": self.addr, "pid": os.getpid()}),
                                     max(self.ttl, 1))
        self._standby_hb.start()
        try:
            return self._campaign(stop)
        finally:
            self._standby_hb.stop()
            self._standby_hb = None

    def _campaign(self, stop: threading.Event) -> Term | None:
        # The leader key is watched: a standby reads it when it changed (the active's lease
        # expired or it released) or every few seconds, not every poll_s (issue #23: ten
        # Range requests a second per standby); poll_s is only how often `stop` is checked.
        watch = KeyWatch(self.etcd, self.leader_key)
        watch.start()
        try:
            return self._campaign_watched(stop, watch)
        finally:
            watch.cancel()

    def _campaign_watched(self, stop: threading.Event, watch: KeyWatch) -> Term | None:
        seen: LeaderInfo | None = None
        gone_at: float | None = None
        wait_s = 0.0
        rec: EpochRecord | None = None
        meta: Any = None
        etcd_failing = False
        due = True
        while not stop.is_set():
            try:
                if due:
                    leader_raw, _ = self.etcd.get(self.leader_key)
                    if leader_raw is not None:
                        info = LeaderInfo.from_json(leader_raw)
                        if info != seen:
                            log.info("drainer %s: standby at %s; the active one is %s (epoch %d); "
                                     "waiting", self.name, self.addr, info.addr, info.epoch)
                        seen, gone_at = info, None
                        due = watch.wait(self.poll_s)
                        continue
                    raw, meta = self.etcd.get(self.epoch_key)
                    rec = EpochRecord.from_json(raw) if raw is not None else None
                    if gone_at is None:
                        gone_at = self.clock()
                        if rec is None or rec.released:
                            wait_s = 0.0
                        else:
                            # The last active may have died, or may be stalled: its lease is
                            # gone, but a write it began just before its own deadline may still
                            # land.
                            wait_s = max(self.ttl, rec.ttl) + self.margin_s
                        log.info("drainer %s: no active instance (last epoch %s%s); taking over "
                                 "in %.1fs", self.name, rec.epoch if rec else "none",
                                 ", released" if rec and rec.released else "", wait_s)
                elif gone_at is None:     # an active one holds the key and nothing changed
                    due = watch.wait(self.poll_s)
                    continue
                left = wait_s - (self.clock() - gone_at)
                if left > 0:
                    due = watch.wait(min(self.poll_s, left) + 0.001)
                    continue
                # rec/meta may be from when the key went: the take is conditioned on the
                # counter's revision, so a counter that moved since makes it fail, not wrong.
                term = self._try_take(rec, meta)
                if term is not None:
                    return term
                gone_at, due = None, True   # someone else won (or the counter moved): look again
                etcd_failing = False
            except EtcdUnavailable as e:
                if not etcd_failing:
                    log.warning("drainer %s: standby cannot reach etcd: %s; retrying", self.name, e)
                etcd_failing = True
                gone_at, due = None, True   # what we measured from may be stale
                watch.again()
                stop.wait(min(1.0, self.poll_s * 5))
        return None

    def _try_take(self, rec: EpochRecord | None, meta: Any) -> Term | None:
        tx = self.etcd.tx
        sent = self.clock()
        lease = self.etcd.grant(self.ttl)
        epoch = (rec.epoch if rec else 0) + 1
        info = LeaderInfo(addr=self.addr, epoch=epoch, lease=lease, ttl=self.ttl, pid=os.getpid(),
                          host=socket.gethostname())
        new = EpochRecord(epoch=epoch, addr=self.addr, ttl=self.ttl)
        try:
            ok, resp = self.etcd.txn(
                [tx.version(self.leader_key) == 0, self._unchanged(meta)],
                [tx.put(self.leader_key, info.to_json(), lease),
                 tx.put(self.epoch_key, new.to_json()), tx.get(self.epoch_key)])
        except EtcdUnavailable:
            # Outcome unknown: revoking removes our leader key if it was written.
            self._revoke_quietly(lease)
            raise
        if not ok:
            self._revoke_quietly(lease)
            return None
        self.keeper = LeaseKeeper(self.keepalive_etcd, lease, self.ttl, sent, self.margin_s,
                                  on_lost=self.on_lost, clock=self.clock,
                                  what=f"drainer {self.name} leader lease (epoch {epoch})")
        self.keeper.start()
        self.term = Term(epoch, resp[2][0][1].mod_revision, lease, self.ttl)
        log.info("drainer %s: active at %s with epoch %d (lease ttl %ds)", self.name, self.addr,
                 epoch, self.ttl)
        return self.term

    def _unchanged(self, meta: Any) -> Any:
        tx = self.etcd.tx
        if meta is None:
            return tx.version(self.epoch_key) == 0
        return tx.mod(self.epoch_key) == meta.mod_revision

    def _revoke_quietly(self, lease: int) -> None:
        try:
            self.etcd.revoke(lease)
        except Exception as e:  # noqa: BLE001 - best effort; the lease expires anyway
            log.debug("revoke of lease %x failed: %s", lease, e)

    # -- while active ---------------------------------------------------------------------------
    def check(self) -> None:
        """Raise LeadershipLost unless this instance is certainly still the active one."""
        if self.term is None:
            raise LeadershipLost(f"drainer {self.name} at {self.addr} holds no epoch")
        if self.keeper is not None:
            reason = self.keeper.lost_reason()
            if reason is not None:
                raise LeadershipLost(f"drainer {self.name} (epoch {self.term.epoch}): {reason}")

    def fence_compare(self) -> list[Any]:
        """etcd transaction conditions that hold only while our epoch is the newest."""
        assert self.term is not None
        return [self.etcd.tx.mod(self.epoch_key) == self.term.epoch_rev]

    def fenced_error(self, what: str) -> DrainerFenced:
        rec = None
        try:
            rec = read_epoch(self.registry, self.name)
        except EtcdUnavailable:
            pass
        epoch = self.term.epoch if self.term else 0
        newer = (f"epoch {rec.epoch} taken by {rec.addr or 'another instance'}" if rec
                 else "the epoch counter is gone")
        return DrainerFenced(f"drainer {self.name} at {self.addr} is fenced: {what} refused "
                             f"because this instance has epoch {epoch} and {newer}")

    def put_alive(self, key: str, value: str) -> None:
        """ha: the alive key, bound to the leader lease (it vanishes with our leadership)."""
        assert self.term is not None and self.term.lease is not None
        self.check()
        ok, _ = self.etcd.txn(self.fence_compare(), [self.etcd.tx.put(key, value, self.term.lease)])
        if not ok:
            raise self.fenced_error("registering the alive key")

    def release(self) -> None:
        """Clean stop: mark the epoch released and give up the leader key in one transaction,
        so a standby takes over at once (nothing of ours can land any more)."""
        term = self.term
        if term is None:
            return
        if self.keeper is not None:
            self.keeper.stop(revoke=False)
        tx = self.etcd.tx
        rec = EpochRecord(epoch=term.epoch, addr=self.addr, ttl=term.ttl, released=True)
        try:
            ok, _ = self.etcd.txn(self.fence_compare(), [
                tx.put(self.epoch_key, rec.to_json()),
                *([tx.delete(self.leader_key)] if term.lease is not None else [])])
            if ok:
                log.info("drainer %s released epoch %d", self.name, term.epoch)
        except EtcdUnavailable as e:
            log.warning("drainer %s: could not release epoch %d (a standby waits for the lease "
                        "to expire): %s", self.name, term.epoch, e)
        if term.lease is not None:
            self._revoke_quietly(term.lease)
        self.term = None


class FencedCheckpointStore:
    """The active drainer's checkpoint key, written only under its epoch (blocking calls).

    load/save, and `saved`: the last checkpoint loaded or saved. A save is one etcd
    transaction conditioned on the epoch counter's revision; then the status `checkpoint` mirror is a
    compare-and-swap that refuses a status carrying a newer epoch. Either refusal raises
    DrainerFenced and nothing is written.
    """

    def __init__(self, registry: Registry, name: str, election: Election) -> None:
        self.registry, self.name, self.election = registry, name, election
        self.key = registry.drainer_checkpoint_key(name)
        self.saved: Checkpoint | None = None

    def load(self) -> Checkpoint | None:
        self.saved = read_checkpoint(self.registry, self.name)
        return self.saved

    def save(self, cp: Checkpoint) -> None:
        el = self.election
        el.check()
        etcd = self.registry.etcd
        ok, _ = etcd.txn(el.fence_compare(), [etcd.tx.put(self.key, cp.to_json())])
        if not ok:
            raise el.fenced_error(f"checkpoint {cp.commit_ts}")
        self.saved = cp
        epoch = el.term.epoch if el.term else 0

        def mirror(old: NodeStatus) -> NodeStatus:
            if old.epoch > epoch:
                raise el.fenced_error(f"status mirror of checkpoint {cp.commit_ts}")
            return dataclasses.replace(old, checkpoint=cp.commit_ts)
        try:
            self.registry.update(NodeKind.DRAINER, self.name, mirror)
        except NotFound:
            # Every first start saves a checkpoint before registering: expected, not news.
            log.debug("drainer %s has no status yet; checkpoint %d stored without a status mirror",
                     self.name, cp.commit_ts)
