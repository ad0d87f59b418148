"""The config reference in docs/config.md, generated from the config dataclasses of every
process, sink and the local cluster (`python -m sluice.ctl.config_reference --write`).

Invariant: the doc is generated, never written by hand, and tests/integration/test_cluster.py
checks it names every key: a key added to a config class without regenerating fails CI.
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.core import config as cfgmod
from sluice.core.errors import ConfigError
from sluice.core.tls import SecurityConfig

from .cluster_config import (PROCESS_CONFIGS, ClusterSpec, config_class, sink_config_class,
                             toml_value)

@dataclass(frozen=True)
class KeyDoc:
    key: str              # dotted kebab-case path, e.g. storage.max-binlog-size
    type: str
    default: str
    meaning: str


_COMMENT = re.compile(r"^\s*(\w+)\s*:[^#]*?(?:#\s*(.*))?$")


def _field_comments(cls: type) -> dict[str, str]:
    """field name -> the comment written for it in the class body: full-line comments just
    above the field, then the comment at the end of its line."""
    try:
        src = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    pending: list[str] = []
    for line in src.splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("def ") or stripped.startswith("@"):
            break
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        m = _COMMENT.match(line)
        if m and not stripped.startswith(('"', "'")):
            out[m.group(1)] = " ".join([*pending, (m.group(2) or "").strip()]).strip()
        pending = []
    return out


# What a key means when its class has no comment for it (keys shared by several processes).
COMMON_MEANINGS: dict[str, str] = {
    "cluster-id": "cluster this process belongs to; every process of a cluster uses the same id",
    "addr": "host:port to listen on",
    "advertise-addr": "address other processes dial; defaults to addr",
    "etcd": "comma-separated etcd endpoints host:port",
    "data-dir": "directory of this process's data (created if missing)",
    "metrics-addr": "host:port for Prometheus /metrics; empty: disabled",
    "gc-interval": "seconds between GC runs",
    "storage.segment-size": "value-log segment size in bytes before rotating",
    "storage.max-binlog-size": "largest binlog part; bigger transactions become multi-part prewrites",
    "storage.max-inflight-bytes": "pump-wide in-flight write budget; above it writes get RESOURCE_EXHAUSTED",
    "storage.stop-write-at-available-space": "refuse writes when free disk is below this many bytes; reads continue",
    "storage.sync": "fdatasync every group commit (false only for tests and benchmarks)",
    "dedupe-window": "start_ts values remembered per producer to drop duplicate copies",
    "sink": "the sink this drainer applies to: file, grpc, mysql or spark",
    "to": "the sink's options (tables below)",
    "producer-id": "producer id in the registry (epochs, positions, TxnStatus)",
    "group-max-txns": "source transactions per group written to one pump",
    "group-max-bytes": "bytes per group",
    "group-max-wait-ms": "longest a group waits to fill",
    "heartbeat-s": "seconds between capture heartbeats",
    "source.host": "source MariaDB/MySQL host",
    "source.port": "source port",
    "source.user": "replication user (REPLICATION SLAVE, REPLICATION CLIENT, SELECT)",
    "source.password": "its password",
    "filter.include-databases": "capture only these databases (empty: all)",
    "filter.exclude-databases": "never capture these databases",
    "filter.exclude-tables": "regex on \"db.table\" never captured",
    "to.dir": "output directory of the JSON-lines files",
    "to.max-file-size": "rotate output files at this size (bytes)",
    "to.fsync": "fsync output before a checkpoint is saved",
    "to.host": "downstream host",
    "to.port": "downstream port",
    "to.user": "downstream user",
    "to.password": "downstream password",
    "to.worker-count": "parallel apply workers (conflict-detected by key)",
    "to.txn-batch": "transactions per worker commit",
    "to.safe-mode": "always idempotent upserts, updates as delete+insert",
    "to.checkpoint-schema": "downstream schema of the checkpoint table",
    "to.buffer-txns": "transactions kept for consumers",
    "to.buffer-bytes": "bytes kept for consumers",
}


def _type_text(tp: Any) -> str:
    text = str(tp) if typing.get_origin(tp) else getattr(tp, "__name__", str(tp))
    return text.replace("typing.", "")


def _default_text(f: dataclasses.Field) -> str:  # type: ignore[type-arg]
    if f.default is not dataclasses.MISSING:
        v = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        v = f.default_factory()  # type: ignore[misc]
        if dataclasses.is_dataclass(v):
            return "(table)"
    else:
        return "(required)"
    if isinstance(v, SecurityConfig):
        return "(table)"
    return "`" + toml_value(v) + "`" if not (isinstance(v, (list, dict)) and not v) else (
        "`[]`" if isinstance(v, list) else "`{}`")


def key_docs(cls: type, prefix: str = "") -> list[KeyDoc]:
    """Every key of a config class (nested tables flattened to dotted keys)."""
    hints = typing.get_type_hints(cls)
    # A subclass's own comments win over its bases' (SparkSinkConfig over SessionConfig).
    comments = {k: v for base in reversed(cls.__mro__[:-1]) if dataclasses.is_dataclass(base)
                for k, v in _field_comments(base).items() if v}
    out: list[KeyDoc] = []
    nested: list[tuple[str, type]] = []
    for f in dataclasses.fields(cls):
        key = prefix + cfgmod.field_key(f.name)
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            nested.append((key + ".", tp))   # type: ignore[arg-type]
            continue
        items = typing.get_args(tp) if typing.get_origin(tp) is list else ()
        if items and dataclasses.is_dataclass(items[0]):
            # An array of tables ([[drainers]]): document its item's keys as `drainers[].key`.
            some = f.default_factory is not dataclasses.MISSING and f.default_factory()  # type: ignore[misc]
            out.append(KeyDoc(key, f"array of tables [[{key}]]",
                              "one item with the defaults below" if some else "none",
                              comments.get(f.name, "")))
            nested.append((key + "[].", items[0]))
            continue
        meaning = comments.get(f.name) or COMMON_MEANINGS.get(key) or COMMON_MEANINGS.get(
            prefix.split(".")[0] + "." + key.rsplit(".", 1)[-1], "")
        out.append(KeyDoc(key, _type_text(tp), _default_text(f), meaning))
    for p, tp in nested:
        out += key_docs(tp, p)
    return out


def _table(docs: list[KeyDoc]) -> str:
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for d in docs:
        meaning = d.meaning.replace("|", "\\|")
        rows.append(f"| `{d.key}` | {d.type} | {d.default} | {meaning} |")
    return "\n".join(rows)


def reference_sections() -> list[tuple[str, type, str]]:
    """(title, class, key prefix) for every config in this build, processes then sinks."""
    out: list[tuple[str, type, str]] = []
    titles = {"tso": "tso.toml (`sluice tso`)", "pump": "pump.toml (`sluice pump`)",
              "drainer": "drainer.toml (`sluice drainer`)",
              "capture": "capture.toml (`sluice capture`)", "ctl": "`sluice ctl --config`"}
    for kind in PROCESS_CONFIGS:
        cls = config_class(kind)
        if cls is not None:
            out.append((titles[kind], cls, ""))
    from sluice.drainer.sink import SINKS
    for sink in SINKS:
        cls = sink_config_class(sink)
        if cls is not None:
            out.append((f"drainer `[to]` for `sink = \"{sink}\"`", cls, "to."))
    out.append(("cluster.toml (`sluice cluster up --config`)", ClusterSpec, ""))
    return out


BEGIN = "<!-- BEGIN GENERATED: python -m sluice.ctl.config_reference --write -->"
END = "<!-- END GENERATED -->"


def reference_markdown() -> str:
    parts = []
    for title, cls, prefix in reference_sections():
        parts.append(f"### {title}\n\n{_table(key_docs(cls, prefix))}\n")
    return "\n".join(parts)


def generated_region() -> str:
    """docs/config.md from its BEGIN marker up to (not including) its END marker."""
    return BEGIN + "\n\n" + reference_markdown() + "\n"


def write_docs(path: Path) -> bool:
    """Rewrite the generated region of docs/config.md; True when it changed."""
    text = path.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ConfigError(f"{path}: markers {BEGIN!r} ... {END!r} not found")
    new = text[:start] + generated_region() + text[end:]
    if new != text:
        path.write_text(new)
    return new != text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="print (or --write into docs/config.md) the config "
                                            "reference generated from the config dataclasses")
    p.add_argument("--write", nargs="?", const="docs/config.md", metavar="PATH")
    args = p.parse_args(argv)
    if args.write:
        changed = write_docs(Path(args.write))
        print(f"{args.write}: {'updated' if changed else 'already up to date'}")
    else:
        print(reference_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
