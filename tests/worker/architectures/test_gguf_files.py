"""GGUF files written by llama.cpp's own converter (`convert_hf_to_gguf.py`, from the
sdist `make bench-peers` builds) from the random checkpoints, served by the own forward:
its config read from the file's metadata (no transformers), names, rope pairing (llama
permuted, qwen/gemma not), Gemma's stored (1 + w) norms and Llama 3's rope_freqs.

- an f32 file computes exactly what its safetensors original computes;
- a q8_0 file runs on its own blocks (`--dtype q4_1`), natively, and computes what the
  float forward computes on the same file's dequantized weights.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.worker.architectures.test_float_forward import CPU, Paged, prompt
from worker_svc.attention import CpuAttentionBackend
from worker_svc.model_loader import load_model

pytestmark = [pytest.mark.model, pytest.mark.process]  # the converter is a subprocess

# Qwen2 is left out: this converter refuses the test tokenizer (SmolLM2's) for it, as a
# pre-tokenizer it does not recognize. Llama 3 (its rope_freqs tensor, its permuted q/k)
# runs in `make test-slow`, to keep `make test` within its time.
CONVERTED = (
    pytest.param("llama3", marks=pytest.mark.slow),
    "qwen3",
    # Gemma 3's file (its stored 1 + w norms) runs in `make test-slow` too; make test reads
    # a Gemma GGUF in test_gguf_float16.py (gemma3-bf16).
    pytest.param("gemma3", marks=pytest.mark.slow),
    # Mixtures: the converter stacks each layer's experts into 3-D *_exps tensors. Their
    # files run in `make test-slow`, as Llama 3's; make test reads gpt-oss's converted
    # and quantized GGUF in test_mxfp4_gguf.py.
    pytest.param("qwen3_moe", marks=pytest.mark.slow),
    pytest.param("mixtral", marks=pytest.mark.slow),
    # gate and up de-interleaved, sinks, llama.cpp's window pattern, YaRN
    pytest.param("gpt_oss", marks=pytest.mark.slow),
)


@pytest.fixture(scope="module")
def converted(checkpoints, tmp_path_factory):
    """convert(family, outtype), each file written once per module (a converter run is
    seconds of CPU): the tokenizer test reads the qwen3 f32 file the forward tests read."""
    from bench.peers.converter import convert

    made: dict[tuple[str, str], Path] = {}

    def once(name: str, outtype: str) -> Path:
        if (name, outtype) not in made:
            out = tmp_path_factory.mktemp(f"gguf-{name}-{outtype}") / f"{name}.gguf"
            made[name, outtype] = convert(checkpoints[name], out, outtype)
        return made[name, outtype]

    return once


@pytest.fixture(scope="module", params=CONVERTED)
def files(request, checkpoints, converted):
    name = request.param
    return name, checkpoints[name], converted(name, "f32"), converted(name, "q8_0")


def logits(loaded, ids) -> torch.Tensor:
    with torch.inference_mode():
        paged = Paged(loaded, CpuAttentionBackend())
        half = len(ids) // 2
        parts = [paged.step(ids[:half], 0)]
        parts += [paged.step(ids[i : i + 1], i) for i in range(half, len(ids))]
    return torch.cat(parts)


def test_an_f32_file_computes_what_its_original_computes(files):
    name, source, f32, _ = files
    ids = prompt(11)
    original = load_model(source, "float32", CPU)
    from_file = load_model(f32, "float32", CPU)
    assert from_file.model_impl == "cbserve" and from_file.architecture.name in name
    mine, theirs = from_file.model.spec, original.model.spec
    # The file stores eps as float32, and Llama 3's scaling as divisors (rope_freqs).
    assert mine.features() == theirs.features() and mine.windows == theirs.windows
    assert (mine.hidden_size, mine.num_heads, mine.num_kv_heads, mine.head_dim) == (
        theirs.hidden_size,
        theirs.num_heads,
        theirs.num_kv_heads,
        theirs.head_dim,
    )
    assert mine.tied_head == theirs.tied_head and mine.scale == theirs.scale
    torch.testing.assert_close(logits(from_file, ids), logits(original, ids), rtol=1e-5, atol=1e-5)


def test_a_q8_0_file_runs_on_its_own_blocks(files):
    _, _, _, q8_0 = files
    ids = prompt(12)
    blocks = load_model(q8_0, "q4_1", CPU)
    assert "own blocks" in blocks.model.qblock_source
    assert blocks.model.native_decode_status == "native decode steps"
    dequantized = load_model(q8_0, "float32", CPU)
    torch.testing.assert_close(logits(blocks, ids), logits(dequantized, ids), rtol=1e-3, atol=1e-3)


def test_the_scheduler_reads_a_files_own_tokenizer_and_template(
    checkpoints, converted, tmp_path, monkeypatch
):
    """No tokenizer files beside the GGUF (each file is alone in its directory): its
    metadata gives the same ids, template and EOS as the original's files (made once, in
    a child process: the scheduler never imports transformers or torch for it)."""
    from scheduler_svc.api.gguf_tokenizer import CACHE_ENV
    from scheduler_svc.api.tokenizer import ChatTurn, Tokenizer

    source = checkpoints["qwen3"]
    gguf = converted("qwen3", "f32")
    assert [path.name for path in gguf.parent.iterdir()] == [gguf.name]
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    from_file, original = Tokenizer(gguf), Tokenizer(source)
    text = "Hello, world! The quick brown fox, ünïcödé and 123."
    assert from_file.encode(text, False) == original.encode(text, False)
    chat = [ChatTurn("user", "What is the capital of France?")]
    assert from_file.encode_chat(chat) == original.encode_chat(chat)
    assert from_file.eos_token_ids == original.eos_token_ids
    assert len(list((tmp_path / "cache").iterdir())) == 1  # made once, then read
