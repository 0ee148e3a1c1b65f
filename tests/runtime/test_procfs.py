"""``workers.runtime.cluster.procfs``: this process's and a child's stat fields, a zombie, a gone process."""

import os
import subprocess
import sys
import time

import pytest

from workers.runtime.cluster import procfs

pytestmark = pytest.mark.unit


def test_stat_fields_of_live_zombie_and_gone_processes() -> None:
    fields = procfs.stat_fields(os.getpid())
    assert fields is not None and fields[procfs.PPID] == str(os.getppid())
    assert procfs.cpu_seconds(fields) >= 0.0 and procfs.alive(os.getpid())
    assert os.getpid() in set(procfs.pids())
    child = subprocess.Popen([sys.executable, "-c", "pass"])  # exits at once, unreaped: a zombie
    try:
        deadline = time.monotonic() + 30
        while procfs.state(child.pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert child.pid in procfs.children(os.getpid())
        assert procfs.state(child.pid) == "Z" and not procfs.alive(child.pid)
    finally:
        child.wait()
    assert procfs.state(child.pid) is None and procfs.stat_fields(child.pid) is None
    assert procfs.in_sessions({os.getsid(0)}) and os.getpid() not in procfs.in_sessions({os.getsid(0)})
