"""The speculation table from recorded runs: grouping, means, ratios, the acceptance."""

from __future__ import annotations

import math

import pytest

from bench.speculation.acceptance import Acceptance
from bench.speculation.report import OFF, ON, Run, markdown, rows, table


def run(speculation, tokens, wall, workload="edit", concurrency=1, system="cbserve", **acc):
    acceptance = Acceptance(**acc) if acc else Acceptance()
    return Run(workload, concurrency, system, speculation, tokens, wall, acceptance=acceptance)


def test_a_row_takes_the_mean_of_its_repeats_and_the_ratio_of_the_means():
    (row,) = rows(
        [
            run(OFF, 1000, 10.0),  # 100 tok/s
            run(ON, 1000, 5.0, drafts=100, draft_tokens=400, accepted_tokens=200),  # 200
            run(ON, 1000, 4.0, drafts=300, draft_tokens=1200, accepted_tokens=1000),  # 250
            run(OFF, 1000, 12.5),  # 80 tok/s
        ]
    )
    assert row.tok_s_off == pytest.approx(90.0)
    assert row.tok_s_on == pytest.approx(225.0)
    assert row.ratio == pytest.approx(2.5)
    # Summed over the `on` runs, then divided: 1 + 1200 / 400 and 1200 / 1600.
    assert row.acceptance.mean_acceptance_length == pytest.approx(4.0)
    assert row.acceptance.acceptance_rate == pytest.approx(0.75)
    assert row.same_tokens


def test_rows_keep_the_order_measured_and_never_mix_servers_or_loads():
    runs = [
        run(OFF, 100, 1.0, concurrency=64),
        run(ON, 100, 1.0, concurrency=64),
        run(OFF, 50, 1.0, system="llama.cpp", concurrency=64),
        run(ON, 60, 1.0, system="llama.cpp", concurrency=64),
        run(OFF, 10, 1.0, workload="chat"),
        run(ON, 10, 1.0, workload="chat"),
    ]
    grouped = rows(runs)
    assert [(r.workload, r.concurrency, r.system) for r in grouped] == [
        ("edit", 64, "cbserve"),
        ("edit", 64, "llama.cpp"),
        ("chat", 1, "cbserve"),
    ]
    assert grouped[1].ratio == pytest.approx(1.2)
    assert not grouped[1].same_tokens  # 50 tokens off, 60 on


def test_the_table_prints_the_figures_and_a_dash_where_there_are_none():
    grouped = rows(
        [
            run(OFF, 500, 10.0),
            run(ON, 500, 2.5, drafts=100, draft_tokens=400, accepted_tokens=300),
            run(OFF, 300, 3.0, workload="chat", concurrency=64),
            run(ON, 300, 3.1, workload="chat", concurrency=64),
        ]
    )
    lines = table(grouped).splitlines()
    assert lines[0].startswith("| workload | streams | server | tok/s off | tok/s on | on/off")
    assert lines[1].count("---") == lines[0].count("|") - 1
    assert lines[2] == "| edit | 1 | cbserve | 50.0 | 200.0 | 4.00x | 4.00 | 0.750 | 500 / 500 |"
    assert lines[3] == "| chat | 64 | cbserve | 100.0 | 96.8 | 0.97x | - | - | 300 / 300 |"
    text = markdown(grouped, ["CPU: AMD EPYC"], ["a note"])
    assert text.startswith("CPU: AMD EPYC\n\n| workload")
    assert text.endswith("\n\n- a note\n")


def test_a_run_that_took_no_time_has_no_rate():
    assert math.isnan(run(OFF, 10, 0.0).tokens_per_s)
    (row,) = rows([run(ON, 10, 1.0)])
    assert math.isnan(row.tok_s_off) and math.isnan(row.ratio)
