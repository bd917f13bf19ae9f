"""The scheduler benchmark's pure parts: loads, derived numbers, tables, CPU accounting."""

from __future__ import annotations

import dataclasses
import json
import math
import os

import pytest

from bench.scheduler.config import SchedulerBenchConfig
from bench.scheduler.cpu_accounting import (
    CLOCK_TICKS,
    cpu_snapshot,
    cpu_used,
    parse_machine_stat,
    parse_stat,
    per_1k,
    process_tree,
)
from bench.scheduler.report import (
    Load,
    Measurement,
    capacity_table,
    floor_table,
    measurement_from_json,
    process_table,
    structured_table,
)
from bench.scheduler.run import cpu_model


def stat_line(pid: int, name: str, ppid: int, utime: int, stime: int) -> str:
    rest = ["S", str(ppid)] + ["0"] * 9 + [str(utime), str(stime)] + ["0"] * 10
    return f"{pid} ({name}) " + " ".join(rest)


def test_load_parse_label_and_capacity():
    load = Load.parse("2x10:64")
    assert (load.workers, load.step_ms, load.streams, load.us_per_token) == (2, 10.0, 64, 0.0)
    assert load.label == "2 workers, 10 ms steps, 64 streams" and load.spec == "2x10:64"
    # The numbers: 2 x 32 sequences a 10 ms step; 2 x 256 a 15 ms step.
    assert load.capacity_tok_s == pytest.approx(6400)
    assert Load.parse("2x15:512").capacity_tok_s == pytest.approx(34133.3, rel=1e-4)
    assert math.isinf(Load.parse("1x0:256").capacity_tok_s)
    # Uneven split, and a per-token part: 2 streams on one worker, 1 on the other.
    assert Load.parse("2x10+1000:3").capacity_tok_s == pytest.approx(2 / 0.012 + 1 / 0.011)
    assert Load.parse("1x0+5:8").label == "1 worker, no step time + 5 us/token, 8 streams"
    for bad in ("2x10", "0x10:4", "x:3", "2x10:0"):
        with pytest.raises(ValueError):
            Load.parse(bad)


def measurement(**changes) -> Measurement:
    values = dict(
        load=Load(2, 10.0, 16), front="grpc", wall_s=4.0, requests=32, completed=32,
        tokens=4096, messages=4096, client_cpu_s=2.0,
        cpu_s={"scheduler": 3.096, "scheduler/77": 1.0, "worker0": 0.5},
        worker_busy_s=6.0, worker_steps=600, machine_cpu_s=7.596,
    )  # fmt: skip
    return Measurement(**{**values, **changes})


def test_a_load_with_json_constrained_streams():
    load = Load.parse("1x0:64/json50")
    assert (load.streams, load.json_pct, load.constrained_streams) == (64, 50, 32)
    assert load.spec == "1x0:64/json50" and Load.parse(load.spec) == load
    assert load.label == "1 worker, no step time, 64 streams (32 JSON-constrained)"
    assert (
        Load.parse("1x0:64").json_pct == 0 and Load.parse("1x0:3/json100").constrained_streams == 3
    )
    # Results written before the field existed still load.
    assert Load(**{"workers": 1, "step_ms": 0.0, "streams": 8, "us_per_token": 0.0}).json_pct == 0
    for bad in ("1x0:64/json101", "1x0:64/json", "1x0:64/xml5"):
        with pytest.raises(ValueError):
            SchedulerBenchConfig(loads=[bad])


def test_a_load_with_regex_constrained_streams_and_its_tokens_a_stream():
    load = Load.parse("1x10:48/regex50")
    assert (load.constraint, load.constrained_streams) == ("regex", 24)
    assert load.spec == "1x10:48/regex50" and Load.parse(load.spec) == load
    assert load.label == "1 worker, 10 ms steps, 48 streams (24 regex-constrained)"
    # 24 streams of each kind, 512 tokens each; the constrained ones took twice as long.
    row = measurement(
        load=load, tokens=2 * 24 * 512, constrained_tokens=24 * 512,
        constrained_stream_s=24 * 10.0, free_stream_s=24 * 5.0,
    )  # fmt: skip
    assert row.tok_s_a_stream(True) == pytest.approx(51.2)
    assert row.tok_s_a_stream(False) == pytest.approx(102.4)
    assert "| 51.2 | 102.4 | 0.50 |" in structured_table([row])
    data = json.loads(json.dumps({**dataclasses.asdict(row), "derived": {}}))
    assert measurement_from_json(data) == row


def test_measurement_derived_numbers():
    row = measurement()
    assert row.tok_s == 1024 and row.share == pytest.approx(1024 / 1600)
    assert row.busy == pytest.approx(6.0 / 8.0)
    # 8 worker-seconds of wall time, 6 busy, over 600 steps.
    assert row.outside_ms_per_step == pytest.approx(2000 / 600)
    assert row.scheduler_cpu_ms_per_step == pytest.approx(4096 / 600)
    # The scheduler and its child process, not the worker.
    assert row.server_cpu_per_1k == pytest.approx(1.0) and row.client_cpu_per_1k == 2 / 4.096
    # 7.596 s busy on the machine, 6.596 of them ours: a quarter of a CPU was someone else's.
    assert row.other_cores == pytest.approx(0.25) and row.failed == 0
    bare = measurement(front="bare", cpu_s={"bare": 1.0}, messages=2000)
    assert bare.server_cpu_per_1k == pytest.approx(0.5)
    assert math.isnan(measurement(worker_steps=0).outside_ms_per_step)
    # results.json holds asdict(row) plus derived values; a row comes back whole.
    data = json.loads(json.dumps({**dataclasses.asdict(row), "derived": {"tok_s": 1024}}))
    assert measurement_from_json(data) == row


def test_tables_name_every_row_and_the_floor_ratio():
    rows = [
        measurement(),
        measurement(front="http", completed=31),
        measurement(front="bare", load=Load(1, 0.0, 16), cpu_s={"bare": 2.048}),
    ]
    table = capacity_table(rows).splitlines()
    assert len(table) == 4 and "x floor" in table[0]
    cells = [cell.strip() for cell in table[2].split("|")]
    assert cells[1:4] == ["2 workers, 10 ms steps, 16 streams", "grpc", "1,024"]
    assert cells[4:6] == ["1,600", "0.64"] and cells[10] == "2.00" and cells[-2] == "0"
    assert table[3].split("|")[-2].strip() == "1"
    no_ticks = [rows[0], measurement(front="bare", load=Load(1, 0.0, 16), cpu_s={"bare": 0.0})]
    assert capacity_table(no_ticks).splitlines()[2].split("|")[10].strip() == "-"
    floor = floor_table(rows).splitlines()
    assert len(floor) == 3 and floor[2].startswith("| 16 | 1,024 | 0.500 |")
    processes = process_table(rows).splitlines()
    assert processes[2] == (
        "| 2 workers, 10 ms steps, 16 streams | grpc | scheduler 0.756, scheduler/77 0.244, "
        "worker0 0.122, load generator 0.488 |"
    )
    assert processes[4] == "| 16 streams | bare | bare 0.500, load generator 0.488 |"


def test_parse_stat_counts_fields_after_the_last_parenthesis():
    stat = parse_stat(stat_line(42, "py (x) y", 7, 150, 50), ticks_per_s=100)
    assert (stat.pid, stat.ppid, stat.name, stat.cpu_s) == (42, 7, "py (x) y", 2.0)
    line = "cpu  100 5 50 1000 20 3 2 10 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"
    assert parse_machine_stat(line, ticks_per_s=100) == pytest.approx(1.7)


def test_process_tree_and_snapshots_from_a_fake_proc(tmp_path):
    for pid, ppid, seconds in ((10, 1, 1.0), (11, 10, 0.5), (12, 11, 0.25), (20, 1, 4.0)):
        (tmp_path / str(pid)).mkdir()
        ticks = round(seconds * CLOCK_TICKS)
        (tmp_path / str(pid) / "stat").write_text(stat_line(pid, "python", ppid, ticks, 0))
    (tmp_path / "self").mkdir()
    assert [s.pid for s in process_tree(10, tmp_path)] == [10, 11, 12]
    assert process_tree(99, tmp_path) == []
    before = cpu_snapshot({"scheduler": 10, "worker0": 20}, tmp_path)
    assert before == {"scheduler": 1.0, "scheduler/11": 0.5, "scheduler/12": 0.25, "worker0": 4.0}
    after = {**before, "scheduler": 3.0, "scheduler/13": 0.5}
    del after["scheduler/12"]
    assert cpu_used(before, after) == {
        "scheduler": 2.0, "scheduler/11": 0.0, "scheduler/13": 0.5, "worker0": 0.0
    }  # fmt: skip
    assert per_1k(2.0, 4000) == 0.5 and math.isnan(per_1k(1.0, 0))
    # The real /proc: this process is there, with some CPU spent.
    assert cpu_snapshot({"me": os.getpid()})["me"] > 0


def test_cpu_model_names_family_model_and_vector_units():
    info = (
        "processor\t: 0\nmodel name\t: AMD EPYC\ncpu family\t: 25\nmodel\t\t: 17\n"
        "flags\t\t: fpu avx2 avx512f avx512_bf16\nprocessor\t: 1\nmodel name\t: AMD EPYC\n"
    )
    assert cpu_model(info) == "AMD EPYC (family 25 model 17, 2 CPUs, avx512f avx512_bf16)"


def test_config_refuses_bad_loads_fronts_and_args():
    config = SchedulerBenchConfig()
    assert [load.spec for load in config.parsed_loads][:2] == ["2x10:16", "2x10:64"]
    assert config.scheduler_argv() == ["--max-num-seqs", "512", "--max-num-batched-tokens", "32768"]
    argv = config.worker_argv(Load(2, 15.0, 512), num_kv_blocks=10304)
    assert argv[:4] == ["--model-impl", "null", "--null-step-ms", "15"]
    assert "--num-kv-blocks" in argv
    with pytest.raises(ValueError, match="a load is"):
        SchedulerBenchConfig(loads=["2x10"])
    with pytest.raises(ValueError, match="fronts"):
        SchedulerBenchConfig(fronts=["grpc", "websocket"])
    with pytest.raises(ValueError, match="output_len"):
        SchedulerBenchConfig(output_len=0)
    with pytest.raises(ValueError):
        SchedulerBenchConfig(worker_args="--model 'unclosed")
