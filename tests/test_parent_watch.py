"""A launcher's children die with it, even when it is SIGKILLed (common.parent_watch)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.waiting import wait_until

pytestmark = pytest.mark.process

# The child and the launcher sleep to stay alive until killed: what is tested is
# that the child does not outlive the launcher.
CHILD = (
    "from common import parent_watch; parent_watch.die_with_parent(); import time; "
    "print('child ready ', flush=True); time.sleep(120)"
)
# The child is started from a thread that ends at once: the child must outlive that
# thread (prctl's parent-death signal fires on the starting thread's exit) and die
# only with the launcher process.
LAUNCHER = f"""
import sys, threading, time
from cbserve.local_stack import ChildProcess
started = []


def start_child():
    child = ChildProcess("child", [sys.executable, "-c", {CHILD!r}])
    child.wait_ready(30)  # armed while its starting thread is still alive
    started.append(child)


starter = threading.Thread(target=start_child)
starter.start()
starter.join()
child = started[0]
time.sleep(1.0)  # the starting thread is gone for a second: the child must still be up
print(child.process.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by init) counts as gone.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0] != "Z"


def test_children_die_when_the_launcher_is_killed():
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    try:
        child_pid = int(launcher.stdout.readline())
        assert _alive(child_pid)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(10)
        wait_until("the child gone with its killed launcher", lambda: not _alive(child_pid), 10)
    finally:
        launcher.kill()
