"""`python -m worker_svc --model-impl null` as a real process over gRPC: it describes the
model without loading it and answers one-step and multi-step plans with real ids of
the default tokenizer's ordinary text, logprobs included, after its step time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from cbserve.local_stack import free_port
from cbserve.worker.v1 import worker_pb2 as pb
from cbserve.worker.v1 import worker_pb2_grpc
from common.defaults import default_model_path

# Starts real processes (null workers need no weights).
pytestmark = pytest.mark.process

REPO_ROOT = Path(__file__).resolve().parents[2]
STEP_MS = 20
SAMPLING = pb.SequenceSampling(temperature=1.0, top_p=1.0, repetition_penalty=1.0)
LOGPROBS = pb.SequenceSampling(temperature=1.0, top_p=1.0, repetition_penalty=1.0, num_logprobs=2)


@pytest.fixture(scope="module")
def null_worker():
    port = free_port()
    argv = [sys.executable, "-m", "worker_svc", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--model-impl", "null", "--null-step-ms", str(STEP_MS), "--num-kv-blocks", "32"]
    proc = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    line = proc.stdout.readline()
    assert line.startswith("worker ready on "), f"not ready: {line!r}"
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield line, channel
    channel.close()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def test_describes_the_model_without_loading_it(null_worker):
    line, channel = null_worker
    assert "model_impl=null" in line and "kv_blocks=32" in line
    description = worker_pb2_grpc.WorkerStub(channel).Describe(pb.DescribeRequest(), timeout=10)
    assert description.model_impl == "null" and description.num_kv_blocks == 32
    assert description.vocab_size == 49152 and description.max_model_len == 8192
    assert description.model_name == Path(default_model_path()).name


def test_answers_plans_with_ordinary_text_ids_after_the_step_time(null_worker):
    from transformers import AutoTokenizer

    _, channel = null_worker
    prompt = [1, 504, 3458, 314, 253]
    plans = [
        pb.StepPlan(step_id=1, new_sequences=[
            pb.NewSequence(seq_id=7, prompt_token_ids=prompt, num_scheduled_tokens=len(prompt),
                           block_ids=[0], sampling=LOGPROBS),
            pb.NewSequence(seq_id=8, prompt_token_ids=prompt, num_scheduled_tokens=len(prompt),
                           block_ids=[1], sampling=SAMPLING),
        ]),
        pb.StepPlan(step_id=2, num_steps=4, continuing_sequences=[
            pb.ContinuingSequence(seq_id=7, num_scheduled_tokens=1),
            pb.ContinuingSequence(seq_id=8, num_scheduled_tokens=1),
        ]),
    ]  # fmt: skip
    started = time.perf_counter()
    first, multi = list(worker_pb2_grpc.WorkerStub(channel).Step(iter(plans), timeout=30))
    elapsed = time.perf_counter() - started
    # Five simulated steps of STEP_MS, one after the other.
    assert elapsed >= 5 * STEP_MS / 1e3 and multi.forward_seconds >= 4 * STEP_MS / 1e3
    assert sorted(first.seq_ids) == [7, 8] and first.num_tokens == 10
    assert list(multi.seq_ids) == [7, 8] and len(multi.token_ids) == 8 and multi.num_tokens == 8
    row = list(first.seq_ids).index(7)
    (logprobs,) = first.logprobs
    assert logprobs.index == row and logprobs.top_token_ids[0] == first.token_ids[row]
    assert len(multi.logprobs) == 4 and [lp.index for lp in multi.logprobs] == [0, 2, 4, 6]
    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    ids = [*first.token_ids, *multi.token_ids]
    assert tokenizer.eos_token_id not in ids
    assert all(tokenizer.decode([i]).strip() for i in ids)
