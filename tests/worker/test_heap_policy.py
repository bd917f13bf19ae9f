"""The worker's malloc policy (worker_svc/heap_policy.py): a step's freed buffers stay in
the heap for the next step, the user's own glibc settings win, and the policy is checked
at construction. Each behavioural test runs in a child process, since mallopt changes
the process for good."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from worker_svc.heap_policy import HeapPolicy, apply_heap_policy

# Allocates and frees an 8 MiB buffer; prints whether it came from the heap (mallinfo2's
# arena grew) and whether the heap kept it after the free.
_CHILD = textwrap.dedent(
    """
    import ctypes, sys
    from worker_svc.heap_policy import apply_heap_policy

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = (ctypes.c_void_p,)
    if sys.argv[1] == "policy":
        print(apply_heap_policy({}))
    before = libc.mallinfo2().arena
    block = libc.malloc(8 << 20)
    ctypes.memset(block, 1, 8 << 20)
    grown = libc.mallinfo2().arena - before
    libc.free(block)
    kept = libc.mallinfo2().arena - before
    # More than half of it: the heap's top may have held some free bytes already.
    print(grown > 4 << 20, kept > 4 << 20)
    """
)


def _child(mode: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, mode], capture_output=True, text=True, check=True
    )
    return done.stdout.split("\n")


def _glibc() -> bool:
    import ctypes

    return hasattr(ctypes.CDLL(None), "mallinfo2")


@pytest.mark.process
@pytest.mark.skipif(not _glibc(), reason="mallinfo2 is glibc's (2.33+)")
def test_freed_step_buffers_stay_in_the_heap():
    applied, outcome, _ = _child("policy")
    assert "trim_threshold" in applied
    # From the heap, not a mapping of its own, and still there after the free: the
    # next step's buffer of the same size is not faulted in again.
    assert outcome == "True True"


@pytest.mark.process
@pytest.mark.skipif(not _glibc(), reason="mallinfo2 is glibc's (2.33+)")
def test_without_the_policy_glibc_maps_and_returns_the_buffer():
    # The control: the same child without the policy shows what the policy changes.
    (outcome, _) = _child("none")
    assert outcome == "False False"


def test_the_users_glibc_variables_are_kept():
    applied = apply_heap_policy({"MALLOC_TRIM_THRESHOLD_": "131072"})
    assert applied["variables"] == ["MALLOC_TRIM_THRESHOLD_"]
    assert "user" in applied["policy"]


def test_a_library_without_mallopt_leaves_the_defaults():
    applied = apply_heap_policy({}, libc_name="/nonexistent/libc.so.6")
    assert "defaults" in applied["policy"]


@pytest.mark.parametrize("fields", [{"mmap_threshold": 64 << 20}, {"trim_threshold": 0}])
def test_the_policy_is_checked_at_construction(fields):
    with pytest.raises(ValueError):
        HeapPolicy(**fields)
