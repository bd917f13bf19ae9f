"""The format benchmark's files (bench/peers/gguf_files.py): where they go, what each is
scored against, and llama-quantize's command line (a stand-in script records it: CI has
no llama.cpp)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.peers import gguf_files, llama_server


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("CBSERVE_PEERS_CACHE", str(tmp_path))
    return tmp_path / "llama.cpp" / llama_server.LLAMA_CPP_PYTHON_VERSION


def test_the_files_sit_beside_the_binaries_that_made_them(cache):
    assert gguf_files.files_dir() == cache / "gguf-files"
    row, gguf, reference = gguf_files.table_file("q4_k_m")
    assert gguf == cache / "gguf-files" / "SmolLM2-135M-Instruct.Q4_K_M.gguf"
    assert reference is None  # the default model's: bench/accuracy/reference.py finds it
    row, gguf, reference = gguf_files.table_file("qwen3-q4_k_m")
    assert gguf.name == "qwen3-48m-random.Q4_K_M.gguf"
    assert reference == cache / "gguf-files" / "qwen3-48m-random"
    _, shipped, _ = gguf_files.table_file("shipped")
    assert shipped.name == "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_the_qwen3_shape_is_about_48m_parameters_in_whole_super_blocks():
    shape = gguf_files.QWEN3_SHAPE
    hidden, inter, layers = shape["hidden_size"], shape["intermediate_size"], 7
    q = shape["num_attention_heads"] * shape["head_dim"]
    kv = shape["num_key_value_heads"] * shape["head_dim"]
    per_layer = hidden * (q + 2 * kv) + q * hidden + 3 * hidden * inter
    total = shape["vocab_size"] * hidden + layers * per_layer
    assert 45e6 < total < 50e6 and shape["num_hidden_layers"] == layers
    # Rows of whole 256-weight super-blocks: Q4_K_M keeps K-quants everywhere.
    assert all(n % 256 == 0 for n in (hidden, inter, q))


# runs a program: not the fast tier (tests/tiers.py)
@pytest.mark.process
def test_quantize_says_how_to_build_it_and_runs_llama_quantize_as_documented(cache, tmp_path):
    with pytest.raises(RuntimeError, match="make bench-peers"):
        gguf_files.quantize(tmp_path / "in.gguf", tmp_path / "out.gguf", "Q8_0", 2)
    binary = cache / "bin" / "llama-quantize"
    binary.parent.mkdir(parents=True)
    # Records its arguments and writes its output file, as llama-quantize does.
    binary.write_text('#!/bin/sh\necho "$@" > "$(dirname "$0")/argv"\n: > "$3"\n')
    binary.chmod(0o755)
    out = gguf_files.quantize(tmp_path / "in.gguf", tmp_path / "out.gguf", "Q8_0", 2, True)
    assert out.is_file() and not out.with_name("out.gguf.partial").exists()
    argv = (binary.parent / "argv").read_text().split()
    assert argv == ["--allow-requantize", str(tmp_path / "in.gguf"),
                    str(tmp_path / "out.gguf.partial"), "Q8_0", "2"]  # fmt: skip
    binary.write_text("#!/bin/sh\necho cannot >&2\nexit 3\n")
    with pytest.raises(RuntimeError, match="exited 3"):
        gguf_files.quantize(tmp_path / "in.gguf", tmp_path / "bad.gguf", "Q8_0", 2)
    assert not (tmp_path / "bad.gguf").exists()
