"""`sluice ctl` in-process for tests: the same parser and code path as the CLI, minus the
~2 s interpreter start of a subprocess (and minus logging setup)."""
from __future__ import annotations

import dataclasses
import io
import json
from typing import Any

from sluice.ctl import main as cli
from sluice.ctl import admin


@dataclasses.dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def ctl_in(etcd: str, cluster_id: int, *args: str) -> Result:
    parser, _ = cli.command_parser("ctl")
    ns = parser.parse_args(["--etcd", etcd, "--cluster-id", str(cluster_id), *args])
    out, err = io.StringIO(), io.StringIO()
    code = admin.execute(ns, out=out, err=err)
    return Result(code, out.getvalue(), err.getvalue())
