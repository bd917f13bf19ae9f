"""The flags of `cbserve bench`: rates, checks, and the flags a local stack is given."""

from __future__ import annotations

import argparse
import math

import pytest

from bench.serving import options


def parse(*argv):
    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    args = parser.parse_args(argv)
    return args, options.check(args)


def test_request_rates_in_any_spelling():
    assert parse()[0].request_rate == [math.inf]
    assert parse("--request-rate", "1", "2")[0].request_rate == [1.0, 2.0]
    args, _ = parse("--request-rate", "1,2", "--request-rate", "inf")
    assert args.request_rate == [1.0, 2.0, math.inf]


def test_flag_checks():
    assert "leave out --server" in parse("--server", "h:1", "--baselines", "static")[1]
    assert parse("--goodput", "ttft:5", "tpot:1")[0].goodput == {"ttft": 5.0, "tpot": 1.0}
    assert parse("--goodput", "foo:1")[1]
    assert parse("--burstiness", "0")[1]
    with pytest.raises(SystemExit):
        parse("--baselines", "static,sglang")


def test_stack_args_pass_batching_and_extras():
    args, _ = parse("--dtype", "bfloat16", "--max-num-seqs", "8", "--worker-args", "--threads 2")
    worker, scheduler = options.stack_args(args, "static")
    assert worker == ["--dtype", "bfloat16", "--threads", "2"]
    assert scheduler == ["--max-num-seqs", "8", "--batching", "static"]
    assert "--batching" not in options.stack_args(args, None)[1]


def test_llama_server_gets_the_worker_threads():
    assert options.worker_threads(parse("--worker-args", "--threads 3")[0]) == 3
    assert options.worker_threads(parse("--worker-args=--threads=5", "--threads", "9")[0]) == 5
    args, _ = parse("--threads", "4")
    assert options.worker_threads(args) == 4
    assert options.stack_args(args, None)[0][-2:] == ["--threads", "4"]
    assert parse("--threads", "0")[1] == "--threads must be >= 1"
