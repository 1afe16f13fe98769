"""CPU accounting of process groups (tools/harness/procs.py:group_cpu_seconds), on real child processes."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools.harness.procs import group_cpu_seconds

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")

BUSY = "import time\nend = time.process_time() + {s}\nwhile time.process_time() < end: pass\ntime.sleep(30)\n"


def _spawn(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def test_counts_each_group_by_process_name() -> None:
    busy, idle = _spawn(BUSY.format(s=0.4)), _spawn("import time\ntime.sleep(30)\n")
    try:
        deadline = time.monotonic() + 20
        while True:
            got = group_cpu_seconds([busy.pid, idle.pid])
            assert got is not None
            if sum(got[busy.pid].values()) >= 0.35 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert sum(got[busy.pid].values()) >= 0.35  # its busy loop, counted
        assert sum(got[idle.pid].values()) < 0.3  # start-up only
        assert set(got[busy.pid]) == {Path(sys.executable).name[:15]}  # keyed by /proc/<pid>/comm
        assert 12345678 not in got  # only the groups asked for
    finally:
        for p in (busy, idle):
            p.kill()
            p.wait(5)


def test_a_group_with_no_live_process_reads_empty() -> None:
    p = _spawn("pass")
    p.wait(10)
    got = group_cpu_seconds([p.pid])
    assert got == {p.pid: {}}
