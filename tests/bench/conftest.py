"""The benchmark's tests: pure Python, plus one real stack for the end-to-end run."""

from __future__ import annotations

import pytest

from common.defaults import converted_model_dir


@pytest.fixture(scope="session")
def model_dir():
    path = converted_model_dir()
    if not (path / "tokenizer.json").exists():
        pytest.skip(f"no converted model at {path} (make model)")
    return path


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    from scheduler_svc.api.tokenizer import Tokenizer

    return Tokenizer(model_dir)
