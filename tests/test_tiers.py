"""The fast tier's guard (tests/tiers.py): what it lets a test do and what it refuses."""

from __future__ import annotations

import sys

import pytest

from tests import tiers
from worker_svc.native_build import cache_dir, compiler


def popen(argv):
    return (argv[0], argv, None, None)  # the audit event's (executable, args, cwd, env)


def audited(argv):
    """Runs the guard's audit hook on a Popen of `argv`, as if a fast-tier test ran it."""
    seen, active = tiers._Guard.seen, tiers._Guard.active
    tiers._Guard.seen, tiers._Guard.active = [], True
    try:
        tiers._Guard._audit("subprocess.Popen", popen(argv))
        return tiers._Guard.seen
    finally:
        tiers._Guard.seen, tiers._Guard.active = seen, active


@pytest.mark.skipif(compiler() is None, reason="no C compiler")
def test_a_kernel_build_into_the_cache_is_allowed():
    out = str(cache_dir() / "tmpdir" / "0-kernel.o")
    assert tiers._builds_a_kernel(popen([compiler(), "-O3", "-c", "kernel.c", "-o", out]))
    assert audited([compiler(), "-O3", "-c", "kernel.c", "-o", out]) == []


@pytest.mark.skipif(compiler() is None, reason="no C compiler")
def test_the_compiler_writing_elsewhere_is_a_process():
    assert not tiers._builds_a_kernel(popen([compiler(), "x.c", "-o", "/tmp/x.so"]))
    with pytest.raises(RuntimeError, match="mark it @pytest.mark.process"):
        audited([compiler(), "x.c", "-o", "/tmp/x.so"])


def test_ldconfig_is_cheap_and_python_is_a_process():
    assert audited(["/sbin/ldconfig", "-p"]) == []
    with pytest.raises(RuntimeError, match="starts a process"):
        audited([sys.executable, "-m", "bench.attention_ab"])
