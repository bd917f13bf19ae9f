"""Suite-wide settings.

Workers the tests start run the float32 reference path unless a test names another
(`--dtype int8`): greedy outputs are compared with transformers' float32 `generate`.
The worker reads CBSERVE_DTYPE as its --dtype default; a developer can run the
whole suite on another path by setting it before pytest.

The tiers (`make test`, `make test-fast` = pytest --fast) and their markers are in
tests/tiers.py; its hooks are this file's.
"""

from __future__ import annotations

import os

import pytest

from tests.tiers import (  # noqa: F401 (pytest's hooks, found by name)
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_ignore_collect,
    pytest_runtest_makereport,
    pytest_runtest_protocol,
)
from tests.tls_certs import TestCertificates, make_certificates

os.environ.setdefault("CBSERVE_DTYPE", "float32")


@pytest.fixture(scope="session")
def test_certificates(tmp_path_factory) -> TestCertificates:
    """A throwaway CA with a server certificate for localhost/127.0.0.1 and a client one."""
    return make_certificates(tmp_path_factory.mktemp("tls"))
