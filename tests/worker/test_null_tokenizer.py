"""The null worker's tokenizer reader (worker_svc/null/tokenizer.py) against transformers'
AutoTokenizer on the same files: the same vocabulary to sample from and the same EOS
wherever it reads them, and None (transformers decides) wherever it does not fully
understand a tokenizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from common.defaults import default_model_path
from worker_svc.null.sampler import ordinary_token_ids
from worker_svc.null.tokenizer import read_tokenizer_files


@pytest.fixture(scope="module")
def model_dir() -> Path:
    directory = Path(default_model_path())
    if not (directory / "tokenizer.json").is_file():
        pytest.fail(f"{directory} is not the converted model directory (make model)")
    return directory


def with_config(tmp_path: Path, model_dir: Path, **changes) -> Path:
    """A copy of the model's tokenizer files, tokenizer_config.json changed."""
    shutil.copy(model_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config.update(changes)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


def assert_read_as_transformers_reads_it(directory: Path):
    from transformers import AutoTokenizer

    own, theirs = read_tokenizer_files(directory), AutoTokenizer.from_pretrained(str(directory))
    assert own is not None
    assert len(own) == len(theirs)
    assert sorted(own.all_special_ids) == sorted(theirs.all_special_ids)
    assert own.eos_token_id == theirs.eos_token_id
    assert ordinary_token_ids(own) == ordinary_token_ids(theirs)
    return own


def test_the_default_tokenizer_reads_as_transformers_reads_it(model_dir):
    own = assert_read_as_transformers_reads_it(model_dir)
    # Added tokens that are not named special ones (<repo_name>, ...) are ordinary text
    # to transformers too.
    assert own.all_special_ids == (1, 2, 0) and 5 in ordinary_token_ids(own)


def test_extra_special_tokens_are_special(tmp_path, model_dir):
    directory = with_config(tmp_path, model_dir, extra_special_tokens=["<repo_name>"])
    own = assert_read_as_transformers_reads_it(directory)
    repo_name = own.backend.token_to_id("<repo_name>")
    assert repo_name in own.all_special_ids and repo_name not in ordinary_token_ids(own)


@pytest.mark.parametrize(
    "changes",
    [
        {"tokenizer_class": "GPT2Tokenizer"},
        {"clean_up_tokenization_spaces": True},
        {"added_tokens_decoder": {"0": {"content": "<|endoftext|>", "special": True}}},
        {"unk_token": "<not-in-the-vocabulary>"},
        {"extra_special_tokens": "<repo_name>"},
    ],
)
def test_what_it_does_not_fully_understand_is_left_to_transformers(tmp_path, model_dir, changes):
    assert read_tokenizer_files(with_config(tmp_path, model_dir, **changes)) is None


def test_a_gguf_file_or_missing_files_are_left_to_transformers(tmp_path, model_dir):
    assert read_tokenizer_files(tmp_path) is None
    shutil.copy(model_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    assert read_tokenizer_files(tmp_path) is None  # no tokenizer_config.json
    assert read_tokenizer_files(tmp_path / "model.gguf") is None
