"""config.json read without transformers (worker_svc/models/config_file.py and each
architecture's defaults) against transformers' AutoConfig on the same files: the same
DecoderSpec wherever it reads a file, None (transformers decides) wherever it does not
fully understand one, and a clear error for an invalid one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from common.defaults import default_model_path
from tests.worker.architectures.checkpoints import ARCHITECTURES
from worker_svc.models.architectures import architecture_for, load_architecture
from worker_svc.models.config_file import read_config_file, read_declared_config

LLAMA = load_architecture("llama")
SMALL = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 100,
}


def transformers_config(directory: Path):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(directory), local_files_only=True).get_text_config()


def written(tmp_path: Path, config: dict) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def assert_same_as_transformers(directory: Path):
    declared = read_declared_config(directory)
    assert declared is not None
    own, architecture = declared
    theirs = transformers_config(directory)
    assert architecture.spec(own) == architecture.spec(theirs)
    return architecture.spec(own)


@pytest.mark.model
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_every_architecture_reads_as_transformers_reads_it(checkpoints, name):
    spec = assert_same_as_transformers(checkpoints[name])
    assert spec.architecture == architecture_for(None, _model_type(checkpoints[name])).name


def _model_type(directory: Path) -> str:
    return json.loads((directory / "config.json").read_text())["model_type"]


def test_the_default_model_reads_as_transformers_reads_it():
    directory = Path(default_model_path())
    if not (directory / "config.json").is_file():
        pytest.fail(f"{directory} is not the converted model directory (make model)")
    spec = assert_same_as_transformers(directory)
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim) == (9, 3, 64)


def test_left_out_keys_take_the_architectures_defaults(tmp_path):
    spec = assert_same_as_transformers(written(tmp_path, SMALL))
    no_gqa = {k: v for k, v in SMALL.items() if k != "num_key_value_heads"}
    assert assert_same_as_transformers(written(tmp_path, no_gqa)).num_kv_heads == 4
    assert spec.num_kv_heads == 2 and spec.head_dim == 16
    assert spec.layers[0].rope.theta == 10000.0 and spec.rms_norm_eps == 1e-6


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_theta": 500000.0},
        {"rope_scaling": None, "rope_theta": 250000},
        {"rope_parameters": {"rope_type": "default", "rope_theta": 12345.0}},
        {"rope_scaling": {"type": "default"}, "rope_theta": 777.0},
        {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}},
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            "rope_theta": 500000.0,
        },
    ],
)
def test_the_rope_is_found_where_transformers_finds_it(tmp_path, rope):
    assert_same_as_transformers(written(tmp_path, {**SMALL, **rope}))


@pytest.mark.parametrize(
    "raw",
    [
        {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "sliding_window": 64},
        {
            "model_type": "qwen2",
            "architectures": ["Qwen2ForCausalLM"],
            "use_sliding_window": True,
            "sliding_window": 64,
            "max_window_layers": 1,
        },
        {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "sliding_window": 32},
    ],
)
def test_windows_are_where_transformers_puts_them(tmp_path, raw):
    spec = assert_same_as_transformers(written(tmp_path, {**SMALL, **raw}))
    assert len(spec.windows) == 2


@pytest.mark.parametrize(
    "change",
    [
        {"model_type": "gpt2"},
        {"quantization_config": {"quant_method": "gptq"}},
        {"a_key_from_the_future": 1},
    ],
)
def test_what_it_does_not_fully_understand_is_left_to_transformers(tmp_path, change):
    assert read_declared_config(written(tmp_path, {**SMALL, **change})) is None


def test_a_gguf_file_or_a_missing_config_is_left_to_transformers(tmp_path):
    assert read_declared_config(tmp_path) is None
    assert read_declared_config(Path(default_model_path()) / "model.gguf") is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_attention_heads": 5}, "not a multiple of num_attention_heads"),
        ({"num_hidden_layers": 0}, "at least one layer"),
        ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads"),
        ({"vocab_size": "100"}, "vocab_size must be a positive integer"),
        ({"rms_norm_eps": -1.0}, "rms_norm_eps must be a positive number"),
        ({"architectures": "LlamaForCausalLM"}, "architectures must be a list"),
    ],
)
def test_an_invalid_config_is_refused_with_the_field_named(tmp_path, change, message):
    with pytest.raises(ValueError, match=message):
        config = read_config_file(written(tmp_path, {**SMALL, **change}), LLAMA)
        LLAMA.spec(config)


def test_what_the_own_forward_does_not_compute_is_named(tmp_path):
    config = read_config_file(written(tmp_path, {**SMALL, "mlp_bias": True}), LLAMA)
    with pytest.raises(NotImplementedError, match="biased MLP"):
        LLAMA.spec(config)


@pytest.mark.process
@pytest.mark.model
def test_the_own_forward_and_the_null_model_load_without_transformers():
    """What a worker on the own forward, or a null one, pays at every start:
    transformers (and the torch._dynamo it imports) is not on either path."""
    code = (
        "import sys, torch;"
        "from common.defaults import default_model_path;"
        "from worker_svc.config import WorkerConfig;"
        "from worker_svc.model_loader import load_model;"
        "from worker_svc.null.worker import read_null_model;"
        "model, vocabulary = read_null_model("
        "WorkerConfig(model=default_model_path(), model_impl='null'));"
        "print(model.vocab_size, vocabulary.eos_token_id, 'transformers' in sys.modules);"
        "loaded = load_model(default_model_path(), 'float32', torch.device('cpu'));"
        "print(loaded.model_impl, 'transformers' in sys.modules)"
    )
    # A fresh interpreter: this test process imports transformers for other tests.
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["49152", "2", "False", "cbserve", "False"]


@pytest.mark.model
def test_auto_knows_which_models_the_own_forward_serves(tmp_path, checkpoints):
    """`--dtype auto` may pick a path that needs the own forward only for these."""
    from worker_svc.model_loader import own_forward_serves

    assert all(own_forward_serves(path, "auto") for path in checkpoints.values())
    assert not own_forward_serves(checkpoints["qwen3"], "transformers")
    gpt2 = {**SMALL, "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}
    assert not own_forward_serves(written(tmp_path, gpt2), "auto")
