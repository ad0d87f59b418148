"""The committed generated protobuf code is exactly what proto/sluice.proto generates today."""
from __future__ import annotations

from pathlib import Path

from sluice.proto import gen

GENERATED = ("sluice_pb2.py", "sluice_pb2.pyi", "sluice_pb2_grpc.py")


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    """Stale generated code fails the build: run `make proto` (python -m sluice.proto.gen)."""
    written = {p.name for p in gen.generate(tmp_path)}
    assert written == set(GENERATED)
    stale = [name for name in GENERATED
             if (tmp_path / name).read_bytes() != (gen.PROTO_DIR / name).read_bytes()]
    assert not stale, (f"proto/{', proto/'.join(stale)} differ from what proto/sluice.proto "
                       "generates: run `make proto` and commit the result")


def test_generated_grpc_module_imports_inside_the_namespace(tmp_path: Path) -> None:
    text = (gen.PROTO_DIR / "sluice_pb2_grpc.py").read_text()
    assert "from sluice.proto import sluice_pb2 as" in text
    assert "\nimport sluice_pb2" not in text
