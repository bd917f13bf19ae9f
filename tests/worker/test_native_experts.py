"""The native decode step's mixture layers (kernels/decode_experts.h) against the Python
forward's ExpertMlp on the same blocks: several sequences decoding in one step, whose
rows choose overlapping experts while some expert is chosen by none; gpt-oss's router
and experts (top-k logits then softmax, biased router and experts, clamped SwiGLU) put
on a Qwen3-MoE model; Qwen2-MoE's shared expert, gated and not, on every kernel variant;
and the top-k choice at ties, which must be torch.topk's own."""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import random

import pytest
import torch

from common.defaults import converted_model_dir
from tests.worker.architectures.checkpoints import write_checkpoint
from tests.worker.native_step import TOLERANCES, assert_close_logits, decode_step, prefill
from worker_svc.compute.qblock import supported_variants
from worker_svc.model_loader import load_model
from worker_svc.models.forward.experts import route
from worker_svc.models.qblock.native import NativeDecode, load_decode_kernel

# One long, one short and a batch of twelve-token prompts: 20 rows, each of Mixtral's 4
# experts chosen by about 10 of them (from 16, where the CPU has VNNI, that expert's
# projections take the 16-bit activation blocks, as its QBlockLinear does).
CONTEXTS = (40, 5, 17, 9, *(12,) * 16)


@pytest.fixture(scope="module")
def mixtures(tmp_path_factory):
    loaded: dict = {}

    def load(name: str):
        if name not in loaded:
            path = write_checkpoint(name, tmp_path_factory.mktemp(name), converted_model_dir())
            model = load_model(path, "q4_1", torch.device("cpu"))
            loaded[name] = model, prefill(model, CONTEXTS, seed=5)
        return loaded[name]

    return load


def python_step(model, step) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The Python forward's logits of `step`, and each mixture layer's experts per row
    (Qwen2-MoE's layer 3 is dense: no experts)."""
    inputs: list[torch.Tensor] = []
    sparse = [layer for layer in model.layers if layer.experts is not None]
    hooks = [
        layer.experts.register_forward_pre_hook(lambda _, args: inputs.append(args[0]))
        for layer in sparse
    ]
    try:
        with torch.inference_mode():
            logits = model(*step)
            choices = [
                route(layer.experts.router(x), layer.experts.moe)[1]
                for layer, x in zip(sparse, inputs, strict=True)
            ]
    finally:
        for hook in hooks:
            hook.remove()
    return logits, choices


def both_steps(loaded, runner_state, rows: int, model=None, variant: str = "auto"):
    """Logits and pools after one decode of sequences 0 .. rows - 1, by the Python
    forward and by the native step, each from the prefilled pool."""
    model = model or loaded.model
    native = NativeDecode(model, variant=variant)
    runner, python = runner_state, copy.copy(model)
    python.native_decode = None
    before = runner.pool.cache.clone()
    ids, positions, context = decode_step(runner, list(range(rows)))
    step = (ids, positions, context, torch.arange(rows))
    want, choices = python_step(python, step)
    want_pool = runner.pool.cache.clone()
    runner.pool.cache.copy_(before)
    with torch.inference_mode():
        got = native(*step)
    got_pool = runner.pool.cache.clone()
    runner.pool.cache.copy_(before)
    return (got, got_pool), (want, want_pool), choices, native


def expert_rows(choices, num_experts: int) -> list[torch.Tensor]:
    return [torch.bincount(chosen.flatten(), minlength=num_experts) for chosen in choices]


@pytest.mark.model
@pytest.mark.parametrize(
    ("name", "rows"),
    [("qwen3_moe", 3), ("qwen3_moe", 20), ("mixtral", 20), ("qwen2_moe", 3), ("qwen2_moe", 20)],
)
def test_several_sequences_decode_as_the_python_forward(mixtures, name, rows):
    loaded, runner = mixtures(name)
    (got, got_pool), (want, want_pool), choices, native = both_steps(loaded, runner, rows)
    moe = loaded.model.spec.moe
    counts = expert_rows(choices, moe.num_experts)
    assert any(int(c.max()) > 1 for c in counts)  # rows share experts
    if name == "qwen3_moe" and rows == 3:  # 6 choices of 8 experts: some expert no row picks
        assert all(int((c == 0).sum()) > 0 for c in counts)
    # The attention's projections take VNNI from `rows`, an expert's from its own rows.
    most = max([rows, *(int(c.max()) for c in counts)])
    vnni = native.vnni_from_m > 0 and most >= native.vnni_from_m
    assert_close_logits(got, want, vnni)
    torch.testing.assert_close(got_pool, want_pool, rtol=0, atol=TOLERANCES[vnni][1])


def gpt_oss_experts(loaded, limit: float):
    """A copy of the model whose mixture is gpt-oss's: top-k logits then softmax, a
    random router bias, random expert biases, SwiGLU clamped at `limit`."""
    model = copy.copy(loaded.model)
    moe = dataclasses.replace(
        model.spec.moe,
        router="topk_softmax",
        router_bias=True,
        expert_bias=True,
        activation="swiglu_clamped",
        swiglu_limit=limit,
    )
    model.spec = dataclasses.replace(model.spec, moe=moe)
    generator = torch.Generator().manual_seed(11)
    model._modules = dict(model._modules)  # the shallow copy's own: layers replaced below
    model.layers = copy.deepcopy(model.layers)
    for layer in model.layers:
        experts = layer.experts
        experts.moe = moe
        router = experts.router
        bias = torch.randn(router.out_features, generator=generator)
        router.bias = torch.nn.Parameter(bias, requires_grad=False)
        for projection in [*experts.gate_up_projs, *experts.down_projs]:
            projection.bias = 0.5 * torch.randn(projection.out_features, generator=generator)
    return model


@pytest.mark.model
@pytest.mark.parametrize("rows", [1, 20])
def test_gpt_oss_router_and_experts(mixtures, rows):
    loaded, runner = mixtures("qwen3_moe")
    limit = 0.5  # below many of these random weights' gate and up values: clamps bite
    model = gpt_oss_experts(loaded, limit)
    gate_up: list[torch.Tensor] = []
    hooks = [
        projection.register_forward_hook(lambda _, __, out: gate_up.append(out))
        for projection in model.layers[0].experts.gate_up_projs
    ]
    try:
        (got, got_pool), (want, want_pool), _, native = both_steps(loaded, runner, rows, model)
    finally:
        for hook in hooks:
            hook.remove()
    assert bool((torch.cat(gate_up).abs() > limit).any())  # the clamps change values
    plain = both_steps(loaded, runner, rows)[1][0]
    assert not torch.allclose(want, plain, rtol=1e-2, atol=1e-2)  # and so does the mixture
    vnni = native.vnni_from_m > 0 and rows >= native.vnni_from_m
    assert_close_logits(got, want, vnni)
    torch.testing.assert_close(got_pool, want_pool, rtol=0, atol=TOLERANCES[vnni][1])


def ungated_shared_expert(loaded):
    """A copy of the model whose shared expert is added as is (no sigmoid gate)."""
    model = copy.copy(loaded.model)
    model._modules = dict(model._modules)
    model.layers = copy.deepcopy(model.layers)
    for layer in model.layers:
        if layer.experts is not None:
            layer.experts.shared_gate_inp = None
    return model


@pytest.mark.model
@pytest.mark.parametrize("variant", supported_variants())
@pytest.mark.parametrize("rows", [1, 20])
@pytest.mark.parametrize("gated", [True, False])
def test_the_shared_expert_decodes_as_the_python_forward(mixtures, variant, rows, gated):
    loaded, runner = mixtures("qwen2_moe")
    model = loaded.model if gated else ungated_shared_expert(loaded)
    assert model.spec.moe.shared_intermediate_size == 96  # 3 panels of 32 rows
    (got, got_pool), (want, want_pool), _, native = both_steps(loaded, runner, rows, model, variant)
    vnni = native.vnni_from_m > 0 and rows >= native.vnni_from_m
    assert_close_logits(got, want, vnni)
    torch.testing.assert_close(got_pool, want_pool, rtol=0, atol=TOLERANCES[vnni][1])
    # Without its shared expert the step is far from the Python forward: it is computed.
    native._struct.shared_intermediate = 0
    ids, positions, context = decode_step(runner, list(range(rows)))
    before = runner.pool.cache.clone()
    with torch.inference_mode():
        bare = native(ids, positions, context, torch.arange(rows))
    runner.pool.cache.copy_(before)
    assert not torch.allclose(bare, want, rtol=1e-2, atol=1e-2)


def native_topk(values: torch.Tensor, k: int) -> list[int]:
    values = values.float().contiguous()
    out = (ctypes.c_int64 * k)()
    status = load_decode_kernel().decode_topk(
        ctypes.c_void_p(values.data_ptr()), ctypes.c_int64(values.numel()), ctypes.c_int64(k), out
    )
    assert status == 0
    return list(out)


@pytest.mark.parametrize("n", [2, 4, 6, 8, 16, 63, 64, 128, 256])
def test_top_k_at_ties_is_torch_topks(n):
    """torch.topk's tie order is neither stable nor lowest-index first (all equal, k=1,
    n=4: index 2); the step's choice must be the same, or a tie picks other experts."""
    rng = random.Random(n)
    for trial in range(150):
        k = rng.choice([k for k in (1, 2, 3, 4, 8, 16) if k <= n])
        levels = rng.choice([1, 2, 3, 50])
        row = torch.tensor([float(rng.randrange(levels)) for _ in range(n)])
        if trial % 10 == 0:
            row[rng.randrange(n)] = float("nan")  # torch puts NaN first
        want = torch.topk(row, k).indices.tolist()
        assert native_topk(row, k) == want, (row.tolist(), k)
