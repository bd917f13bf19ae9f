from __future__ import annotations

import pytest

from .harness import Harness, load_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer()


@pytest.fixture
def harness() -> Harness:
    return Harness()
