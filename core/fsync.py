"""fsync of a file or a directory by path (a directory's fsync makes a new entry in it durable)."""
from __future__ import annotations

import os

__all__ = ["fsync_path"]


def fsync_path(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
