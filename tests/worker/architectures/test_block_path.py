"""Every declared architecture on the block path (`--dtype q4_1`; these float checkpoints
are quantized to Q8_0 at load): its Python forward against the float forward on the
very weights the blocks dequantize to, and its native decode step, for every kernel
variant this CPU runs, against that Python forward, past the sliding window. Where the
native step lacks a declared feature it is refused at load, naming the feature."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.worker.architectures.checkpoints import ARCHITECTURES, WINDOW
from tests.worker.architectures.test_float_forward import CPU, Paged, prompt
from worker_svc.attention import CpuAttentionBackend
from worker_svc.compute.linear import DenseLinear
from worker_svc.compute.qblock import supported_variants
from worker_svc.compute.qblock_linear import QBlockLinear
from worker_svc.compute.qblock_stack import QBlockStack
from worker_svc.model_loader import load_model
from worker_svc.models.qblock.native import NATIVE_FEATURES, NativeDecode

pytestmark = pytest.mark.model

# What the step lacks of an architecture's declaration: its decode steps take the Python
# forward, and the status names why. None today (Qwen2-MoE's shared expert was, until the
# step computed it: kernels/decode_shared_expert.h).
LACKING: dict[str, str] = {}
NATIVE = [name for name in ARCHITECTURES if name not in LACKING]
# The block kernel sums each row's dot product in its own order (blocks of 32, several
# accumulators), torch's GEMM in another: float32 rounding, through 6 layers, on logits
# of about +-5 (these random weights' scale).
CLOSE = {"rtol": 1e-3, "atol": 1e-3}


# Mixtral's block path is Qwen3-MoE's (the same ExpertMlp, every variant below) but for
# its declaration, which test_float_forward.py checks in `make test`: its cases here run
# in `make test-slow`, as its serving test (tests/integration/test_architectures.py).
SLOW = ("mixtral",)


def _tiered(name: str, *values):
    """A parameter set of `name`'s: in the slow tier where `name` is one of SLOW."""
    marks = [pytest.mark.slow] if name in SLOW else []
    return pytest.param(*values, marks=marks, id="-".join(values))


@pytest.fixture(scope="module", params=[_tiered(name, name) for name in ARCHITECTURES])
def blocks(request, checkpoints):
    return request.param, load_model(checkpoints[request.param], "q4_1", CPU)


def dequantized_twin(model):
    """The same model with every block projection replaced by float32 of the same values."""
    shallow = copy.copy(model)
    shallow.native_decode = None  # holds ctypes structures, which do not copy
    twin = copy.deepcopy(shallow)
    for module in list(twin.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, QBlockLinear | QBlockStack):
                setattr(module, name, DenseLinear(child.dequantized(), torch.float32, child.bias))
    return twin


def run_prompt(own, model, backend, ids) -> torch.Tensor:
    """Prefill half of `ids`, then decode the rest one token at a time."""
    paged = Paged(own, backend)
    paged.model = model
    half = len(ids) // 2
    parts = [paged.step(ids[:half], 0)]
    parts += [paged.step(ids[i : i + 1], i) for i in range(half, len(ids))]
    return torch.cat(parts)


def native_and_python(loaded, ids, variant: str) -> tuple[torch.Tensor, torch.Tensor]:
    """run_prompt's logits with the native step on `variant` and with the Python forward,
    after checking that every decode ran natively."""
    python = copy.copy(loaded.model)
    python.native_decode = None
    native = copy.copy(loaded.model)
    step = NativeDecode(loaded.model, variant=variant)
    ran = []

    def counted(*args):
        out = step(*args)
        ran.append(out is not None)
        return out

    native.native_decode = counted
    with torch.inference_mode():
        want = run_prompt(loaded, python, CpuAttentionBackend(), ids)
        got = run_prompt(loaded, native, CpuAttentionBackend(), ids)
    assert sum(ran) == len(ids) - len(ids) // 2  # every decode ran natively
    return got, want


def test_the_python_block_forward_computes_the_dequantized_weights(blocks):
    _, own = blocks
    ids = prompt(7, 4 * WINDOW)
    python = copy.copy(own.model)
    with torch.inference_mode():
        python.native_decode = None
        got = run_prompt(own, python, CpuAttentionBackend(), ids)
        want = run_prompt(own, dequantized_twin(own.model), CpuAttentionBackend(), ids)
    torch.testing.assert_close(got, want, **CLOSE)


def test_native_decodes_where_the_step_computes_every_feature(blocks):
    name, own = blocks
    status = own.model.native_decode_status
    if name in LACKING:
        assert status.startswith("off:") and LACKING[name] in status, status
    else:
        assert status == "native decode steps", (name, status)


def test_a_feature_the_step_lacks_is_refused_by_name(checkpoints):
    """A declared feature outside NATIVE_FEATURES (here: one taken out) sends decode steps
    to the Python forward, and the status names it."""
    from worker_svc.models.qblock import native

    spec = load_model(checkpoints["gemma3"], "float32", CPU).model.spec
    lacking = NATIVE_FEATURES - {"GELU-tanh"}
    reason = native.native_decode_disabled_reason(spec, lacking)
    assert reason is not None and "GELU-tanh" in reason and "gemma3" in reason


# Every kernel variant on Gemma 3 (every dense feature the step computes), Qwen2 (biases),
# Qwen3-MoE (the experts), Qwen2-MoE (the shared expert) and gpt-oss (sinks, o_proj's
# bias, biased experts); the others' features take the same code whatever the variant, so
# they run on "auto" (this CPU's best), the time `make test` has.
EVERY_VARIANT = ("gemma3", "qwen2", "qwen3_moe", "qwen2_moe", "gpt_oss")
CASES = [(name, variant) for name in EVERY_VARIANT for variant in supported_variants()] + [
    _tiered(name, name, "auto") for name in NATIVE if name not in EVERY_VARIANT
]


@pytest.fixture(scope="module")
def block_models(checkpoints):
    loaded: dict = {}

    def load(name: str):
        if name not in loaded:
            loaded[name] = load_model(checkpoints[name], "q4_1", CPU)
        return loaded[name]

    return load


@pytest.mark.parametrize(("name", "variant"), CASES)
def test_the_native_step_equals_the_python_forward(block_models, name, variant):
    own = block_models(name)
    got, want = native_and_python(own, prompt(8, 4 * WINDOW), variant)
    torch.testing.assert_close(got, want, **CLOSE)
