"""Worker liveness: a dead, hung or unreachable worker is found within
--worker-timeout whatever it was doing (never used, idle, mid-step), its
requests finish elsewhere with the tokens of a run without the fault, and it
is taken back when it answers again.

One stack, two workers: worker0 is dialled directly, worker1 through a TCP
proxy in this process that can stop forwarding without closing anything (a
node that drops off the network). Faults are real: SIGKILL (dead), SIGSTOP
(hung: its process answers nothing, not even pings), the proxy's cut
(unreachable). Times are measured from the fault to the moment the
scheduler's cbserve_worker_connected gauge for that worker reads 0; the
figures in docs/operations.md, "When a worker fails", come from these tests (-s prints them).
"""

from __future__ import annotations

import signal
import sys
import time

import pytest

from cbserve.client import Client
from cbserve.local_stack import ChildProcess, LocalStack, free_port
from tests.integration.blackhole import BlackholeProxy
from tests.integration.liveness import (
    GREEDY,
    WORKER_ARGS,
    WORKER_TIMEOUT_S,
    losses,
    requests_recomputed,
    restart_worker,
    run_greedy,
    wait_until,
    worker_connected,
)
from tests.integration.stacks import wait_until_idle

# Scrapes every 50 ms, a busy 2-core machine: what a measured detection time may
# exceed --worker-timeout by.
SLACK_S = 1.5
MAX_TOKENS = 24
PROMPTS = [f"Request {index}: describe a {thing} in one line." for index, thing in enumerate(
    ["river", "lamp", "cloud", "train", "chair", "storm", "violin", "garden",
     "market", "glacier", "kettle", "comet", "harbour", "ladder", "meadow", "tunnel"]
)]  # fmt: skip


class Stack:
    def __init__(self) -> None:
        port = free_port()
        argv = [sys.executable, "-m", "worker_svc", "--host", "127.0.0.1", "--port", str(port)]
        self.proxied = ChildProcess("worker1", [*argv, "--grace-period", "2", *WORKER_ARGS])
        self.proxy = BlackholeProxy(port).start()
        self.local = LocalStack(
            num_workers=1,
            worker_args=WORKER_ARGS,
            scheduler_args=[
                "--worker-timeout", str(WORKER_TIMEOUT_S), "--worker", self.proxy.address,
            ],
        )  # fmt: skip

    @property
    def direct(self) -> str:
        return f"127.0.0.1:{self.local.worker_ports[0]}"

    def restart_direct_worker(self) -> None:
        restart_worker(self.local, 0)

    def placed(self, worker: str) -> float:
        return self.local.metrics()[f'cbserve_worker_requests_total{{worker="{worker}"}}']

    def wait_both_connected(self) -> float:
        return wait_until(
            "both workers connected",
            lambda: (
                worker_connected(self.local, self.direct)
                and worker_connected(self.local, self.proxy.address)
            ),
        )

    def stop(self) -> None:
        self.local.stop()
        self.proxied.stop()
        self.proxy.stop()


@pytest.fixture(scope="module")
def stack():
    running = Stack()
    try:
        running.proxied.wait_ready()
        running.local.start()
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def reference(stack):
    stack.wait_both_connected()
    started = time.monotonic()
    outcomes, _ = run_greedy(stack.local.address, PROMPTS, MAX_TOKENS)
    assert all(o.finish_reason for o in outcomes)
    return [o.tokens for o in outcomes], time.monotonic() - started


def _report(what: str, **figures) -> None:
    print(f"\n[liveness] {what}: " + ", ".join(f"{k}={v}" for k, v in figures.items()))


# make test-slow (18 s): make test finds a worker killed mid-run (test_worker_faults.py)
# and one stopped mid-run (below).
@pytest.mark.slow
def test_a_worker_killed_before_its_first_request_is_found_at_once(stack):
    stack.wait_both_connected()
    before = losses(stack.local)["disconnected"]
    stack.local.workers[0].process.kill()
    killed = time.monotonic()
    detected_s = wait_until("worker0 lost", lambda: not worker_connected(stack.local, stack.direct))
    assert detected_s <= WORKER_TIMEOUT_S + SLACK_S
    assert losses(stack.local)["disconnected"] == before + 1
    placed_before = stack.placed(stack.proxy.address)
    started = time.monotonic()
    with Client(stack.local.address) as client:
        for prompt in PROMPTS[:8]:
            reply = client.complete(prompt, max_tokens=8, timeout=60, **GREEDY)
            assert len(reply.token_ids) == 8
    assert stack.placed(stack.proxy.address) == placed_before + 8
    _report(
        "SIGKILL before the first request",
        detected_s=round(detected_s, 2),
        eight_requests_s=round(time.monotonic() - started, 2),
    )
    stack.restart_direct_worker()
    recovered_s = stack.wait_both_connected()
    _report("restart on the same port", reconnected_s=round(time.monotonic() - killed, 2),
            after_ready_s=round(recovered_s, 2))  # fmt: skip


def test_a_worker_stopped_mid_run_loses_no_token_and_serves_again_after_sigcont(stack, reference):
    expected, reference_s = reference
    stack.wait_both_connected()
    before, recomputed_before = losses(stack.local), requests_recomputed(stack.local)
    hung = stack.local.workers[0].process
    timings = {}

    def stop_and_time():
        hung.send_signal(signal.SIGSTOP)
        timings["stopped"] = time.monotonic()
        timings["detected_s"] = wait_until(
            "worker0 lost", lambda: not worker_connected(stack.local, stack.direct)
        )

    try:
        outcomes, at_fault = run_greedy(stack.local.address, PROMPTS, MAX_TOKENS, stop_and_time)
        finished_s = time.monotonic() - timings["stopped"]
    finally:
        hung.send_signal(signal.SIGCONT)
    resumed = time.monotonic()
    assert [o.tokens for o in outcomes] == expected
    assert all(o.finish_reason for o in outcomes)
    assert any(count < MAX_TOKENS for count in at_fault), at_fault
    assert timings["detected_s"] <= WORKER_TIMEOUT_S + SLACK_S
    after = losses(stack.local)
    assert (
        after["keepalive"] + after["step_timeout"]
        == before["keepalive"] + before["step_timeout"] + 1
    )
    recomputed = requests_recomputed(stack.local) - recomputed_before
    assert recomputed >= 1
    # The rest ran on one worker instead of two: at most about twice the no-fault run.
    assert finished_s <= WORKER_TIMEOUT_S + SLACK_S + 2 * reference_s
    # Woken up, it is taken back (its old stream was given up) and gets new requests.
    stack.wait_both_connected()
    reconnected_s = time.monotonic() - resumed
    placed_before = stack.placed(stack.direct)
    outcomes, _ = run_greedy(stack.local.address, PROMPTS[:4], MAX_TOKENS)
    assert [o.tokens for o in outcomes] == expected[:4]
    assert stack.placed(stack.direct) > placed_before
    _report(
        "SIGSTOP mid-run, 16 requests",
        detected_s=round(timings["detected_s"], 2),
        requests_recomputed=int(recomputed),
        all_done_after_fault_s=round(finished_s, 2),
        no_fault_run_s=round(reference_s, 2),
        reconnected_after_sigcont_s=round(reconnected_s, 2),
    )
    wait_until_idle(stack.local)


def test_an_unreachable_worker_is_found_idle_and_mid_run(stack, reference):
    expected, _ = reference
    stack.wait_both_connected()
    before = losses(stack.local)
    stack.proxy.cut()
    idle_s = wait_until(
        "worker1 lost", lambda: not worker_connected(stack.local, stack.proxy.address)
    )
    assert idle_s <= WORKER_TIMEOUT_S + SLACK_S
    assert losses(stack.local)["keepalive"] == before["keepalive"] + 1
    stack.proxy.heal()
    idle_back_s = stack.wait_both_connected()

    recomputed_before = requests_recomputed(stack.local)
    timings = {}

    def cut_and_time():
        stack.proxy.cut()
        timings["mid_run_s"] = wait_until(
            "worker1 lost", lambda: not worker_connected(stack.local, stack.proxy.address)
        )

    try:
        outcomes, at_fault = run_greedy(stack.local.address, PROMPTS[:8], MAX_TOKENS, cut_and_time)
    finally:
        stack.proxy.heal()
    assert [o.tokens for o in outcomes] == expected[:8]
    assert any(count < MAX_TOKENS for count in at_fault), at_fault
    assert timings["mid_run_s"] <= WORKER_TIMEOUT_S + SLACK_S
    recomputed = requests_recomputed(stack.local) - recomputed_before
    assert recomputed >= 1
    back_s = stack.wait_both_connected()
    _report(
        "unreachable (proxy cut)",
        idle_detected_s=round(idle_s, 2),
        idle_reconnected_after_heal_s=round(idle_back_s, 2),
        mid_run_detected_s=round(timings["mid_run_s"], 2),
        mid_run_requests_recomputed=int(recomputed),
        mid_run_reconnected_after_heal_s=round(back_s, 2),
    )
    wait_until_idle(stack.local)
