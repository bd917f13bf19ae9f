"""Small checkpoints of every declared architecture, written by transformers at test time
with every weight random: biases and norm weights too, because transformers initializes
those to constants (zeros, ones), which would hide a missing bias or a norm read as
(1 + w) instead of w. Windows are short (8 tokens) so that a test prompt runs past them.
"""

from __future__ import annotations

from pathlib import Path

from bench.peers.random_weights import randomize

COMMON = {
    "vocab_size": 49152,  # the default model's tokenizer, so a worker can serve them
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}
WINDOW = 8


def configs() -> dict:
    import transformers as hf

    rope3 = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
        "rope_theta": 500000.0,
    }
    return {
        "llama3": hf.LlamaConfig(**COMMON, rope_parameters=rope3, tie_word_embeddings=False),
        "mistral": hf.MistralConfig(**COMMON, sliding_window=WINDOW),
        "ministral": hf.MinistralConfig(
            **COMMON,
            head_dim=16,  # transformers' Ministral does not derive it
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention"] * 3,
        ),
        "qwen2": hf.Qwen2Config(**COMMON, tie_word_embeddings=True),
        "qwen3": hf.Qwen3Config(**COMMON, head_dim=32, tie_word_embeddings=True),
        "gemma3": hf.Gemma3TextConfig(
            **COMMON, head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=16
        ),
        # Mixtures, every layer sparse as in the released models (llama.cpp's converter
        # refuses a dense layer among them; test_moe_layers.py has one).
        "qwen3_moe": hf.Qwen3MoeConfig(
            **COMMON,
            head_dim=32,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            norm_topk_prob=True,
        ),
        "mixtral": hf.MixtralConfig(**COMMON, num_local_experts=4, num_experts_per_tok=2),
        # A shared expert beside the routed ones; a dense layer (mlp_only_layers) and
        # windows on layers 0 and 2 (its own rule: even layers below max_window_layers).
        "qwen2_moe": hf.Qwen2MoeConfig(
            **COMMON,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=96,
            mlp_only_layers=[3],
            use_sliding_window=True,
            sliding_window=WINDOW,
            max_window_layers=4,
        ),
        # Sinks, a window on every other layer, YaRN, biases everywhere, clamped SwiGLU.
        "gpt_oss": hf.GptOssConfig(
            **COMMON,
            head_dim=16,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=WINDOW,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 4.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 128,
                "rope_theta": 150000.0,
            },
        ),
    }


ARCHITECTURES = (
    "llama3",
    "mistral",
    "ministral",
    "qwen2",
    "qwen3",
    "gemma3",
    "qwen3_moe",
    "mixtral",
    "gpt_oss",
    "qwen2_moe",
)


def write_checkpoint(name: str, directory: Path, tokenizer_dir: Path | None = None) -> Path:
    """A random `name` checkpoint in `directory` (float32 safetensors, config.json and,
    given `tokenizer_dir`, that tokenizer's files)."""
    import shutil

    import transformers as hf

    model = hf.AutoModelForCausalLM.from_config(configs()[name])
    randomize(model, seed=ARCHITECTURES.index(name))
    model.save_pretrained(directory)
    if tokenizer_dir is not None:
        for file in tokenizer_dir.iterdir():
            if file.name.startswith(
                ("tokenizer", "special_tokens", "generation_config", "chat_template")
            ):
                shutil.copy(file, directory / file.name)
    return directory
