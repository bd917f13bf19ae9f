"""Children of a launcher die with it, even when it is SIGKILLed.

The launcher (cbserve.local_stack) names itself in CBSERVE_DIE_WITH_PARENT;
the child asks the kernel (Linux prctl PR_SET_PDEATHSIG) for SIGTERM when that
parent dies. This runs in the child's own main, not in a preexec_fn: code in
a preexec_fn runs between fork and exec, where a launcher with threads (gRPC
clients, test runners) can leave locks held, and the child crashed there.
"""

from __future__ import annotations

import os
import signal
import sys

ENV_VAR = "CBSERVE_DIE_WITH_PARENT"
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Arms the death signal when the launcher asked for it; exits if it is already gone."""
    parent = os.environ.get(ENV_VAR)
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if str(os.getppid()) != parent:
        # The launcher died before the signal was armed: nobody will stop us.
        sys.exit(f"launcher {parent} is gone; exiting")
