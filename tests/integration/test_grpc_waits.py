"""A thread blocked on a gRPC stream (every etcd watch and lease keepalive of pyetcd) wakes once a
second in a Sluice process, not ten times as with grpc's own period (0.1 s), a good part of an
idle process's CPU (core/grpcutil.py calm_blocking_waits, applied by `sluice`'s main)."""
import json
import subprocess
import sys

import pytest

from sluice.ctl import main as ctl_main

pytestmark = pytest.mark.timeout(60)

# Counts the voluntary context switches (one per wakeup) of the thread that waits on an idle
# etcd watch stream, over 3 s, with or without calm_blocking_waits().
_PROBE = r"""
import json, sys, threading, time
from sluice.core import grpcutil
from sluice.core.etcd import Etcd
from sluice.core.keywatch import KeyWatch

if sys.argv[2] == "calm":
    grpcutil.calm_blocking_waits()
etcd = Etcd(sys.argv[1], timeout=5)
watch = KeyWatch(etcd, "/grpc-waits/key")
watch.wait(0.05)
time.sleep(1.0)
waiter = next(t for t in threading.enumerate() if t.name.startswith("pyetcd_watch"))

def switches() -> int:
    with open(f"/proc/self/task/{waiter.native_id}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt"))

before = switches()
time.sleep(3.0)
print(json.dumps({"wakeups": switches() - before}))
watch.cancel()
etcd.close()
"""


def _wakeups(endpoint: str, mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _PROBE, endpoint, mode], capture_output=True,
                         text=True, timeout=40)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])["wakeups"]


def test_a_thread_waiting_on_an_idle_grpc_stream_wakes_once_a_second(etcd_module):
    default = _wakeups(etcd_module.endpoint, "default")
    calm = _wakeups(etcd_module.endpoint, "calm")
    assert default >= 20, f"grpc's own period should wake the waiter ~30 times in 3 s: {default}"
    # One wakeup a second: a 3 s window holds 3 of them, or 4 when it starts just before one
    # and ends just after another; each at most two switches (it may wait for the GIL once
    # more). A CI run under load counted 7.
    assert calm <= 8, f"after calm_blocking_waits, 3-4 wakeups in 3 s expected: {calm}"


def test_sluice_main_calms_blocking_waits_for_the_command_it_runs(monkeypatch, tmp_path):
    from grpc import _common
    monkeypatch.setattr(_common, "MAXIMUM_WAIT_TIMEOUT", 0.1)
    ctl_main.main(["cluster", "status", "--dir", str(tmp_path / "no-cluster")])
    assert _common.MAXIMUM_WAIT_TIMEOUT == 1.0
