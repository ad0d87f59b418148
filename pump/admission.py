"""Which producers a pump takes prewrites from (DESIGN §3 unresolved prewrites, §9).

Invariant: a prewrite is stored only if the registry holds its producer (`producers/<id>`) in a
state other than offline — the entry a pump reads after `txn-timeout` to resolve it (TxnStatus
at its address, or a decision in its outbox). A prewrite nobody could resolve would hold this
pump's watermark, and every drainer's merge, until an operator stepped in.

The check runs on the storage committer thread for every new prewrite, so it is a dict lookup:
the view is kept by a registry watch of the producers. A producer that registered a moment ago
may not be in the view yet; a miss therefore makes the service re-read that one producer from
etcd once (`refresh`) and retry, and a producer found absent is not asked again for
`NEGATIVE_TTL_S`, so garbage ids cannot turn writes into etcd reads.
"""
from __future__ import annotations

import logging
import threading
import time

from google.protobuf.message import DecodeError

from sluice.core.errors import InvalidArgument, UnknownProducer
from sluice.core.registry import NodeInfo, NodeKind, NodeState, NodeStatus, Registry, Watcher
from sluice.proto import sluice_pb2 as pb

log = logging.getLogger(__name__)

NEGATIVE_TTL_S = 1.0
_MAX_NEGATIVE = 4096


def admissible(status: NodeStatus | None) -> bool:
    return status is not None and status.state != NodeState.OFFLINE


class ProducerAdmission:
    """The producers' registry view and the admission rule; see the module docstring."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._known: dict[str, NodeStatus] = {}
        self._absent: dict[str, float] = {}     # producer id -> monotonic time of the miss
        self._lock = threading.Lock()
        self._watcher: Watcher | None = None

    # -- view ------------------------------------------------------------------------------
    def start(self) -> None:
        """List the producers and watch them (blocking: call in a thread)."""
        self._watcher = self.registry.watch(NodeKind.PRODUCER, self._on_change)

    def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None

    def _on_change(self, kind: NodeKind, node_id: str, info: NodeInfo | None) -> None:
        with self._lock:
            if info is None:
                self._known.pop(node_id, None)
            else:
                self._known[node_id] = info.status
                self._absent.pop(node_id, None)

    # -- the rule --------------------------------------------------------------------------
    def check(self, producer_id: str) -> None:
        """Raise UnknownProducer unless the view admits `producer_id` (no I/O)."""
        status = self._known.get(producer_id)
        if admissible(status):
            return
        if status is None:
            raise UnknownProducer(
                f"producer_id {producer_id!r} is not registered in this cluster "
                f"(no producers/{producer_id} in etcd): a pump takes prewrites only from "
                "registered producers, which it can ask to resolve them", producer_id)
        raise UnknownProducer(
            f"producer_id {producer_id!r} is offline in the registry: a pump takes no new "
            "prewrites from an offline producer", producer_id)

    @staticmethod
    def check_value(value: bytes) -> pb.PrewriteValue:
        """Raise InvalidArgument unless a whole prewrite value parses as a PrewriteValue (every
        drainer decodes it; one that cannot would stop them all at that commit_ts); returns
        it decoded (the storage reads the tables whose schema it declares from it)."""
        try:
            return pb.PrewriteValue.FromString(value)
        except DecodeError as e:
            raise InvalidArgument(f"prewrite_value is not a valid PrewriteValue: {e}") from None

    def refresh(self, producer_id: str) -> bool:
        """Re-read one producer from etcd (blocking) unless it was found absent within
        NEGATIVE_TTL_S; returns whether it is admissible now."""
        now = time.monotonic()
        with self._lock:
            missed = self._absent.get(producer_id)
            if missed is not None and now - missed < NEGATIVE_TTL_S:
                return False
        try:
            info = self.registry.get(NodeKind.PRODUCER, producer_id)
        except Exception as e:  # noqa: BLE001 - an invalid id or etcd down: not admitted
            log.info("producer %r not admitted: %s", producer_id, e)
            info = None
        with self._lock:
            if info is not None:
                self._known[producer_id] = info.status
                self._absent.pop(producer_id, None)
            else:
                if len(self._absent) >= _MAX_NEGATIVE:
                    self._absent.clear()
                self._absent[producer_id] = now
        return admissible(info.status if info is not None else None)
