"""Session fixtures: the small random checkpoints of every architecture, written once."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.defaults import converted_model_dir
from tests.worker.architectures.checkpoints import ARCHITECTURES, write_checkpoint


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("architectures")
    tokenizer = converted_model_dir()
    return {name: write_checkpoint(name, root / name, tokenizer) for name in ARCHITECTURES}
