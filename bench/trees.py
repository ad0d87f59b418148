"""Baseline trees for the benchmarks that run an old tree against this one in one invocation.

A tree differs from this checkout in its Python *and* in its native module (`sluice_native`,
native/): a child that imported `sluice` from an old tree but `sluice_native` from this
checkout's venv would measure a mix of the two (or fail where the native API changed). So a
prepared tree carries its own native module: `prepare_base` builds it into `<tree>/_native` and
lays a `sluice` namespace of symlinks at `<tree>/_ns`; `tree_path` gives the sys.path entries a
child puts first, before any `sluice` import.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_PACKAGES = ("proto", "core", "tso", "pump", "client", "drainer", "spark_sink", "capture", "ctl")


def prepare_base(rev: str, into: Path) -> Path:
    """The tree of rev (git archive) at `<into>/base`, a `sluice` namespace of symlinks
    (`<tree>/_ns`) and its own native module built into `<tree>/_native` (cargo's cache copied
    from this checkout, the sources touched so cargo rebuilds them)."""
    tree = into / "base"
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    ns = tree / "_ns" / "sluice"
    ns.mkdir(parents=True)
    for name in _PACKAGES:
        (ns / name).symlink_to(tree / name)
    if (ROOT / "native/target").exists():
        shutil.copytree(ROOT / "native/target", tree / "native/target", symlinks=True,
                        ignore=shutil.ignore_patterns("wheels"))
    for f in (tree / "native/src").iterdir():
        f.touch()
    env = dict(os.environ, PATH=f"{Path.home() / '.cargo/bin'}:{os.environ.get('PATH', '')}")
    venv = Path(sys.executable).parent
    subprocess.run([str(venv / "maturin"), "build", "--quiet", "--release", "--locked",
                    "--manifest-path", str(tree / "native/Cargo.toml"), "--interpreter",
                    sys.executable, "--out", str(tree / "native/target/wheels")],
                   check=True, env=env, capture_output=True)
    wheel = next((tree / "native/target/wheels").glob("*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "--no-deps", "--target", str(tree / "_native"), str(wheel)], check=True)
    return tree


def export_tree(rev: str, work: Path) -> Path:
    """`rev`'s tree laid out as the `sluice` namespace (docs/packaging.md) under `<work>/baseline`:
    first on a process's PYTHONPATH, it runs that revision's Python (with this venv's native
    module: for a bench whose old and new native cores differ, use prepare_base)."""
    root = work / "baseline"
    (root / "sluice").mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(root / "sluice")], input=archive, check=True)
    return root


def tree_path(tree: str | Path) -> list[str]:
    """The sys.path entries that make a child import `sluice` (and, for a prepared tree,
    `sluice_native`) from `tree`. A plain tree (a `git archive` without `_native`) gets a
    directory holding only a `sluice` link: its native module is then this venv's."""
    tree = Path(tree).resolve()
    if (tree / "_native").is_dir() and (tree / "_ns").is_dir():
        return [str(tree / "_native"), str(tree / "_ns")]
    link_dir = Path(tempfile.mkdtemp(prefix="sluice-tree-"))
    (link_dir / "sluice").symlink_to(tree)
    return [str(link_dir)]
