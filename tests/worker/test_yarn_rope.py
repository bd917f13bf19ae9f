"""YaRN rope (gpt-oss, Qwen's long-context configs): the own forward's frequencies and
cos/sin tables bit-equal to transformers' own rotary embeddings on the same config in
float32, and the config's rope parameters read into a RopeSpec as transformers reads
them."""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding
from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

from worker_svc.models.config_file import rope_parameters, rope_spec
from worker_svc.models.declaration import RopeSpec
from worker_svc.models.forward.rope import RotaryEmbedding, cos_sin_scale, inverse_frequencies

POSITIONS = 6000  # past gpt-oss's original 4096, where the slowed frequencies matter


def gpt_oss_config() -> transformers.GptOssConfig:
    # gpt-oss-20b's attention and rope as released: head_dim 64, theta 150k, YaRN x32
    # over 4096 with beta_fast 32, beta_slow 1, no truncation.
    return transformers.GptOssConfig(num_attention_heads=64, head_dim=64)


def qwen_yarn_config() -> transformers.Qwen2Config:
    # Qwen2.5's documented long-context setting: YaRN x4 over 32768, bounds truncated.
    return transformers.Qwen2Config(
        hidden_size=1024,
        num_attention_heads=8,
        max_position_embeddings=131072,
        rope_parameters={
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 32768,
            "rope_theta": 1000000.0,
        },
    )


CASES = [
    pytest.param(gpt_oss_config, GptOssRotaryEmbedding, id="gpt-oss"),
    pytest.param(qwen_yarn_config, Qwen2RotaryEmbedding, id="qwen2-yarn-x4"),
]


def own_spec(config) -> RopeSpec:
    return rope_spec(rope_parameters(config), 10000.0, config.max_position_embeddings)


@pytest.mark.parametrize(("make_config", "rotary_class"), CASES)
def test_frequencies_and_tables_equal_transformers(make_config, rotary_class):
    config = make_config()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    theirs = rotary_class(config)
    spec = own_spec(config)
    assert spec.kind == "yarn"
    torch.testing.assert_close(inverse_frequencies(spec, head_dim), theirs.inv_freq, rtol=0, atol=0)
    assert cos_sin_scale(spec) == theirs.attention_scaling
    assert theirs.attention_scaling > 1.0  # the scale is tested, not a no-op 1

    positions = torch.arange(POSITIONS)
    cos, sin = theirs(torch.zeros(1, dtype=torch.float32), positions[None])
    half = head_dim // 2  # gpt-oss rotates halves (d/2 wide); Qwen2 repeats them (d wide)
    ours = RotaryEmbedding(head_dim, POSITIONS, spec, torch.float32)
    torch.testing.assert_close(ours.cos, cos[0, :, :half], rtol=0, atol=0)
    torch.testing.assert_close(ours.sin, sin[0, :, :half], rtol=0, atol=0)


def test_gpt_oss_parameters_are_read_as_released():
    spec = own_spec(gpt_oss_config())
    assert (spec.theta, spec.factor, spec.original_max_positions) == (150000.0, 32.0, 4096)
    assert (spec.beta_fast, spec.beta_slow, spec.truncate) == (32.0, 1.0, False)
    assert spec.attention_factor is None
    assert cos_sin_scale(spec) == pytest.approx(0.1 * math.log(32) + 1)


def test_yarn_defaults_and_deepseek_style_parameters():
    base = {"rope_type": "yarn", "rope_theta": 10000.0, "original_max_position_embeddings": 4096}
    # No factor: max_position_embeddings / original, as transformers infers it.
    spec = rope_spec(base, 0, max_positions=16384)
    assert (spec.factor, spec.beta_fast, spec.beta_slow, spec.truncate) == (4.0, 32.0, 1.0, True)
    with pytest.raises(NotImplementedError, match="yarn"):
        rope_spec(base, 0)
    # mscale and mscale_all_dim together set the attention factor (DeepSeek-V3's form).
    deepseek = rope_spec({**base, "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.707}, 0)
    expected = (0.1 * math.log(40) + 1) / (0.1 * 0.707 * math.log(40) + 1)
    assert deepseek.attention_factor == pytest.approx(expected)
    explicit = rope_spec({**base, "factor": 2.0, "attention_factor": 1.5}, 0)
    assert cos_sin_scale(explicit) == 1.5


def test_other_kinds_keep_unscaled_tables():
    spec = RopeSpec(10000.0, "linear", factor=2.0)
    assert cos_sin_scale(spec) == 1.0
    table = RotaryEmbedding(16, 8, spec, torch.float32)
    assert torch.allclose(table.cos.square() + table.sin.square(), torch.ones(8, 8))
