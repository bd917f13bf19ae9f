"""Decode speed of every declared architecture beside the Llama layout of the same
dimensions, on one compute path: the issue's target is at least 0.8x Llama's. The
mixtures (Qwen3-MoE 16 experts top-4, Qwen2-MoE 16 top-4 with a shared expert, Mixtral
8 top-2, gpt-oss 16 top-4) have the dense checkpoint's *active* width (k experts side
by side, and the shared expert, = 1536), the comparison issue 42
sets (at least 0.85x at one stream, 0.5x at 16). Every weight is random
(bench/peers/random_weights.py), routers included, so tokens spread over the experts.

Each architecture gets a random checkpoint of SmolLM2-135M's dimensions (30 layers,
hidden 576, 9/3 heads of 64, vocabulary 49152), written by transformers, loaded by the
worker's own loader on `--dtype` (q4_1 by default: these float checkpoints are
quantized to Q8_0 at load), and stepped directly (no gRPC): `--batch` sequences
prefilled to `--context` tokens, then decode steps timed. Architectures are timed in
rounds, one step batch each in turn, so that a machine's drift hits all alike.

    python -m bench.micro.architectures [--dtype q4_1] [--batch 1,16] [--steps 32]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from worker_svc.attention import BatchLayout, CpuAttentionBackend, PagedAttentionContext
from worker_svc.compute.cpu_features import cpu_name
from worker_svc.kv_pool import KVPool, KVPoolSpec
from worker_svc.model_loader import load_model

DIMS = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "max_position_embeddings": 2048,
}
BLOCK = 16


def configs() -> dict:
    import transformers as hf

    return {
        "llama": hf.LlamaConfig(**DIMS, tie_word_embeddings=True),
        "mistral (window 64)": hf.MistralConfig(**DIMS, sliding_window=64),
        "qwen2": hf.Qwen2Config(**DIMS, tie_word_embeddings=True),
        "qwen3": hf.Qwen3Config(**DIMS, tie_word_embeddings=True),
        "gemma3": hf.Gemma3TextConfig(**DIMS, sliding_window=64, query_pre_attn_scalar=64),
        "qwen3_moe (16, top-4)": hf.Qwen3MoeConfig(
            **DIMS,
            num_experts=16,
            num_experts_per_tok=4,
            moe_intermediate_size=DIMS["intermediate_size"] // 4,
            norm_topk_prob=True,
            tie_word_embeddings=True,
        ),
        "mixtral (8, top-2)": hf.MixtralConfig(
            **{**DIMS, "intermediate_size": DIMS["intermediate_size"] // 2},
            num_local_experts=8,
            num_experts_per_tok=2,
            tie_word_embeddings=True,
        ),
        "gpt_oss (16, top-4)": hf.GptOssConfig(
            **{**DIMS, "intermediate_size": DIMS["intermediate_size"] // 4},
            num_local_experts=16,
            num_experts_per_tok=4,
            sliding_window=64,
            tie_word_embeddings=True,
        ),
        # Half its active width in the shared expert, as Qwen1.5-MoE's (4 x 1408 + 5632).
        "qwen2_moe (16, top-4, shared)": hf.Qwen2MoeConfig(
            **DIMS,
            num_experts=16,
            num_experts_per_tok=4,
            moe_intermediate_size=DIMS["intermediate_size"] // 8,
            shared_expert_intermediate_size=DIMS["intermediate_size"] // 2,
            tie_word_embeddings=True,
        ),
    }


class Stepper:
    def __init__(self, loaded, batch: int, context: int):
        blocks_each = -(-(context + 4096) // BLOCK)
        spec = KVPoolSpec(
            loaded.num_layers, loaded.num_kv_heads, loaded.head_dim, BLOCK, torch.float32
        )
        self.pool = KVPool(spec, blocks_each * batch)
        self.tables = tuple(
            tuple(range(i * blocks_each, (i + 1) * blocks_each)) for i in range(batch)
        )
        self.model, self.backend = loaded.model, CpuAttentionBackend()
        self.lens = [0] * batch
        generator = torch.Generator().manual_seed(0)
        for i in range(batch):
            self._step([i], torch.randint(0, DIMS["vocab_size"], (context,), generator=generator))

    def _step(self, rows: list[int], ids: torch.Tensor) -> torch.Tensor:
        q = len(ids) // len(rows)
        layout = BatchLayout(
            tuple(q for _ in rows),
            tuple(self.lens[i] + q for i in rows),
            tuple(self.tables[i] for i in rows),
            BLOCK,
        )
        positions = torch.cat([torch.arange(self.lens[i], self.lens[i] + q) for i in rows])
        metadata = self.backend.build_metadata(layout, torch.device("cpu"))
        context = PagedAttentionContext(self.backend, self.pool, metadata)
        samples = torch.arange(q - 1, len(ids), q)
        with torch.inference_mode():
            logits = self.model(ids, positions, context, samples)
        for i in rows:
            self.lens[i] += q
        return logits

    def decode(self) -> float:
        rows = list(range(len(self.lens)))
        ids = torch.randint(0, DIMS["vocab_size"], (len(rows),))
        started = time.perf_counter()
        self._step(rows, ids)
        return time.perf_counter() - started


def main(argv: list[str] | None = None, prog: str = "python -m bench.micro.architectures") -> None:
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--dtype", default="q4_1")
    parser.add_argument("--batch", default="1,16")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument(
        "--only", default="", help="comma-separated name prefixes to time beside llama"
    )
    args = parser.parse_args(argv)
    import transformers as hf

    from bench.peers.random_weights import randomize

    chosen = configs()
    if args.only:
        prefixes = tuple(args.only.split(","))
        chosen = {n: c for n, c in chosen.items() if n == "llama" or n.startswith(prefixes)}

    print(f"CPU: {cpu_name()}; torch threads {torch.get_num_threads()}; path {args.dtype}")
    with tempfile.TemporaryDirectory() as root:
        loaded = {}
        for seed, (name, config) in enumerate(chosen.items()):
            directory = Path(root) / name.split()[0]
            model = hf.AutoModelForCausalLM.from_config(config)
            randomize(model, seed)
            model.save_pretrained(directory)
            del model
            loaded[name] = load_model(directory, args.dtype, torch.device("cpu"))
            status = getattr(loaded[name].model, "native_decode_status", "")
            print(f"{name}: {loaded[name].model_impl} {status}")
        for batch in (int(b) for b in args.batch.split(",")):
            steppers = {name: Stepper(model, batch, args.context) for name, model in loaded.items()}
            times: dict[str, list[float]] = {name: [] for name in steppers}
            for _ in range(args.steps):
                for name, stepper in steppers.items():
                    times[name].append(stepper.decode())
            base = batch / statistics.median(times["llama"])
            print(f"\nbatch {batch}: decode tok/s (median of {args.steps} steps), vs llama")
            for name, samples in times.items():
                rate = batch / statistics.median(samples)
                print(f"  {name:22s} {rate:8.1f}  {rate / base:5.2f}x")


if __name__ == "__main__":
    main()
