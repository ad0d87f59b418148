"""One exception hierarchy for Sluice, rooted in SluiceError.

Each class names the gRPC status code it travels as; `core.grpcutil` maps them to statuses in one
place, and maps statuses back to these classes on the client side.
"""
from __future__ import annotations

import grpc


class SluiceError(Exception):
    """Base of every error Sluice raises on purpose."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL


class ConfigError(SluiceError):
    """Bad configuration: the message names the file and the key. Processes exit 2."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class InvalidArgument(SluiceError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class ClusterIdMismatch(InvalidArgument):
    def __init__(self, got: int, want: int) -> None:
        super().__init__(f"cluster_id mismatch: request has {got}, this cluster is {want}")
        self.got, self.want = got, want


class UnknownProducer(InvalidArgument):
    """A prewrite names a producer the registry does not hold (or holds offline): nobody could
    resolve it later, so the pump refuses it (the service re-reads the registry once first)."""

    def __init__(self, message: str, producer_id: str) -> None:
        super().__init__(message)
        self.producer_id = producer_id


class AlreadyExists(SluiceError):
    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(SluiceError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class StaleEpoch(FailedPrecondition):
    """A writer fenced by a newer epoch (DESIGN §2.10)."""


class IllegalTransition(FailedPrecondition):
    def __init__(self, node_id: str, old: str, new: str) -> None:
        super().__init__(f"node {node_id}: illegal state transition {old} -> {new}")
        self.node_id, self.old, self.new = node_id, old, new


class NotFound(SluiceError):
    code = grpc.StatusCode.NOT_FOUND


class ResourceExhausted(SluiceError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class OutOfRange(SluiceError):
    code = grpc.StatusCode.OUT_OF_RANGE


class Unavailable(SluiceError):
    code = grpc.StatusCode.UNAVAILABLE


class NotLeader(Unavailable):
    def __init__(self, detail: str = "") -> None:
        super().__init__("not leader" + (f": {detail}" if detail else ""))


class EtcdUnavailable(Unavailable):
    pass


class NoPumpAvailable(Unavailable):
    pass


class DeadlineExceeded(SluiceError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class CorruptRecord(SluiceError):
    """A value-log record that fails its checks before the tail: never silently skipped."""

    code = grpc.StatusCode.DATA_LOSS

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"corrupt record in {path} at offset {offset}: {reason}")
        self.path, self.offset, self.reason = path, offset, reason


class FailpointError(SluiceError):
    """Raised by a failpoint configured with `raise`."""

    code = grpc.StatusCode.UNAVAILABLE


_BY_CODE: dict[grpc.StatusCode, type[SluiceError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRange,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.DATA_LOSS: CorruptRecord,
}


def from_status(code: grpc.StatusCode, details: str) -> SluiceError:
    """The SluiceError for a gRPC status received from a peer."""
    cls = _BY_CODE.get(code, SluiceError)
    if cls is CorruptRecord:
        err: SluiceError = SluiceError(details)
        err.code = code
        return err
    err = cls(details)
    err.code = code
    return err
