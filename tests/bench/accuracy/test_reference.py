"""Which float32 model a GGUF is scored against (bench/accuracy/reference.py), on small
GGUF files written here by the `gguf` package."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.accuracy.reference import (
    ReferenceError,
    gguf_identity,
    is_default_model,
    resolve_reference,
)


def write_gguf(
    path: Path,
    hidden: int = 32,
    vocab: int = 16,
    dtype=np.float32,
    arch: str = "llama",
    token_prefix: str = "t",
) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(2 * hidden)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"{token_prefix}{i}" for i in range(vocab)])
    writer.add_tensor("token_embd.weight", np.ones((vocab, hidden), dtype))
    writer.add_tensor("blk.0.ffn_down.weight", np.ones((hidden, 2 * hidden), dtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# writes and opens a GGUF file: not the fast tier (tests/tiers.py)
@pytest.mark.model
def test_a_requantization_keeps_the_identity_a_reshape_or_new_vocabulary_does_not(tmp_path):
    shipped = write_gguf(tmp_path / "shipped.gguf")
    same = gguf_identity(shipped)
    assert gguf_identity(write_gguf(tmp_path / "f16.gguf", dtype=np.float16)) == same
    assert gguf_identity(write_gguf(tmp_path / "wide.gguf", hidden=64)) != same
    assert gguf_identity(write_gguf(tmp_path / "vocab.gguf", token_prefix="u")) != same
    assert gguf_identity(write_gguf(tmp_path / "qwen.gguf", arch="qwen3")) != same
    assert same.architecture == "llama"
    assert ("blk.0.ffn_down.weight", (64, 32)) in same.tensor_shapes


# writes and opens a GGUF file: not the fast tier (tests/tiers.py)
@pytest.mark.model
def test_the_default_models_requantization_is_scored_against_its_float_directory(
    tmp_path, monkeypatch
):
    converted = tmp_path / "converted"
    converted.mkdir()
    (converted / "config.json").write_text("{}")
    monkeypatch.setenv("CBSERVE_MODEL_DIR", str(converted))
    shipped = write_gguf(tmp_path / "shipped.gguf")
    requantized = write_gguf(tmp_path / "requantized.gguf", dtype=np.float16)
    assert is_default_model(shipped, shipped) and is_default_model(requantized, shipped)
    assert resolve_reference(requantized, None, shipped) == converted
    other = write_gguf(tmp_path / "other.gguf", token_prefix="u")
    with pytest.raises(ReferenceError, match="--reference"):
        resolve_reference(other, None, shipped)
    with pytest.raises(ReferenceError, match="--reference"):
        resolve_reference(requantized, None, None)  # no shipped file to compare with


# writes and opens a GGUF file: not the fast tier (tests/tiers.py)
@pytest.mark.model
def test_a_given_reference_must_have_the_files_shapes(tmp_path):
    model = write_gguf(tmp_path / "model.gguf")
    assert resolve_reference(model, write_gguf(tmp_path / "same.gguf"), None).name == "same.gguf"
    with pytest.raises(ReferenceError, match="is not the model of model.gguf"):
        resolve_reference(model, write_gguf(tmp_path / "wide.gguf", hidden=64), None)
    with pytest.raises(ReferenceError, match="cannot read"):
        resolve_reference(model, tmp_path / "missing", None)
