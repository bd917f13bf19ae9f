"""The config.json reader of the own Llama forward (worker_svc/models/llama_config.py)
against transformers' AutoConfig on the same files: the same shape wherever it reads a
file, and None (transformers decides) wherever it does not fully understand one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from common.defaults import default_model_path
from worker_svc.models.dims import attention_dims
from worker_svc.models.llama import LlamaShape
from worker_svc.models.llama_config import LlamaConfigFile, read_llama_config

SMALL = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": 100,
}


def transformers_config(directory: Path):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(directory), local_files_only=True).get_text_config()


def written(tmp_path: Path, config: dict) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def assert_same_as_transformers(directory: Path) -> LlamaConfigFile:
    own = read_llama_config(directory)
    assert own is not None
    theirs = transformers_config(directory)
    assert LlamaShape.from_config(own) == LlamaShape.from_config(theirs)
    assert attention_dims(own) == attention_dims(theirs)
    assert own.architectures == tuple(theirs.architectures)
    assert own.tie_word_embeddings == theirs.tie_word_embeddings
    return own


def test_the_default_model_reads_as_transformers_reads_it():
    directory = Path(default_model_path())
    if not (directory / "config.json").is_file():
        pytest.fail(f"{directory} is not the converted model directory (make model)")
    own = assert_same_as_transformers(directory)
    assert (own.num_attention_heads, own.num_key_value_heads, own.head_dim) == (9, 3, 64)


def test_left_out_keys_take_llamaconfigs_defaults(tmp_path):
    own = assert_same_as_transformers(written(tmp_path, SMALL))
    assert own.num_key_value_heads == 4 and own.head_dim == 16
    assert own.rope_theta == 10000.0 and own.rms_norm_eps == 1e-6


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_theta": 500000.0},
        {"rope_scaling": None, "rope_theta": 250000},
        {"rope_parameters": {"rope_type": "default", "rope_theta": 12345.0}},
        {"rope_scaling": {"type": "default"}, "rope_theta": 777.0},
    ],
)
def test_the_rope_base_is_found_where_transformers_finds_it(tmp_path, rope):
    own = assert_same_as_transformers(written(tmp_path, {**SMALL, **rope}))
    assert isinstance(own.rope_parameters["rope_theta"], float)


@pytest.mark.parametrize(
    "change",
    [
        {"model_type": "mistral"},
        {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
        {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}},
        {"sliding_window": 4096},
        {"quantization_config": {"quant_method": "gptq"}},
        {"a_key_from_the_future": 1},
    ],
)
def test_what_it_does_not_fully_understand_is_left_to_transformers(tmp_path, change):
    assert read_llama_config(written(tmp_path, {**SMALL, **change})) is None


def test_a_gguf_file_or_a_missing_config_is_left_to_transformers(tmp_path):
    assert read_llama_config(tmp_path) is None
    assert read_llama_config(Path(default_model_path()) / "model.gguf") is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_attention_heads": 5}, "not a multiple of num_attention_heads"),
        ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads"),
        ({"num_hidden_layers": 0}, "num_hidden_layers must be a positive integer"),
        ({"vocab_size": "100"}, "vocab_size must be a positive integer"),
        ({"rms_norm_eps": -1.0}, "rms_norm_eps must be a positive number"),
        ({"mlp_bias": "no"}, "mlp_bias must be true or false"),
        ({"architectures": "LlamaForCausalLM"}, "architectures must be a list"),
    ],
)
def test_an_invalid_llama_config_is_refused_with_the_field_named(tmp_path, change, message):
    with pytest.raises(ValueError, match=message):
        read_llama_config(written(tmp_path, {**SMALL, **change}))


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
