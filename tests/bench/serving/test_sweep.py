"""The concurrency sweep: its workloads, table and plot, and a small real run of it
(cbserve only, two concurrencies, one prompt length, a few tokens)."""

from __future__ import annotations

import json
import math

import pytest

from bench.peers import llama_server
from bench.serving import sweep, sweep_plots


def args(*argv):
    return sweep.parser().parse_args(list(argv))


def make_point(system, prompt_len, concurrency, throughput, itl, completed=None):
    done = concurrency if completed is None else completed
    return sweep.Point(system, prompt_len, concurrency, done, concurrency - done, throughput,
                       itl, itl * 2, 50.0, 1.0)  # fmt: skip


POINTS = [
    make_point("cbserve", 32, 1, 20.0, 45.0),
    make_point("cbserve", 32, 4, 60.0, 60.0),
    make_point("llamacpp", 32, 1, 150.0, 6.5),
    make_point("llamacpp", 32, 4, 170.0, 20.0),
    make_point("llamacpp", 256, 4, 0.0, math.nan, completed=0),
]


def test_the_default_grid_is_the_issues():
    parsed = args()
    assert parsed.concurrency == [1, 4, 16, 64, 128]
    assert parsed.prompt_len == [32, 256, 1024]
    assert parsed.systems == ["cbserve", "llamacpp"]
    with pytest.raises(SystemExit):
        args("--systems", "cbserve,vllm")
    with pytest.raises(SystemExit):
        args("--concurrency", "0,4")


def test_every_point_has_exact_lengths_and_prompts_of_its_own():
    parsed = args("--output-len", "8")
    vocab = list(range(100, 1100))
    small = sweep.workload(parsed, vocab, 32, 4)
    assert len(small) == 4
    assert {r.prompt_len for r in small} == {32} and {r.max_tokens for r in small} == {8}
    other = sweep.workload(parsed, vocab, 32, 16)
    assert not {tuple(r.prompt_token_ids) for r in small} & {
        tuple(r.prompt_token_ids) for r in other
    }
    assert sweep.workload(parsed, vocab, 32, 4) == small  # the same on any machine


def test_cbserve_pool_holds_the_largest_point_whole():
    parsed = args("--concurrency", "1,128", "--prompt-len", "32,1024", "--output-len", "64")
    assert sweep.kv_blocks(parsed) * sweep.BLOCK_SIZE >= 128 * (1024 + 64)


def test_the_table_has_a_row_per_point():
    table = sweep.markdown(POINTS).splitlines()
    assert table[0].startswith("| system | prompt tokens | concurrency | output tok/s |")
    assert len(table) == 2 + len(POINTS)
    assert table[4] == "| llama.cpp | 32 | 1 | 150 | 6.5 | 13 | 50 | 0 |"


def test_curves_group_by_system_and_prompt_length_and_skip_failed_points():
    lines = sweep_plots.curves(POINTS)
    assert lines == {
        ("cbserve", 32): [(1, 20.0, 45.0), (4, 60.0, 60.0)],
        ("llamacpp", 32): [(1, 150.0, 6.5), (4, 170.0, 20.0)],
    }


def test_the_plot_is_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    written = sweep_plots.write(tmp_path / "sweep.png", POINTS, "test machine")
    assert written == [tmp_path / "sweep.png"]
    assert written[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_sweep_with_llama_server_missing_fails_at_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CBSERVE_PEERS_CACHE", str(tmp_path / "empty"))
    assert sweep.main(["--out-dir", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == f"bench.serving.sweep: {llama_server.MISSING}"
    assert not (tmp_path / "out").exists()


@pytest.mark.process
@pytest.mark.model
@pytest.mark.timeout(300)
def test_a_small_cbserve_sweep_runs(model_dir, tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["--concurrency", "1,4", "--prompt-len", "16", "--output-len", "4"]
    argv += ["--systems", "cbserve", "--threads", "2", "--no-progress", "--out-dir", str(out)]
    assert sweep.main(argv) == 0
    result = json.loads((out / "sweep.json").read_text())
    assert result["threads"] == 2
    points = result["points"]
    assert [(p["system"], p["prompt_len"], p["concurrency"]) for p in points] == [
        ("cbserve", 16, 1),
        ("cbserve", 16, 4),
    ]
    for p in points:
        assert (p["completed"], p["failed"]) == (p["concurrency"], 0)
        assert p["output_throughput"] > 0
        assert 0 < p["itl_median_ms"] <= p["itl_p99_ms"]
    assert "| cbserve | 16 | 4 |" in capsys.readouterr().out
    assert (out / "sweep.png").read_bytes()[:4] == b"\x89PNG"
