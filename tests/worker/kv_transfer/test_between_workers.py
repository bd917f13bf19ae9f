"""SendKv and ReceiveKv between real worker processes on loopback, driven with Step plans
as a scheduler would: KV prefilled on one worker and moved decodes on the other as it
would have on the first; a layout of another dtype, bad block ids, an unreachable or
killed destination are refused with their statuses, and the source keeps serving. The
workers share a host, so the bytes go through shared memory. A source's pool is shared
by default (the q4_1 workers here): it is copied from straight out of its pool
(kv_transfer/pool_read.py), and one killed mid-transfer fails it. A source started with
--no-kv-pool-shared (the float32 ones) goes through a ring (kv_transfer/shm.py): no
segment is left in /dev/shm when either end is killed mid-transfer."""

from __future__ import annotations

import glob
import itertools
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from cbserve.ports import free_port
from cbserve.worker.v1 import worker_pb2 as pb
from cbserve.worker.v1 import worker_pb2_grpc
from tests.worker.test_worker_server import PlanFeed, start_worker, wait_ready
from worker_svc.kv_transfer.layout import CHUNK_TARGET_BYTES
from worker_svc.kv_transfer.pool_read import POOL_CHUNK_TARGET_BYTES
from worker_svc.kv_transfer.shm import NAME_PREFIX, SHM_DIR

pytestmark = [pytest.mark.process, pytest.mark.model]

NUM_BLOCKS = 160
BLOCK_SIZE = 16
STEPS_AFTER = 8
GREEDY = pb.SequenceSampling(temperature=0.0, top_p=1.0, repetition_penalty=1.0, num_logprobs=1)
PROMPT_TEXT = (
    "The Roman Empire was one of the largest empires of the ancient world. At its height it "
    "ruled the lands around the Mediterranean Sea, from Britain in the north to Egypt in the "
    "south, and its roads, laws and language shaped Europe for centuries. Its capital was"
)


class WorkerHandle:
    """A worker process with one Step stream open, fed a plan at a time."""

    def __init__(self, proc: subprocess.Popen, port: int, ready_line: str):
        self.proc, self.address = proc, f"127.0.0.1:{port}"
        self.kv_cache_dtype = ready_line.rsplit("kv_cache_dtype=", 1)[1].split()[0]
        self.channel = grpc.insecure_channel(self.address)
        self.stub = worker_pb2_grpc.WorkerStub(self.channel)
        self.feed = PlanFeed()
        self.results = self.stub.Step(iter(self.feed), timeout=600)
        self.step_ids = itertools.count(1)

    def step(self, **plan) -> pb.StepResult:
        self.feed.send(pb.StepPlan(step_id=next(self.step_ids), **plan))
        return next(self.results)

    def stop(self) -> None:
        self.feed.close()
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)


def start_workers(*arg_lists: tuple[str, ...]) -> list[WorkerHandle]:
    """Started together (their models load at once), then waited for one by one."""
    started = []
    for args in arg_lists:
        port = free_port()
        proc = start_worker("--port", str(port), "--num-kv-blocks", str(NUM_BLOCKS), *args)
        started.append((proc, port))
    return [WorkerHandle(proc, port, wait_ready(proc)) for proc, port in started]


@pytest.fixture(scope="module")
def workers():
    # q4_1 (a float16 pool) is what --dtype auto takes on the CPUs this runs on, when its
    # measurement is not disturbed; named here so that the pools' dtypes are known.
    paths = ("q4_1", "q4_1", "float32", "float32")
    # The q4_1 pools are shared (the default: copied from straight out of the pool); the
    # float32 ones private, so that their moves go through the ring and its chunks.
    private = ("--no-kv-pool-shared",)
    handles = start_workers(
        *[("--dtype", path, *(private if i >= 2 else ())) for i, path in enumerate(paths)]
    )
    yield dict(zip(["q4_1_a", "q4_1_b", "float32_a", "float32_b"], handles, strict=True))
    for handle in handles:
        handle.stop()


@pytest.fixture(scope="module")
def prompt(tokenizer) -> list[int]:
    return tokenizer.encode(PROMPT_TEXT)


def segments_of(worker: WorkerHandle) -> list[str]:
    return glob.glob(f"{SHM_DIR}/{NAME_PREFIX}{worker.proc.pid}-*")


def sampled(result: pb.StepResult, seq_id: int) -> tuple[int, float]:
    row = list(result.seq_ids).index(seq_id)
    return result.token_ids[row], result.logprobs[row].logprob


def decode(worker: WorkerHandle, seq_id: int, steps: int) -> list[tuple[int, float]]:
    cont = [pb.ContinuingSequence(seq_id=seq_id, num_scheduled_tokens=1)]
    return [sampled(worker.step(continuing_sequences=cont), seq_id) for _ in range(steps)]


def send_kv(source: WorkerHandle, destination: str, src, dst, num_tokens, timeout=60):
    request = pb.SendKvRequest(
        transfer_id=7,
        destination=destination,
        source_block_ids=src,
        destination_block_ids=dst,
        num_tokens=num_tokens,
    )
    return source.stub.SendKv(request, timeout=timeout)


@pytest.mark.parametrize("path", ["q4_1", "float32"])
def test_moved_kv_decodes_as_on_the_source(workers, prompt, path):
    a, b = workers[f"{path}_a"], workers[f"{path}_b"]
    n = len(prompt)
    moved = -(-n // BLOCK_SIZE)
    assert n % BLOCK_SIZE and moved >= 3  # full blocks and a partly filled one
    blocks = -(-(n + STEPS_AFTER + 1) // BLOCK_SIZE)
    a_blocks, b_blocks = list(range(10, 10 + blocks)), list(range(40, 40 + blocks))
    new = pb.NewSequence(
        seq_id=1,
        prompt_token_ids=prompt,
        num_scheduled_tokens=n,
        block_ids=a_blocks,
        sampling=GREEDY,
    )
    first, _ = sampled(a.step(new_sequences=[new]), 1)
    reply = send_kv(a, b.address, a_blocks[:moved], b_blocks[:moved], n)
    element = {"float32": 4, "float16": 2, "bfloat16": 2}[a.kv_cache_dtype]
    slot_bytes = 30 * 2 * 3 * 64 * element  # layers, K/V, heads, head_dim
    assert reply.bytes_sent == n * slot_bytes and reply.seconds > 0
    target = POOL_CHUNK_TARGET_BYTES if path == "q4_1" else CHUNK_TARGET_BYTES
    per_chunk = target // (BLOCK_SIZE * slot_bytes)  # 2 float32 blocks in a ring's chunk
    assert reply.num_chunks == -(-moved // per_chunk)
    on_source = decode(a, 1, STEPS_AFTER)

    # On the destination: the prompt's KV is there; only the first sampled token is computed.
    def resumed(seq_id: int, block_ids: list[int]) -> list[tuple[int, float]]:
        moved = pb.NewSequence(
            seq_id=seq_id,
            prompt_token_ids=prompt,
            output_token_ids=[first],
            num_computed_tokens=n,
            num_scheduled_tokens=1,
            block_ids=block_ids,
            sampling=GREEDY,
        )
        return [sampled(b.step(new_sequences=[moved]), seq_id)] + decode(b, seq_id, STEPS_AFTER - 1)

    on_destination = resumed(1, b_blocks)
    assert [t for t, _ in on_destination] == [t for t, _ in on_source]
    for (_, moved), (_, own) in zip(on_destination, on_source, strict=True):
        assert moved == pytest.approx(own, abs=1e-3)
    # The same plan over blocks that got no KV samples otherwise: the moved KV is what counts.
    blank = resumed(2, list(range(100, 100 + blocks)))
    assert [round(lp, 3) for _, lp in blank] != [round(lp, 3) for _, lp in on_source]
    a.step(finished_seq_ids=[1])
    b.step(finished_seq_ids=[1, 2])


def test_a_pool_of_another_dtype_is_refused(workers):
    assert workers["q4_1_b"].kv_cache_dtype == "float16"
    with pytest.raises(grpc.RpcError) as refused:
        send_kv(workers["float32_a"], workers["q4_1_b"].address, [1, 2], [1, 2], 20)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = refused.value.details()
    assert "dtype=float32" in details, details
    assert "dtype=float16" in details, details


@pytest.mark.parametrize(
    ("src", "dst", "num_tokens", "message"),
    [
        ([1, NUM_BLOCKS], [1, 2], 20, "source block ids out of range"),
        ([1, 2], [1, NUM_BLOCKS + 5], 20, "destination block ids out of range"),
        ([1, 2], [1], 20, "parallel"),
        ([1, 2], [3, 4], 40, "does not fit"),
    ],
)
def test_bad_block_ids_are_refused(workers, src, dst, num_tokens, message):
    with pytest.raises(grpc.RpcError) as refused:
        send_kv(workers["float32_a"], workers["float32_b"].address, src, dst, num_tokens)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in refused.value.details()


def test_an_unreachable_destination_is_unavailable_naming_it(workers):
    nowhere = f"127.0.0.1:{free_port()}"
    with pytest.raises(grpc.RpcError) as failed:
        send_kv(workers["float32_a"], nowhere, [1], [1], 3, timeout=30)
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert nowhere in failed.value.details()


def test_a_destination_killed_mid_transfer_fails_it_and_the_source_serves_on(workers, prompt):
    source = workers["float32_a"]
    (doomed,) = start_workers(("--dtype", "float32"))
    try:
        send_kv(source, doomed.address, [1], [1], 3)  # the source's channel is connected
        # Stopped, the destination reads nothing: the transfer stalls on flow control
        # with chunks sent, until the kill ends the connection.
        doomed.proc.send_signal(signal.SIGSTOP)
        with ThreadPoolExecutor(1) as pool:
            ids = list(range(NUM_BLOCKS - 120, NUM_BLOCKS))
            transfer = pool.submit(send_kv, source, doomed.address, ids, ids, 120 * 16)
            time.sleep(1.5)
            assert not transfer.done()
            # Offered, and not mapped by the stopped destination: the source unlinks it.
            assert segments_of(source)
            doomed.proc.kill()
            with pytest.raises(grpc.RpcError) as failed:
                transfer.result(timeout=60)
    finally:
        doomed.proc.kill()
        doomed.proc.wait(timeout=30)
        doomed.feed.close()
        doomed.channel.close()
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert doomed.address in failed.value.details()
    assert not segments_of(source)
    new = pb.NewSequence(
        seq_id=9,
        prompt_token_ids=prompt,
        num_scheduled_tokens=len(prompt),
        block_ids=[1, 2, 3, 4],
        sampling=GREEDY,
    )
    token, _ = sampled(source.step(new_sequences=[new]), 9)
    assert token >= 0
    source.step(finished_seq_ids=[9])


def test_a_source_killed_mid_transfer_leaves_no_segment(workers, monkeypatch):
    destination = workers["float32_b"]
    monkeypatch.setenv("CBSERVE_KV_CHUNK_PAUSE_S", "0.1")  # 20 chunks: about 2 s
    (doomed,) = start_workers(("--dtype", "float32", "--no-kv-pool-shared"))  # the ring
    try:
        ids = list(range(NUM_BLOCKS - 40, NUM_BLOCKS))
        with ThreadPoolExecutor(1) as pool:
            transfer = pool.submit(send_kv, doomed, destination.address, ids, ids, 40 * 16)
            time.sleep(0.8)
            assert not transfer.done()
            # The destination has the source's segment mapped (its name already unlinked).
            with open(f"/proc/{destination.proc.pid}/maps") as maps:
                assert f"{NAME_PREFIX}{doomed.proc.pid}-" in maps.read()
            doomed.proc.kill()
            with pytest.raises(grpc.RpcError):
                transfer.result(timeout=60)
        doomed.proc.wait(timeout=30)
        assert not segments_of(doomed)
    finally:
        doomed.proc.kill()
        doomed.proc.wait(timeout=30)
        doomed.feed.close()
        doomed.channel.close()
    # The destination serves on: a transfer into the same blocks goes through.
    source = workers["float32_a"]
    assert send_kv(source, destination.address, ids, ids, 40 * 16).num_chunks == 20


def test_a_shared_pool_source_killed_mid_transfer_fails_it(workers, monkeypatch):
    destination = workers["float32_b"]
    monkeypatch.setenv("CBSERVE_KV_CHUNK_PAUSE_S", "1.0")  # before its one chunk
    (doomed,) = start_workers(("--dtype", "float32", "--kv-pool-shared"))
    try:
        ids = list(range(NUM_BLOCKS - 40, NUM_BLOCKS))
        with ThreadPoolExecutor(1) as pool:
            transfer = pool.submit(send_kv, doomed, destination.address, ids, ids, 40 * 16)
            time.sleep(0.6)
            # The destination has the source's pool mapped, and no ring was needed for it.
            with open(f"/proc/{destination.proc.pid}/maps") as maps:
                assert "memfd:cbserve-kv-pool" in maps.read()
            doomed.proc.kill()
            with pytest.raises(grpc.RpcError):
                transfer.result(timeout=60)
        doomed.proc.wait(timeout=30)
    finally:
        doomed.proc.kill()
        doomed.proc.wait(timeout=30)
        doomed.feed.close()
        doomed.channel.close()
    time.sleep(0.5)  # the destination sees the stream cut and unmaps the dead pool
    with open(f"/proc/{destination.proc.pid}/maps") as maps:
        assert "memfd:cbserve-kv-pool" not in maps.read()
    # The destination serves on: a transfer into the same blocks goes through.
    assert send_kv(workers["float32_a"], destination.address, ids, ids, 40 * 16).num_chunks == 20
