"""The mixture-of-experts MLP (worker_svc/models/forward/experts.py) against transformers'
own routers and expert blocks: the top-k choice where router logits tie, experts that no
token picks, one row reading only its k experts, and many rows grouping by expert."""

from __future__ import annotations

import pytest
import torch

from bench.peers.random_weights import randomize
from worker_svc.models.checkpoint.experts import ExpertWeights
from worker_svc.models.forward.experts import ExpertMlp, route
from worker_svc.models.mixture import MoeSpec, sparse_layers

pytestmark = pytest.mark.model  # imports transformers' modeling code (seconds)

HIDDEN, EXPERTS, K, INTER = 16, 6, 2, 24


def qwen3_config(normalize: bool):
    import transformers as hf

    return hf.Qwen3MoeConfig(
        hidden_size=HIDDEN,
        num_experts=EXPERTS,
        num_experts_per_tok=K,
        moe_intermediate_size=INTER,
        norm_topk_prob=normalize,
    )


def spec(**fields) -> MoeSpec:
    base = {
        "num_experts": EXPERTS,
        "experts_per_token": K,
        "intermediate_size": INTER,
        "sparse_layers": frozenset({0}),
    }
    return MoeSpec(**{**base, **fields})


def tied_logits() -> torch.Tensor:
    """Rows whose logits tie across experts (all equal; two equal leaders; equal
    runners-up) and rows with clear leaders."""
    return torch.tensor(
        [
            [0.0] * EXPERTS,
            [1.0, 3.0, 3.0, 0.0, -1.0, 0.5],
            [2.0, 1.0, 1.0, 1.0, -4.0, 0.0],
            [-1.0, -2.0, 0.5, 4.0, 0.25, 0.25],
        ]
    )


@pytest.mark.parametrize("normalize", [True, False])
def test_softmax_then_topk_at_ties_as_qwen3_moe(normalize):
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    router = Qwen3MoeTopKRouter(qwen3_config(normalize))
    logits = tied_logits()
    with torch.no_grad():
        router.weight.copy_(torch.eye(EXPERTS, HIDDEN))
        _, want_weights, want_ids = router(torch.nn.functional.pad(logits, (0, HIDDEN - EXPERTS)))
    weights, ids = route(logits, spec(normalize_topk=normalize))
    assert torch.equal(ids, want_ids)
    assert torch.equal(weights, want_weights)


def test_topk_then_softmax_at_ties_as_gpt_oss():
    logits = tied_logits()
    top, want_ids = torch.topk(logits, K, dim=-1)  # transformers' GptOssTopKRouter
    weights, ids = route(logits, spec(router="topk_softmax"))
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, torch.softmax(top, dim=1), rtol=0, atol=0)


def block_and_mlp(path: str = "float32"):
    """transformers' Qwen3-MoE block, randomized, and the own ExpertMlp on its weights."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    block = Qwen3MoeSparseMoeBlock(qwen3_config(True)).eval()
    randomize(block, seed=3)
    gate_up, down = block.experts.gate_up_proj.data, block.experts.down_proj.data
    weights = ExpertWeights(
        router=block.gate.weight.data,
        router_bias=None,
        gate_up=tuple(gate_up[e] for e in range(EXPERTS)),
        down=tuple(down[e] for e in range(EXPERTS)),
        gate_up_bias=None,
        down_bias=None,
    )
    return block, ExpertMlp(spec(), weights, path)


def counting(mlp: ExpertMlp) -> list[int]:
    """Records the expert index of every expert call."""
    calls: list[int] = []
    original = mlp.expert

    def expert(index, rows):
        calls.append(index)
        return original(index, rows)

    mlp.expert = expert
    return calls


def test_one_row_reads_only_its_k_experts():
    block, mlp = block_and_mlp()
    calls = counting(mlp)
    row = torch.randn(1, HIDDEN, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = block(row[None])[0]
        got = mlp(row)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert len(calls) == K and calls == sorted(calls)


def test_many_rows_call_each_chosen_expert_once_and_skip_the_rest():
    block, mlp = block_and_mlp()
    calls = counting(mlp)
    rows = torch.randn(40, HIDDEN, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        # Steer the router: no row may pick experts 4 and 5.
        block.gate.weight[4:] = -50.0 * block.gate.weight[4:].abs().sum()
        mlp.router.weight.copy_(block.gate.weight)
        rows = rows.abs()  # positive inputs: the steered experts' logits stay lowest
        want = block(rows[None])[0]
        got = mlp(rows)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert calls == sorted(set(calls)) and not {4, 5} & set(calls)


def test_the_sparse_layer_rule_of_qwen_moe():
    assert sparse_layers(6) == frozenset(range(6))
    assert sparse_layers(6, sparse_step=2) == frozenset({1, 3, 5})
    assert sparse_layers(6, dense_layers=[0, 5]) == frozenset({1, 2, 3, 4})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"experts_per_token": EXPERTS + 1}, "experts per token"),
        ({"router": "sigmoid"}, "router must be one of"),
        ({"activation": "gelu"}, "expert activation"),
        ({"num_experts": 0}, "num_experts"),
    ],
)
def test_a_bad_mixture_is_refused_at_construction(fields, message):
    with pytest.raises(ValueError, match=message):
        spec(**fields)
