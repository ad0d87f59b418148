"""The one producer commit protocol (DESIGN §2.2, §5), used by every producer in the tree:
application transactions (client/transaction.py), their standalone DDL and schema snapshots
(client/app.py) and the capture's groups (capture/writer.py).

    prewrite -> commit_ts -> watermark check -> point of no return -> commit | rollback

Invariants kept here:
- **commit_ts is fetched only after the prewrite is durably acknowledged, and a transaction
  reaches its point of no return only with commit_ts above every acked watermark.**
- **Before the point of no return a failure rolls back** (the producer's own work undone, then a
  Rollback binlog to the pumps holding the prewrite); after it, never: an ambiguous point of no
  return is decided by the producer's truth (the outbox), never guessed.
- Where the point of no return is depends on what holds the producer's truth: for an outbox
  producer it is the outbox row (then the Commit binlog is best effort: a pump's resolver reads
  the outbox); for the capture, whose truth is the pumps, it is the acknowledged Commit write.

What differs between producers is given by a `CommitSteps`; the order is only written here.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from sluice.core import errors, failpoint
from sluice.core.log import kv
from sluice.proto import sluice_pb2 as pb

from . import outbox
from .binlogs import Encoded, commit_of, encode

if TYPE_CHECKING:
    from sluice.core.tls import SecurityConfig
    from sluice.core.tso_client import TSOClient

    from .pumps import PrewriteAck, PumpsClient

log = logging.getLogger(__name__)


class TxnAborted(errors.FailedPrecondition):
    """The transaction was rolled back in the database and in the pumps; nothing committed."""


class TxnUnknown(errors.Unavailable):
    """The point of no return failed ambiguously and the outbox could not decide in time.

    The outbox stays the truth: a pump's resolver decides start_ts from it later.
    """

    def __init__(self, message: str, start_ts: int, commit_ts: int) -> None:
        super().__init__(message)
        self.start_ts, self.commit_ts = start_ts, commit_ts


class Ambiguous(Exception):
    """Raised by a point of no return that may or may not have happened (a failed COMMIT)."""

    def __init__(self, what: str, cause: BaseException) -> None:
        super().__init__(f"{what} failed ({outbox._errtext(cause)})")
        self.what, self.cause = what, cause


@dataclasses.dataclass(frozen=True)
class ClientConfig:
    """AppProducer's options (docs/transactions.md "Options")."""

    source: str = ""                          # default: the outbox's host:port
    pool_size: int = 8                        # DB connections, threads, open transactions
    tso_addrs: list[str] | None = None        # default: the leader from etcd
    host: str = "127.0.0.1"                   # TxnStatus listen address
    port: int = 0
    alive_ttl_s: int = 5
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    security: SecurityConfig | None = None
    max_txn_age_s: float = outbox.DEFAULT_MAX_TXN_AGE_S
    prune_interval_s: float = 30.0            # 0: off
    resolve_timeout_s: float = 30.0
    statement_timeout_s: float = 60.0
    max_binlog_size: int = 64 << 20
    pumps_options: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        # None was the old keyword default for both: keep accepting it.
        object.__setattr__(self, "labels", dict(self.labels or {}))
        object.__setattr__(self, "pumps_options", dict(self.pumps_options or {}))
        if self.pool_size < 1:
            raise errors.ConfigError(f"pool_size must be >= 1, got {self.pool_size}")


class CommitSteps(Protocol):
    """What one producer does at each step; `CommitCore.commit` decides the order."""

    #: failpoint injected between the prewrite ack and fetching commit_ts
    after_prewrite_failpoint: str
    #: failures before the point of no return that roll back (others leave the prewrites to the
    #: pumps' resolver and the producer's TxnStatus)
    rollback_on: tuple[type[BaseException], ...]
    #: the pumps are the producer's truth: the Commit write is the point of no return
    pumps_decide: bool

    async def prewrite_failed(self, e: BaseException) -> None:
        """The prewrite was not acknowledged (nothing to roll back in the pumps)."""

    async def point_of_no_return(self, commit_ts: int) -> None:
        """Make the commit the producer's truth; raise Ambiguous when it may have happened."""

    async def abort(self) -> None:
        """Undo the producer's own work after a failure before the point of no return."""

    async def decide(self, start_ts: int) -> tuple[int, int]:
        """(TxnState, commit_ts) from the producer's truth, after an Ambiguous."""

    async def committed(self, commit_ts: int) -> None:
        """Past the point of no return, before the Commit binlog (never raises to undo)."""

    async def commit_failed(self, e: BaseException) -> None:
        """The Commit write of a pumps_decide producer failed (re-raised after this)."""


async def fires(name: str) -> bool:
    """Whether failpoint `name` (configured as `raise`) fired here."""
    try:
        await failpoint.ainject(name)
    except errors.FailpointError:
        return True
    return False


class Prewritten(NamedTuple):
    """Prewrites the pumps acknowledged, waiting for `CommitCore.finish`."""

    prewrites: list[Encoded]
    starts: list[int]
    ack: PrewriteAck


class CommitCore:
    """Runs the commit protocol for one producer identity (`producer_id`, current `epoch`)."""

    def __init__(self, pumps: PumpsClient, tso: TSOClient, producer_id: str,
                 epoch: Callable[[], int]) -> None:
        self.pumps, self.tso, self.producer_id, self._epoch = pumps, tso, producer_id, epoch

    def binlog(self, tp: int, start_ts: int, commit_ts: int = 0) -> pb.Binlog:
        return pb.Binlog(tp=tp, start_ts=start_ts, commit_ts=commit_ts,
                         producer_id=self.producer_id, producer_epoch=self._epoch(),
                         ts_ms=int(time.time() * 1000))

    def prewrite(self, start_ts: int, value: pb.PrewriteValue) -> pb.Binlog:
        """A prewrite binlog (PumpsClient splits one over max_binlog_size into parts)."""
        b = self.binlog(pb.PREWRITE, start_ts)
        b.prewrite_value = value.SerializeToString()
        return b

    async def commit(self, prewrites: Sequence[pb.Binlog | Encoded], steps: CommitSteps) -> int:
        """Commit these prewrites (one pump transaction each, commit_ts consecutive, in order);
        returns the first commit_ts. Raises TxnAborted when rolled back, TxnUnknown when the
        outbox could not decide an ambiguous point of no return."""
        return await self.finish(await self.write_prewrites(prewrites, steps), steps)

    async def write_prewrites(self, prewrites: Sequence[pb.Binlog | Encoded],
                              steps: CommitSteps) -> Prewritten:
        """The first half of `commit`: the prewrites, acknowledged (a caller may run it while
        an earlier transaction's `finish` is in flight: the capture's groups)."""
        encoded = [encode(b) for b in prewrites]
        try:
            ack = await self.pumps.write_prewrites(encoded)
        except BaseException as e:
            await steps.prewrite_failed(e)
            raise
        return Prewritten(encoded, [b.start_ts for b in encoded], ack)

    async def finish(self, written: Prewritten, steps: CommitSteps,
                     commit_ts_taken: Callable[[], None] | None = None) -> int:
        """The second half of `commit`: commit_ts (fetched now, after the prewrite ack; then
        `commit_ts_taken()`), the watermark check and the point of no return."""
        prewrites, starts, ack = written
        try:
            await failpoint.ainject(steps.after_prewrite_failpoint)
            n = len(prewrites)
            commit_ts = await self.tso.get_ts() if n == 1 else (await self.tso.get_ts_range(n))[0]
            if commit_ts_taken is not None:
                commit_ts_taken()
            watermark = ack.watermark
            if await fires("txn-watermark-above-commit"):
                watermark = commit_ts   # test wiring: a pump acked a watermark >= our commit_ts
            if commit_ts <= watermark:
                raise TxnAborted(
                    f"commit_ts {commit_ts} is not above the served watermark {watermark} acked "
                    f"by pump(s) {list(ack.pumps)} holding the prewrite of start_ts={starts[0]}: "
                    "the commit_ts must be fetched after the prewrite ack (docs/transactions.md); "
                    "transaction aborted")
            if steps.pumps_decide:
                await self._write_commits(prewrites, commit_ts, ack, steps)
            else:
                await steps.point_of_no_return(commit_ts)
        except Ambiguous as e:
            commit_ts = await self._decide(starts[0], commit_ts, ack, steps, e)
        except BaseException as e:
            if isinstance(e, steps.rollback_on):
                await steps.abort()
                await self.rollback(starts, ack, quiet=not steps.pumps_decide)
            raise
        await steps.committed(commit_ts)
        if not steps.pumps_decide:
            await self._send_commit(starts[0], commit_ts, ack)
        return commit_ts

    async def _write_commits(self, prewrites: list[Encoded], commit_ts: int, ack: PrewriteAck,
                             steps: CommitSteps) -> None:
        # Each COMMIT repeats its prewrite's producer, epoch, position, snapshot and ts_ms.
        commits = [commit_of(p, commit_ts + i) for i, p in enumerate(prewrites)]
        try:
            before = getattr(steps, "before_commit_failpoint", "")
            if before:
                await failpoint.ainject(before)
            await self.pumps.write_commits(commits, ack)
        except BaseException as e:
            await steps.commit_failed(e)
            raise

    async def _decide(self, start_ts: int, commit_ts: int, ack: PrewriteAck, steps: CommitSteps,
                      e: Ambiguous) -> int:
        log.warning("%s for start_ts=%d: deciding by writing to the outbox", e, start_ts,
                    extra=kv(start_ts=start_ts))
        state, decided = await steps.decide(start_ts)
        if state == pb.TXN_COMMITTED:
            if decided != commit_ts:
                log.error("outbox has commit_ts %d for start_ts=%d, we wrote %d; using the "
                          "outbox's", decided, start_ts, commit_ts)
            return decided
        if state == pb.TXN_ROLLED_BACK:
            await self.rollback([start_ts], ack, quiet=True)
            raise TxnAborted(f"{e.what} of start_ts={start_ts} failed and the outbox says it did "
                             "not commit: transaction rolled back") from None
        raise TxnUnknown(f"{e.what} of start_ts={start_ts} failed and the outbox could not "
                         "decide in time; the pumps will resolve it from the outbox",
                         start_ts, commit_ts) from None

    async def rollback(self, starts: list[int], ack: PrewriteAck, quiet: bool) -> None:
        """Rollback binlogs to the pumps holding the prewrites; `quiet`: a pump that does not
        take it resolves the prewrite with TxnStatus later, so only log."""
        binlogs = [self.binlog(pb.ROLLBACK, s) for s in starts]
        try:
            await self.pumps.write_commits(binlogs, ack)
        except errors.SluiceError as e:
            if not quiet:
                raise
            log.warning("rollback binlog of start_ts=%d not written (%s); the pumps will resolve "
                        "it from the outbox", starts[0], e)

    async def _send_commit(self, start_ts: int, commit_ts: int, ack: PrewriteAck) -> None:
        """The Commit binlog of a transaction committed in the outbox. Never raises: when it
        is not written, the pumps' resolver reads the outbox and commits it."""
        try:
            await self.pumps.write_commits([self.binlog(pb.COMMIT, start_ts, commit_ts)], ack)
        except errors.Unavailable as e:
            log.warning("commit binlog of start_ts=%d commit_ts=%d not written (%s); the pumps "
                        "will resolve it from the outbox", start_ts, commit_ts, e)
        except errors.SluiceError as e:
            # A pump holds another decision for a transaction the outbox says committed.
            log.error("pump refused the commit of start_ts=%d commit_ts=%d, committed in the "
                      "database: %s", start_ts, commit_ts, e)
