"""A small random gpt-oss GGUF whose experts are MXFP4 blocks (GGUF type 39), as the
released gpt-oss files store them, for timing the MXFP4 kernels
(compute/kernels/qblock_mxfp4.c) with bench.micro.step_compare:

    .venv/bin/python -m bench.micro.gpt_oss_mxfp4            # prints the file's path
    .venv/bin/python -m bench.micro.step_compare --batches 1,16 \
        --dtypes q4_1@<the MXFP4 file>,q4_1@<its Q8_0 twin>

The checkpoint is written by transformers with random weights (bench/peers/random_weights.py)
and the default model's tokenizer, converted to F16 by llama.cpp's `convert_hf_to_gguf.py`,
then quantized by `llama-quantize ... MXFP4_MOE` (from `make bench-peers`): experts MXFP4,
the rest Q8_0, as llama.cpp makes an MXFP4 file from float weights. Everything stays in the
peers' cache (`<cache>/gguf-files/`), made once. The expert bytes a token reads, per
format, are printed beside the paths.

Its Q8_0 twin holds the very same expert weights as Q8_0 blocks (scale the block's power
of two in float16, int8 the codes' integers: what the loader made of MXFP4 before the
MXFP4 kernels, 34 bytes a block where MXFP4 reads 17), so that one step_compare run
times the two formats interleaved.
"""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "gpt-oss-random-mxfp4"
# SmolLM2-135M's attention (hidden 576 is not a multiple of 64 heads' needs: 512 is) and
# 32 experts of which a token takes 4 of 512 rows each: every row a multiple of 32.
SHAPE = {
    "vocab_size": 49152,  # the default model's tokenizer
    "hidden_size": 512,
    "intermediate_size": 512,  # each expert's
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_local_experts": 32,
    "num_experts_per_tok": 4,
    "sliding_window": 128,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
SEED = 39


def expert_bytes_per_token(block_bytes: int) -> int:
    """Bytes of the chosen experts' gate, up and down rows one token reads, every layer,
    for a format of `block_bytes` per 32 weights."""
    h, i, k = SHAPE["hidden_size"], SHAPE["intermediate_size"], SHAPE["num_experts_per_tok"]
    per_expert = (2 * i * h + h * i) // 32 * block_bytes
    return per_expert * k * SHAPE["num_hidden_layers"]


def make(threads: int = 2) -> Path:
    """The MXFP4 file, made where missing."""
    import shutil

    import transformers as hf

    from bench.peers.converter import convert
    from bench.peers.gguf_files import files_dir, quantize
    from bench.peers.random_weights import randomize
    from common.defaults import converted_model_dir

    folder = files_dir()
    out = folder / f"{NAME}.gguf"
    if out.is_file():
        return out
    checkpoint = folder / NAME
    if not (checkpoint / "config.json").is_file():
        model = hf.AutoModelForCausalLM.from_config(hf.GptOssConfig(**SHAPE))
        randomize(model, SEED)
        staging = checkpoint.with_name(checkpoint.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        model.save_pretrained(staging)
        for file in converted_model_dir().iterdir():
            if file.name.startswith(("tokenizer", "special_tokens", "generation_config")):
                shutil.copy(file, staging / file.name)
        staging.replace(checkpoint)
    f16 = convert(checkpoint, folder / f"{NAME}.F16.gguf", "f16")
    return quantize(f16, out, "MXFP4_MOE", threads)


def q8_0_twin(mxfp4_file: Path) -> Path:
    """`mxfp4_file` with each MXFP4 tensor rewritten as Q8_0 blocks of the same values."""
    import gguf
    import numpy as np

    from bench.peers.gguf_rewrite import rewrite_gguf_tensors

    out = mxfp4_file.with_name(mxfp4_file.stem + ".experts-q8_0.gguf")
    if out.is_file():
        return out
    codes = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)

    def as_q8_0(tensor: gguf.ReaderTensor) -> tuple[np.ndarray, gguf.GGMLQuantizationType] | None:
        if tensor.tensor_type != gguf.GGMLQuantizationType.MXFP4:
            return None
        blocks = tensor.data.reshape(-1, 17)
        q8 = np.empty((len(blocks), 34), np.uint8)
        scale = np.ldexp(np.float32(1), blocks[:, 0].astype(np.int32) - 128).astype(np.float16)
        q8[:, :2] = scale.view(np.uint8).reshape(-1, 2)
        q8[:, 2:18] = codes[blocks[:, 1:] & 0x0F].view(np.uint8)
        q8[:, 18:] = codes[blocks[:, 1:] >> 4].view(np.uint8)
        return q8.reshape(*tensor.data.shape[:-1], -1), gguf.GGMLQuantizationType.Q8_0

    rewrite_gguf_tensors(mxfp4_file, out, as_q8_0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.micro.gpt_oss_mxfp4")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    path = make(args.threads)
    for name, block in (("MXFP4 as stored", 17), ("as Q8_0", 34)):
        print(f"# experts read per token, {name}: {expert_bytes_per_token(block) / 1e6:.2f} MB")
    print(path)
    print(q8_0_twin(path))


if __name__ == "__main__":
    main()
