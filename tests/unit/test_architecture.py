"""Import directions between Sluice's packages (docs/architecture.md, "Who imports whom").

Rule: every import of every module (module-level, function-local and relative ones alike) points
down or sideways, never up:
- no server package (pump, drainer, capture, tso, client, spark_sink) imports `sluice.ctl`, the
  admin tool that sits on top of them all;
- `core` imports no Sluice package but `proto` (stdlib and third-party libraries are fine);
- pump and drainer never import each other: they share only `proto` and `core/wire.py`;
- `client` (the producer library) imports no pump, drainer or capture;
- `tso` imports no pump, drainer, capture or client.
A failure names the file, the line and the import.
"""
from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("capture", "client", "core", "ctl", "drainer", "proto", "pump", "spark_sink", "tso")
SERVERS = ("pump", "drainer", "capture", "tso", "client", "spark_sink")

# (importing package, imported package) -> the Sluice packages it must not import.
FORBIDDEN: dict[str, frozenset[str]] = {
    **{server: frozenset({"ctl"}) for server in SERVERS},
    "core": frozenset(PACKAGES) - {"core", "proto"},
}
FORBIDDEN["pump"] |= {"drainer"}
FORBIDDEN["drainer"] |= {"pump"}
FORBIDDEN["client"] |= {"pump", "drainer", "capture"}
FORBIDDEN["tso"] |= {"pump", "drainer", "capture", "client"}

# The one list of edges that break a rule today, each with why it is tolerated
# ("path:imported module" -> reason). Empty: every rule holds.
KNOWN_EXCEPTIONS: dict[str, str] = {}


@dataclass(frozen=True)
class Import:
    path: str       # relative to the repository root
    line: int
    module: str     # absolute, e.g. "sluice.ctl.main"

    def __str__(self) -> str:
        return f"{self.path}:{self.line} imports {self.module}"


def imports_of(path: Path, root: Path = ROOT) -> list[Import]:
    """Every import in the file, wherever it stands, with relative ones made absolute."""
    rel = path.relative_to(root)
    # the package relative imports start from: the module's folder, as `sluice.a.b`
    package = ["sluice", *rel.parent.parts]
    found: list[Import] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(rel))):
        if isinstance(node, ast.Import):
            found += [Import(str(rel), node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod == "sluice":     # `from sluice import ctl` / `from .. import ctl`
                found += [Import(str(rel), node.lineno, f"sluice.{a.name}") for a in node.names]
            else:
                found.append(Import(str(rel), node.lineno, mod))
    return sorted(found, key=lambda i: (i.line, i.module))


def sluice_package(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) >= 2 and parts[0] == "sluice" and parts[1] in PACKAGES:
        return parts[1]
    return None


@functools.cache
def violations(root: Path = ROOT) -> list[Import]:
    bad: list[Import] = []
    for package, forbidden in FORBIDDEN.items():
        for path in sorted((root / package).rglob("*.py")):
            bad += [imp for imp in imports_of(path, root) if sluice_package(imp.module) in forbidden]
    return bad


def test_imports_point_the_documented_way() -> None:
    """No import breaks the package rules above, apart from the listed known exceptions."""
    found = violations()
    unexpected = [str(v) for v in found if f"{v.path}:{v.module}" not in KNOWN_EXCEPTIONS]
    assert not unexpected, "imports against docs/architecture.md:\n" + "\n".join(unexpected)


def test_known_exceptions_still_exist() -> None:
    """An exception that no longer happens is removed from the list, so the list stays true."""
    current = {f"{v.path}:{v.module}" for v in violations()}
    stale = sorted(set(KNOWN_EXCEPTIONS) - current)
    assert not stale, f"known exceptions that no longer occur: {stale}"


def test_the_checker_sees_local_relative_and_from_imports(tmp_path: Path) -> None:
    """The parser finds the imports the rules are about, however they are spelled (a checker that
    missed function-local or relative imports would pass on anything)."""
    (tmp_path / "pump" / "storage").mkdir(parents=True)
    probe = tmp_path / "pump" / "storage" / "probe.py"
    probe.write_text("import os\n"
                     "def f():\n"
                     "    from sluice.ctl import main\n"
                     "    from ...drainer import reader\n"
                     "    from ... import ctl\n"
                     "    import sluice.core.cli\n"
                     "    from . import index\n")
    got = [(i.line, i.module) for i in imports_of(probe, tmp_path)]
    assert got == [(1, "os"), (3, "sluice.ctl"), (4, "sluice.drainer"), (5, "sluice.ctl"),
                   (6, "sluice.core.cli"), (7, "sluice.pump.storage")]
    assert [str(v) for v in violations.__wrapped__(tmp_path)] == [
        "pump/storage/probe.py:3 imports sluice.ctl",
        "pump/storage/probe.py:4 imports sluice.drainer",
        "pump/storage/probe.py:5 imports sluice.ctl"]
