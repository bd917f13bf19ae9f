"""The table of `python -m bench.peers.vllm_bench_client`: vLLM's result keys read, and
each ratio turned the way the figure improves (throughput up, latencies down)."""

from bench.peers.vllm_bench_client import table

OURS = {
    "output_throughput": 300.0,
    "median_ttft_ms": 500.0,
    "median_tpot_ms": 110.0,
    "p99_itl_ms": 120.0,
    "completed": 128,
    "client_cpu_s": 12.0,
}
PEER = {
    "output_throughput": 250.0,
    "median_ttft_ms": 2500.0,
    "median_tpot_ms": 100.0,
    "p99_itl_ms": 1200.0,
    "completed": 128,
    "client_cpu_s": 10.0,
}


def rows(text: str) -> dict[str, list[str]]:
    return {
        cells[0]: cells[1:]
        for line in text.splitlines()[2:]
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }


def test_ratios_point_the_way_each_figure_improves():
    got = rows(table({"cbserve": OURS, "vllm": PEER}))
    assert got["output tok/s"] == ["300.00", "250.00", "1.20x"]
    assert got["median TTFT (ms)"][2] == "5.00x lower"
    assert got["median TPOT (ms)"][2] == "1.10x higher"
    assert got["P99 ITL (ms)"][2] == "10.00x lower"
    assert got["completed"] == ["128.00", "128.00", ""]
    # The client's CPU shares the cores with the server: more of it is worse.
    assert got["client CPU (s)"] == ["12.00", "10.00", "1.20x higher"]


def test_a_missing_side_leaves_its_column_empty():
    got = rows(table({"cbserve": OURS}))
    assert got["output tok/s"] == ["300.00", "-", ""]
