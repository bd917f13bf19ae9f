"""Reading the acceptance from the servers' spec_decode counters, as scraped."""

from __future__ import annotations

import math

from bench.harness.runner import counter_growth
from bench.speculation.acceptance import LLAMACPP_PREFIX, Acceptance, from_counters
from common.metrics import parse_samples


def cbserve_metrics(drafts, draft_tokens, accepted, per_position) -> str:
    """The counters as scheduler_svc/pool_metrics.py exposes them."""
    label = 'model_name="SmolLM2-135M-Instruct"'
    lines = []
    for name, value in (
        ("num_drafts", drafts),
        ("num_draft_tokens", draft_tokens),
        ("num_accepted_tokens", accepted),
    ):
        lines += [f"# TYPE cbserve_spec_decode_{name} counter",
                  f"cbserve_spec_decode_{name}_total{{{label}}} {value}"]  # fmt: skip
    lines.append("# TYPE cbserve_spec_decode_num_accepted_tokens_per_pos counter")
    for position, value in enumerate(per_position):
        lines.append(
            f"cbserve_spec_decode_num_accepted_tokens_per_pos_total"
            f'{{{label},position="{position}"}} {value}'
        )
    lines.append("# TYPE cbserve_requests counter")
    lines.append(f"cbserve_requests_total{{{label}}} 9")
    return "\n".join(lines) + "\n"


# As llama-server --metrics writes them (tools/server/server-task.cpp).
LLAMACPP_METRICS = """\
# HELP llamacpp:spec_decode_num_draft_tokens_total Speculative: Total draft tokens generated
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 400
# HELP llamacpp:spec_decode_num_accepted_tokens_total Speculative: accepted
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total 250
# HELP llamacpp:spec_decode_num_drafts_total Speculative: verification steps
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 100
# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 12.5
# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position
# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 90
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 70
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 50
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="3"} 40
"""


def test_a_runs_acceptance_is_the_growth_between_two_scrapes():
    before = parse_samples(cbserve_metrics(10, 40, 20, [8, 6, 4, 2]))
    after = parse_samples(cbserve_metrics(60, 240, 170, [48, 46, 44, 32]))
    acceptance = from_counters(counter_growth(before, after))
    assert acceptance == Acceptance(50, 200, 150, (40, 40, 40, 30))
    assert acceptance.mean_acceptance_length == 4.0  # 1 + 150 / 50
    assert acceptance.acceptance_rate == 0.75  # 150 / 200
    assert acceptance.as_dict()["mean_acceptance_length"] == 4.0


def test_llama_servers_counters_are_read_with_its_prefix():
    acceptance = from_counters(parse_samples(LLAMACPP_METRICS), LLAMACPP_PREFIX)
    assert acceptance == Acceptance(100, 400, 250, (90, 70, 50, 40))
    assert acceptance.mean_acceptance_length == 3.5
    assert acceptance.acceptance_rate == 0.625
    # cbserve's names are not llama-server's: nothing is read under the wrong prefix.
    assert from_counters(parse_samples(LLAMACPP_METRICS)) == Acceptance()


def test_no_drafts_is_no_figure_rather_than_a_division_by_zero():
    nothing = from_counters({})
    assert math.isnan(nothing.mean_acceptance_length)
    assert math.isnan(nothing.acceptance_rate)
    assert nothing.as_dict()["acceptance_rate"] is None
