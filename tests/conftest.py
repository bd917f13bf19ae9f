"""Suite-wide settings.

Workers the tests start run the float32 reference path unless a test names another
(`--dtype int8`): greedy outputs are compared with transformers' float32 `generate`.
The worker reads CBSERVE_DTYPE as its --dtype default; a developer can run the
whole suite on another path by setting it before pytest.
"""

from __future__ import annotations

import os

import pytest

from tests.tls_certs import TestCertificates, make_certificates

os.environ.setdefault("CBSERVE_DTYPE", "float32")


@pytest.fixture(scope="session")
def test_certificates(tmp_path_factory) -> TestCertificates:
    """A throwaway CA with a server certificate for localhost/127.0.0.1 and a client one."""
    return make_certificates(tmp_path_factory.mktemp("tls"))
