"""Regenerate the Python code for proto/sluice.proto (`make proto`).

protoc writes `import sluice_pb2` into the gRPC module; we rewrite it to the package path so the
generated code imports inside the `sluice.proto` namespace.
"""
from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

PROTO_DIR = Path(__file__).resolve().parent
SOURCES = ["sluice.proto"]


def generate(out_dir: Path) -> list[Path]:
    """Generate into out_dir; returns the written files."""
    args = ["protoc", f"-I{PROTO_DIR}", f"--python_out={out_dir}", f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}", *[str(PROTO_DIR / s) for s in SOURCES]]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    written = []
    for path in sorted(out_dir.glob("*_pb2*.py*")):
        text = path.read_text()
        text = re.sub(r"^import (\w+_pb2) as", r"from sluice.proto import \1 as", text, flags=re.M)
        path.write_text(text)
        written.append(path)
    return written


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        for path in generate(Path(tmp)):
            (PROTO_DIR / path.name).write_text(path.read_text())
            print(f"wrote proto/{path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
