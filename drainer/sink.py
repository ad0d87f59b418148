"""The sink interface every drainer sink implements, the drainer checkpoint value, and the registry.

Invariant: checkpoints are inclusive (DESIGN §2.6) — "everything with commit_ts <= checkpoint is
applied"; a sink's checkpoint() reports only what is durable in the sink, and the drainer resumes
strictly after it (`PullBinlogs(after_commit_ts=checkpoint)`).

One sink per drainer, loaded by name (`load_sink`): `file`, `grpc`, `mysql`, `spark`. A sink
receives commit-ordered transactions in batches that never split a transaction; the drainer
records schema effects (DDL, schema snapshots) in its SchemaHistory before handing a batch over.
"""
from __future__ import annotations

import abc
import base64
import binascii
import dataclasses
import importlib
import json
from typing import Any, TypeVar

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


class Sink(abc.ABC):
    """A drainer sink. Calls come from one task: open, (apply | flush | checkpoint)*, close."""

    name: str = ""

    @classmethod
    def from_options(cls, options: Any, **context: Any) -> Sink:
        """Build the sink from its config table. Context keys a sink does not use are ignored
        (the drainer passes the same context to every sink: schema, source_name, epoch, ...)."""
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
