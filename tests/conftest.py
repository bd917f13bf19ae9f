"""Suite-wide settings.

Workers the tests start run the float32 reference path unless a test names another
(`--dtype int8`): greedy outputs are compared with transformers' float32 `generate`.
The worker reads CBSERVE_DTYPE as its --dtype default; a developer can run the
whole suite on another path by setting it before pytest.

The suite starts several processes of OpenMP threads on a 2-core machine (a test's
stack beside the session's, two workers at once, this process driving load), so its
OpenMP threads spin at most GOMP_SPINCOUNT=10000 times (tens of microseconds) before
they sleep, instead of libgomp's 300,000, which assumes the cores are the process's
own: a thread that spins through its time slice while its partner waits for a core
made a 2-thread worker beside one busy core 15 times slower (4 requests of 32 tokens:
43 s against 2.8 s alone, 5.7 s with the shorter spin; alone it costs about 10%).
It changes how threads wait, not what they compute. Set here, before this process
loads torch's libgomp, and inherited by every process the tests start.

The tiers (`make test`, `make test-fast` = pytest --fast) and their markers are in
tests/tiers.py; its hooks are this file's. Under pytest-xdist, tests/parallel.py keeps the
tests that share a stack or the loaded weights on one worker.
"""

from __future__ import annotations

import os

import pytest

from tests.parallel import group_for_workers
from tests.tiers import (  # noqa: F401 (pytest's hooks, found by name)
    mark_tiers,
    pytest_addoption,
    pytest_configure,
    pytest_ignore_collect,
    pytest_runtest_makereport,
    pytest_runtest_protocol,
)
from tests.tls_certs import TestCertificates, make_certificates

os.environ.setdefault("CBSERVE_DTYPE", "float32")
os.environ.setdefault("GOMP_SPINCOUNT", "10000")


@pytest.fixture(scope="session")
def test_certificates(tmp_path_factory) -> TestCertificates:
    """A throwaway CA with a server certificate for localhost/127.0.0.1 and a client one."""
    return make_certificates(tmp_path_factory.mktemp("tls"))


# First: xdist's own hook reads the groups into the test ids (--dist loadgroup).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    mark_tiers(items)  # first: the groups follow the tiers' markers
    group_for_workers(config, items)
