"""core/memory: with freed memory retained, a freed large buffer stays in the process for reuse
(without, glibc unmaps it at once); checked by RSS in fresh processes on this glibc host."""
from __future__ import annotations

import subprocess
import sys

_CODE = """
import sys
from sluice.core.memory import retain_freed_memory
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
retain = sys.argv[1] == "retain"
if retain:
    assert retain_freed_memory(256 << 20) is True
bufs = [bytearray(b"x" * (3 << 20)) for _ in range(8)]     # 24 MiB, touched
full = rss()
del bufs
freed = full - rss()
again = [bytearray(b"y" * (3 << 20)) for _ in range(8)]    # served from what was kept
assert all(b[-1] == ord("y") for b in again)
print(freed)
"""


def _freed(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _CODE, mode], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


def test_freed_large_buffers_stay_in_the_process_only_when_retained() -> None:
    assert _freed("default") >= 20 << 20      # unmapped at free
    assert _freed("retain") < 4 << 20         # kept for the next buffers
