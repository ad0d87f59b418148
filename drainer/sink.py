"""The sink contract (`Sink`, its refinements and `Capabilities`), the checkpoint value, the registry.

Invariant: checkpoints are inclusive (DESIGN §2.6) — "everything with commit_ts <= checkpoint is
applied"; a sink's checkpoint() reports only what is durable in the sink, and the drainer resumes
strictly after it (`PullBinlogs(after_commit_ts=checkpoint)`).

One sink per drainer, loaded by name (`load_sink`): `file`, `grpc`, `mysql`, `spark`. A sink
receives commit-ordered transactions in batches that never split a transaction. What a sink can
do is declared, never probed: its class's `capabilities` record and the refinement it derives
from (`RawSink`, `ServingSink`, `BackgroundSink`). Sinks never call into the drainer: what they
need from it is a constructor-time dependency (context), and a background sink reports finished
commits on its `successes()` queue, which the drainer reads (TiDB-Binlog's Syncer.Successes()).
"""
from __future__ import annotations

import abc
import asyncio
import base64
import binascii
import dataclasses
import importlib
import json
from collections.abc import AsyncIterator
from typing import Any, ClassVar, TypeVar

from sluice.core import config as _config
from sluice.core.errors import ConfigError, InvalidArgument
from sluice.drainer.txn import Txn

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """Where the drainer resumes: everything with commit_ts <= commit_ts is applied."""

    commit_ts: int
    positions: dict[str, str] = dataclasses.field(default_factory=dict)  # producer_id -> position
    sink_state: dict[str, Any] = dataclasses.field(default_factory=dict)  # opaque, from the sink
    schema: bytes | None = None          # SchemaHistory.to_bytes()
    dispatched_upper: int = 0            # safe mode runs until the merge passes it (DESIGN §6)

    def to_json(self) -> str:
        return json.dumps({
            "commit_ts": self.commit_ts,
            "positions": self.positions,
            "sink_state": self.sink_state,
            "schema": None if self.schema is None else base64.b64encode(self.schema).decode("ascii"),
            "dispatched_upper": self.dispatched_upper,
        }, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Checkpoint:
        try:
            doc = json.loads(text)
            schema = doc.get("schema")
            cp = cls(
                commit_ts=int(doc["commit_ts"]),
                positions={str(k): str(v) for k, v in dict(doc.get("positions") or {}).items()},
                sink_state=dict(doc.get("sink_state") or {}),
                schema=None if schema is None else base64.b64decode(schema, validate=True),
                dispatched_upper=int(doc.get("dispatched_upper") or 0),
            )
        except (ValueError, KeyError, TypeError, binascii.Error) as e:
            raise InvalidArgument(f"unreadable drainer checkpoint: {e!r}") from None
        return cp


@dataclasses.dataclass(frozen=True)
class SinkCheckpoint:
    """The highest commit_ts durable in the sink, and the sink state to persist with it."""

    commit_ts: int
    sink_state: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a sink takes and how its checkpoint relates to the merge, declared by its class.

    raw: takes the stored binlogs as they are (`RawSink.apply_raw`), never decoded transactions;
    the drainer then neither unframes nor records schema effects. columns: a raw sink that also
    takes merged columns (`RawSink.apply_columns`, drainer/columnar.py). follows_merge: after a
    flush, the merge watermark read before it counts as durable (false: the sink's checkpoint is
    its own, e.g. consumers' acknowledgements). background: commits in the background
    (`BackgroundSink`). serves_stream: serves the merged stream (`ServingSink`).
    """

    raw: bool = False
    columns: bool = False
    follows_merge: bool = True
    background: bool = False
    serves_stream: bool = False


class Sink(abc.ABC):
    """A drainer sink. Calls come from one task: open, (apply | flush | checkpoint)*, close."""

    name: str = ""
    capabilities: ClassVar[Capabilities] = Capabilities()

    @classmethod
    def from_options(cls, options: Any, **context: Any) -> Sink:
        """Build the sink from its config table. Context keys a sink does not use are ignored
        (the drainer passes the same context to every sink: schema, source_name, epoch, fence,
        replay, ...)."""
        return cls(options, **context)  # type: ignore[call-arg]

    @classmethod
    def prewarm(cls, options: Any) -> None:
        """Start-up work a standby drainer does while it waits, so a takeover does not pay for
        it (the Spark sink starts its JVM and opens its catalog). Blocking; it must not write
        anything downstream: a standby is not the active instance."""

    @abc.abstractmethod
    async def open(self, checkpoint: Checkpoint) -> None:
        """Prepare to receive transactions with commit_ts > checkpoint.commit_ts.

        A sink with its own durable state (file offset, ...) gets it back in checkpoint.sink_state
        and must discard anything it wrote beyond it."""

    @abc.abstractmethod
    async def apply(self, batch: list[Txn]) -> None:
        """Apply commit-ordered transactions (never a partial transaction)."""

    @abc.abstractmethod
    async def flush(self) -> None:
        """Make everything applied so far durable; checkpoint() then reports it."""

    @abc.abstractmethod
    def checkpoint(self) -> SinkCheckpoint:
        """The highest durable commit_ts (as of the last flush) and the sink state to persist."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release resources; the drainer flushes and saves its checkpoint before calling this."""

    def has_room(self) -> bool:
        """Whether the sink takes another batch now (back-pressure; most sinks always do)."""
        return True

    async def wait_room(self, timeout: float) -> bool:
        """Wait up to timeout for has_room(); returns it."""
        return True


class RawSink(Sink):
    """A sink that forwards stored binlogs (capabilities.raw): merge items go to it framed as
    the pumps sent them (drainer.txn.frame), never decoded."""

    capabilities: ClassVar[Capabilities] = Capabilities(raw=True)

    @abc.abstractmethod
    def apply_raw(self, batch: list[tuple[int, int, bytes]]) -> None:
        """Commit-ordered (commit_ts, start_ts, framed binlogs) (drainer.sinks.grpc.RawTxn)."""

    def apply_columns(self, batch: Any) -> None:
        """A merged drainer.columnar.ColumnBatch; only called when capabilities.columns."""
        raise NotImplementedError(f"{type(self).__name__} does not take merged columns")

    @abc.abstractmethod
    def advance(self, watermark: int) -> None:
        """Everything <= watermark has been applied (the merge moved on without transactions)."""


class ServingSink(RawSink):
    """A raw sink serving the merged stream itself (Drainer.PullBinlogs / Ack: the grpc sink)."""

    capabilities: ClassVar[Capabilities] = Capabilities(raw=True, serves_stream=True)

    @abc.abstractmethod
    def serve(self, after: int, consumer_id: str = "") -> AsyncIterator[bytes]:
        """Serialized DrainerPullResp messages strictly after `after`, then live."""

    @abc.abstractmethod
    def ack(self, consumer_id: str, commit_ts: int) -> None:
        """A consumer acknowledged everything <= commit_ts."""


class BackgroundSink(Sink):
    """A sink that commits in the background (capabilities.background: the Spark sink).

    A periodic checkpoint calls commit_soon() (never waits) instead of flush(); the sink puts
    what is durable on its successes() queue each time a background commit finishes (successful
    or not: a failure is raised by the next apply, flush or commit_soon), and the drainer saves a
    checkpoint when it reads one. `idle` says when the merge watermark may be saved."""

    capabilities: ClassVar[Capabilities] = Capabilities(background=True)

    @abc.abstractmethod
    async def commit_soon(self) -> None:
        """Start committing what is buffered, unless a commit is in flight; never waits."""

    @property
    @abc.abstractmethod
    def idle(self) -> bool:
        """Nothing applied is uncommitted: no buffered rows, no commit in flight."""

    @abc.abstractmethod
    def successes(self) -> asyncio.Queue[SinkCheckpoint]:
        """Finished background commits, in order: what was durable as each one ended."""


def options_to_config(cls: type[T], options: Any, where: str) -> T:
    """A sink's config dataclass from its TOML table (kebab-case keys), checked like any config."""
    if isinstance(options, cls):
        return options
    if not isinstance(options, dict):
        raise ConfigError(f"{where}: expected a table, got {type(options).__name__}")
    return _config.from_dict(cls, options, where)


SINKS: dict[str, str] = {
    "file": "sluice.drainer.sinks.file:FileSink",
    "grpc": "sluice.drainer.sinks.grpc:GrpcSink",
    "mysql": "sluice.drainer.sinks.mysql:MySQLSink",
    "spark": "sluice.spark_sink.sink:SparkSink",
}

# sink name -> "module:ConfigClass" of its `[to]` table. Kept apart from SINKS so a drainer
# checks its whole config before any side effect without importing a sink's runtime (the Spark
# sink's module pulls in pyarrow and the session machinery; its config module is plain Python).
SINK_CONFIGS: dict[str, str] = {
    "file": "sluice.drainer.sinks.file:FileSinkConfig",
    "grpc": "sluice.drainer.sinks.grpc:GrpcSinkConfig",
    "mysql": "sluice.drainer.sinks.mysql:MySQLSinkConfig",
    "spark": "sluice.spark_sink.config:SparkSinkConfig",
}


def sink_table(name: str) -> str:
    """How error messages name a sink's options: the table the user wrote, and the sink."""
    return f"[to] ({name} sink)"


def load_sink(name: str, options: Any, **context: Any) -> Sink:
    """Import the sink registered as `name` (lazily: only the chosen sink's dependencies load)."""
    return sink_class(name).from_options(options, **context)


def sink_class(name: str) -> type[Sink]:
    """The Sink class registered as `name`, imported on first use."""
    cls = _registered(name, SINKS)
    if not (isinstance(cls, type) and issubclass(cls, Sink)):
        raise ConfigError(f"sink '{name}' is not present in this build "
                          f"({SINKS[name]} is not a Sink class)")
    return cls


def sink_config_class(name: str) -> type:
    """The options dataclass of the sink registered as `name` (its `[to]` table)."""
    cls = _registered(name, SINK_CONFIGS)
    if not dataclasses.is_dataclass(cls):
        raise ConfigError(f"sink '{name}' is not present in this build "
                          f"({SINK_CONFIGS[name]} is not a config class)")
    return cls  # type: ignore[return-value]


def sink_options(name: str, options: Any, where: str = "") -> Any:
    """`[to]` checked through the sink's config class; errors read
    `<where>: [to] (<name> sink): <problem>`, e.g. `drainer.toml: [to] (mysql sink): unknown key
    'hots' (did you mean 'host'?)`."""
    cls = sink_config_class(name)
    table = f"{where}: {sink_table(name)}" if where else sink_table(name)
    try:
        return options_to_config(cls, options, table)
    except ConfigError as e:
        text = str(e)
        # Checks in a config class's __post_init__ do not know the file: name it here.
        raise ConfigError(text if text.startswith(table) else f"{table}: {text}") from None


def _registered(name: str, registry: dict[str, str]) -> Any:
    target = registry.get(name)
    if target is None:
        raise ConfigError(f"unknown sink '{name}' (known: {', '.join(sorted(registry))})")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise ConfigError(f"sink '{name}' is not present in this build "
                              f"(module {module_name} not found)") from None
        raise ConfigError(f"sink '{name}' cannot be loaded: missing dependency {e.name!r} "
                          f"(install it, or choose another sink)") from None
    return getattr(module, attr, None)
