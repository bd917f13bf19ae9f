"""Children of a launcher die with it, even when it is SIGKILLed.

The launcher (cbserve.local_stack) names itself in CBSERVE_DIE_WITH_PARENT;
the child then waits, in a daemon thread, on a pidfd of that process and
sends itself SIGTERM (its graceful shutdown) when it exits.

Not prctl(PR_SET_PDEATHSIG): the kernel fires that when the *thread* that
started the child exits, not the process, so a worker started from
asyncio.to_thread or any short-lived thread was killed the moment that thread
ended. And not in a preexec_fn: code there runs between fork and exec, where a
launcher with threads (gRPC clients, test runners) can leave locks held.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time

ENV_VAR = "CBSERVE_DIE_WITH_PARENT"
# Without pidfd_open (kernels before 5.3), how often the parent is looked for.
POLL_INTERVAL_S = 0.5


def die_with_parent() -> None:
    """Watches the launcher when it asked for it; exits if it is already gone."""
    parent = os.environ.get(ENV_VAR)
    if not parent or not sys.platform.startswith("linux"):
        return
    parent_pid = int(parent)
    # Opened before the check below, so that the launcher cannot exit unseen between.
    pidfd = _open_pidfd(parent_pid)
    if os.getppid() != parent_pid:
        # The launcher died before we watched it: nobody will stop us.
        sys.exit(f"launcher {parent} is gone; exiting")
    threading.Thread(
        target=_terminate_when_gone, args=(parent_pid, pidfd), name="parent-watch", daemon=True
    ).start()


def _open_pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _terminate_when_gone(parent_pid: int, pidfd: int | None) -> None:
    if pidfd is not None:
        select.select([pidfd], [], [])  # readable once the process has exited
    else:
        while os.getppid() == parent_pid:
            time.sleep(POLL_INTERVAL_S)
    os.kill(os.getpid(), signal.SIGTERM)
