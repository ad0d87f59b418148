"""Sluice client library: write transactions to the pumps (DESIGN §5).

- `PumpsClient` — routes Prewrite/Commit/Rollback binlogs to the pumps (producers, capture).
- `AppProducer` / `Transaction` — application transactions on MariaDB/MySQL with an outbox.
- `ProducerServer` — registry presence and the TxnStatus endpoint of any producer.
- `decide_by_writing` — the outbox decision a pump uses when the application is down.

Names are resolved lazily, so `import sluice.client.batcher` (or `.outbox` from a pump) does not
pull in the rest of the client.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "PumpsClient": "pumps", "PrewriteAck": "pumps", "NoPumpAvailable": "pumps",
    "AppProducer": "app", "ClientConfig": "commit", "Transaction": "transaction",
    "TxnAborted": "commit", "TxnUnknown": "commit", "TableShape": "sluice.core.table",
    "ProducerServer": "producer", "OUTBOX_LABEL": "producer",
    "OutboxDSN": "outbox", "decide_by_writing": "outbox", "AlreadyDecided": "outbox",
    "read_table_info": "sluice.core.table", "stable_table_id": "sluice.core.table",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sluice.client' has no attribute {name!r}")
    path = module if module.startswith("sluice.") else f"{__name__}.{module}"
    value = getattr(importlib.import_module(path), name)
    globals()[name] = value
    return value
