"""Where everything lives: catalog names and file locations, and file operations on them.

Every location a batch writes is unique to (table, epoch, batch) — or (table, base version,
epoch) for compaction — so two drainers of different epochs never write the same files and a
retried batch of the same epoch overwrites only its own uncommitted attempt.

Files go through Hadoop's FileSystem in the Spark JVM, so `root` may be a local directory or any
Hadoop URI the cluster can reach.
"""
from __future__ import annotations

import hashlib
import os
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

COMMITS = "_sluice_commits"
_IDENT = re.compile(r"[^a-z0-9_]")


def ident(name: str) -> str:
    """A catalog identifier from a source name: lower case, [a-z0-9_]; a hash suffix keeps names
    that needed rewriting distinct."""
    low = name.lower()
    clean = _IDENT.sub("_", low)
    if clean != low or not clean or clean[0].isdigit():
        clean = f"{clean or 'x'}_{hashlib.sha1(name.encode()).hexdigest()[:6]}"
    return clean


def q(*parts: str) -> str:
    """A backquoted, dotted identifier."""
    return ".".join("`" + p.replace("`", "``") + "`" for p in parts)


def sql_str(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


class Layout:
    def __init__(self, root: str, meta_db: str, database_format: str, source: str) -> None:
        if "://" not in root and not root.startswith("file:"):
            root = os.path.abspath(root)
        self.root = root.rstrip("/")
        self.meta = ident(meta_db)
        self.database_format = database_format
        self.source = source

    # -- catalog ------------------------------------------------------------------------------

    def database(self, schema: str) -> str:
        return ident(self.database_format.format(schema=schema, source=self.source))

    def commits(self) -> str:
        return q(self.meta, COMMITS)

    def raw(self, table_id: int) -> str:
        return q(self.meta, self.raw_name(table_id))

    def raw_name(self, table_id: int) -> str:
        """The raw table's name in the meta database (unquoted)."""
        return f"t{table_id}_raw"

    def base(self, table_id: int) -> str:
        return q(self.meta, f"t{table_id}_base")

    def hist(self, table_id: int) -> str:
        return q(self.meta, f"t{table_id}_hist")

    @staticmethod
    def view(db: str, table: str) -> str:
        return q(db, ident(table))

    @staticmethod
    def changelog(db: str, table: str) -> str:
        return q(db, ident(table) + "_changelog")

    # -- files --------------------------------------------------------------------------------

    def commits_dir(self) -> str:
        return f"{self.root}/commits/_table"

    def commit_record_dir(self, epoch: int, batch: int) -> str:
        return f"{self.root}/commits/e{epoch}/b{batch}"

    def raw_table_dir(self, table_id: int) -> str:
        return f"{self.root}/data/t{table_id}/raw/_table"

    def raw_dir(self, table_id: int, epoch: int, batch: int) -> str:
        return f"{self.root}/data/t{table_id}/raw/e{epoch}/b{batch}"

    def base_table_dir(self, table_id: int) -> str:
        return f"{self.root}/data/t{table_id}/base/_table"

    def base_dir(self, table_id: int, version: int, epoch: int) -> str:
        return f"{self.root}/data/t{table_id}/base/v{version}-e{epoch}"

    def hist_table_dir(self, table_id: int) -> str:
        return f"{self.root}/data/t{table_id}/hist/_table"

    def hist_dir(self, table_id: int, version: int, upto: int, epoch: int) -> str:
        return f"{self.root}/data/t{table_id}/hist/h{version}-u{upto}-e{epoch}"

    def trash_dir(self) -> str:
        return f"{self.root}/trash"


class Files:
    """Hadoop FileSystem calls through the session's JVM."""

    def __init__(self, spark: SparkSession) -> None:
        self._jvm: Any = spark._jvm  # type: ignore[attr-defined]
        self._conf = spark._jsc.hadoopConfiguration()  # type: ignore[attr-defined]

    def _fs(self, path: str) -> tuple[Any, Any]:
        p = self._jvm.org.apache.hadoop.fs.Path(path)
        return p.getFileSystem(self._conf), p

    def mkdirs(self, path: str) -> None:
        fs, p = self._fs(path)
        fs.mkdirs(p)

    def write_bytes(self, path: str, data: bytes) -> None:
        fs, p = self._fs(path)
        out = fs.create(p, True)
        try:
            out.write(bytearray(data))
            out.hsync()
        finally:
            out.close()

    def exists(self, path: str) -> bool:
        fs, p = self._fs(path)
        return bool(fs.exists(p))

    def delete(self, path: str) -> bool:
        fs, p = self._fs(path)
        return bool(fs.delete(p, True))

    def read_text(self, path: str) -> str:
        fs, p = self._fs(path)
        stream = fs.open(p)
        try:
            return bytes(self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream)).decode()
        finally:
            stream.close()

    def list_files(self, path: str) -> list[tuple[str, int]]:
        """(name, modification time ms) of the files in path ([] if it is missing)."""
        fs, p = self._fs(path)
        if not fs.exists(p):
            return []
        return [(st.getPath().getName(), int(st.getModificationTime()))
                for st in fs.listStatus(p) if st.isFile()]

    def list_dirs(self, path: str) -> list[tuple[str, int]]:
        """(name, modification time ms) of the sub-directories of path ([] if it is missing)."""
        fs, p = self._fs(path)
        if not fs.exists(p):
            return []
        return [(st.getPath().getName(), int(st.getModificationTime()))
                for st in fs.listStatus(p) if st.isDirectory()]
