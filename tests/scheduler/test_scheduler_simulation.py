"""Randomized simulation of the scheduler under memory pressure (hypothesis).

Random arrivals, prompts built from a few shared prefixes (so the prefix
cache gets hits), output lengths, priorities, cancellations (some while the
request's step is in flight) and deadlines, on small pools with random
limits and policies, against the protocol- and KV-checking fake worker.

After every step: the books balance (books.check_books: every block is used,
cached or empty; each block's ref count is the number of tables holding it;
per request num_preemptions <= num_output_tokens; used == 0 when idle), no
live request is past its deadline, no waiting request has been bypassed
more than max_bypasses times, and no request that could have been preempted
and is worse than a victim of the step is still running. At the end every
accepted request has ended exactly once: one final output, one error, or the
client's cancellation; its tokens are exactly its script's, in order, however
often it was preempted; and an error is one it deserved.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler_svc.core.request import FinishReason, Request

from .books import check_books
from .harness import EOS, Harness, make_request

MAX_STEPS = 2000
# Token ids the prompts and scripts are drawn from: plain words, never EOS.
FIRST_ID = 5000


@dataclass
class Spec:
    arrival: int
    prompt: list[int]
    max_tokens: int
    ignore_eos: bool
    eos_at: int | None
    priority: int
    cancel_step: int | None
    cancel_in_flight: bool
    deadline: int | None

    def script(self, index: int) -> int:
        """The token the worker samples as output number `index`."""
        if index == self.eos_at:
            return EOS
        return FIRST_ID + 400 + (sum(self.prompt) * 7 + index * 13) % 300


@st.composite
def simulations(draw):
    block_size = draw(st.integers(1, 4))
    num_blocks = draw(st.integers(2, 14))
    config = {
        "max_num_seqs": draw(st.integers(1, 6)),
        "max_num_batched_tokens": draw(st.integers(1, 16)),
        "num_blocks": num_blocks,
        "block_size": block_size,
        "max_model_len": draw(st.integers(4, 64)),
        "enable_prefix_caching": draw(st.booleans() | st.just(True)),
        "max_bypasses": draw(st.sampled_from([0, 1, 2, 4, 16])),
        "watermark": draw(st.sampled_from([0.0, 0.0, 0.1, 0.3])),
        "batching": draw(st.sampled_from(["continuous"] * 4 + ["static"])),
        "async_scheduling": draw(st.booleans()),
    }
    # Prompts fit the pool and the model (add_request refuses the others).
    # Some workloads have only short ones: many small requests behind a big
    # one is what the bypass rule is about.
    longest_prompt = min(
        config["max_model_len"] - 1, num_blocks * block_size, draw(st.integers(2, 20))
    )
    ids = st.integers(FIRST_ID, FIRST_ID + 300)
    prefixes = draw(st.lists(st.lists(ids, min_size=1, max_size=12), min_size=1, max_size=3))
    # Requests arrive in bursts: several at the same step is what puts a
    # queue behind a request that does not fit.
    bursts = draw(st.lists(st.integers(0, 20), min_size=1, max_size=4))
    specs = []
    for _ in range(draw(st.integers(1, 12))):
        prefix = draw(st.sampled_from(prefixes))
        prompt = prefix[: draw(st.integers(0, len(prefix)))] + draw(st.lists(ids, max_size=5))
        prompt = (prompt or [FIRST_ID])[:longest_prompt]
        # Mostly requests whose KV fits the pool alone; some that never can.
        fits = num_blocks * block_size + 1 - len(prompt)
        max_tokens = draw(st.integers(1, max(1, fits)) | st.integers(1, 24))
        specs.append(
            Spec(
                arrival=draw(st.sampled_from(bursts)),
                prompt=prompt,
                max_tokens=max_tokens,
                ignore_eos=draw(st.booleans()),
                eos_at=draw(st.none() | st.integers(0, max_tokens)),
                priority=draw(st.integers(0, 2)),
                cancel_step=draw(st.none() | st.none() | st.integers(0, 40)),
                cancel_in_flight=draw(st.booleans()),
                deadline=draw(st.none() | st.none() | st.integers(0, 40)),
            )
        )
    return config, specs


class Simulation:
    def __init__(self, config: dict, specs: list[Spec]) -> None:
        self.harness = Harness(**config)
        self.scheduler = self.harness.scheduler
        self.pending = sorted(specs, key=lambda spec: spec.arrival)
        self.requests: list[tuple[Request, Spec]] = []
        self.cancelled: set[str] = set()
        self.now = 0

    def run(self) -> None:
        for step in range(MAX_STEPS):
            self.now = step
            self.harness.clock.now = float(step)
            self._arrive(step)
            self._cancel(step, in_flight=False)
            preemptible = [r for r in self.scheduler.running if r.sampled_since_admission]
            preemptions = {r.request_id: r.num_preemptions for r, _ in self.requests}
            # With async scheduling a plan is sent while the one before it runs; its
            # result is applied once the next is out, or when nothing more is planned.
            plan = self.harness.schedule() if self.harness.may_send() else None
            self._check_after_schedule()
            self._check_victims(preemptible, preemptions)
            if plan is not None:
                self._cancel(step, in_flight=True)
                self.harness.send(plan)
            answered = self.harness.in_flight and (plan is None or not self.harness.may_send())
            if answered:
                self.harness.answer_oldest()
            check_books(self.scheduler)
            # Idle: nothing planned, nothing answered (whose stops the next plan tells).
            idle = not (answered or self.scheduler.has_unfinished_requests())
            if plan is None and not self.pending and idle:
                return
        raise AssertionError(f"not idle after {MAX_STEPS} steps")

    def _arrive(self, step: int) -> None:
        while self.pending and self.pending[0].arrival <= step:
            spec = self.pending.pop(0)
            request = make_request(
                spec.prompt,
                max_tokens=spec.max_tokens,
                ignore_eos=spec.ignore_eos,
                priority=spec.priority,
                arrival_time=float(step),
                deadline=None if spec.deadline is None else float(step + spec.deadline),
            )
            script = [spec.script(index) for index in range(spec.max_tokens)]
            self.requests.append((self.harness.add(request, tokens=script), spec))

    def _cancel(self, step: int, in_flight: bool) -> None:
        for request, spec in self.requests:
            if spec.cancel_step == step and spec.cancel_in_flight == in_flight:
                if not request.is_finished:
                    self.cancelled.add(request.request_id)
                self.scheduler.abort_request(request.request_id)

    def _check_after_schedule(self) -> None:
        for request in [*self.scheduler.waiting, *self.scheduler.running]:
            assert request.deadline is None or request.deadline > self.now
        for request in self.scheduler.waiting:
            assert request.num_bypassed <= self.scheduler.config.max_bypasses
        for request_id, error in self.harness.errors.items():
            if error.code is grpc.StatusCode.DEADLINE_EXCEEDED:
                request = self.harness.requests[request_id]
                assert request.deadline is not None and request.deadline <= self.now

    def _check_victims(self, preemptible: list[Request], before: dict[str, int]) -> None:
        """Victims are the worst preemptible requests: none worse is left running."""
        victims = [r for r, _ in self.requests if r.num_preemptions > before[r.request_id]]
        running = set(map(id, self.scheduler.running))
        for victim in victims:
            assert victim.num_preemptions == before[victim.request_id] + 1
            spared = [r for r in preemptible if id(r) in running]
            assert all(r.running_order < victim.running_order for r in spared), (
                f"{victim.request_id} preempted while a worse preemptible request kept running"
            )

    def check_outcomes(self) -> None:
        harness = self.harness
        assert harness.worker.sequences == {}, "the worker still holds sequences"
        assert harness.block_manager.num_used_blocks == 0
        for request, spec in self.requests:
            request_id = request.request_id
            assert request.is_finished
            assert request.num_preemptions <= request.num_output_tokens
            tokens = harness.token_ids(request_id)
            assert tokens == [spec.script(index) for index in range(len(tokens))]
            expected_tokens, expected_reason = self._expected(request, spec)
            endings = [
                harness.finished(request_id),
                request_id in harness.errors,
                request_id in self.cancelled,
            ]
            assert sum(endings) == 1, f"{request_id} ended {endings}"
            if harness.finished(request_id):
                assert len(tokens) == expected_tokens
                assert harness.final(request_id).finish_reason is expected_reason
                assert request.finish_reason is expected_reason
            else:
                assert request.finish_reason is FinishReason.ABORT
                assert len(tokens) < expected_tokens
            error = harness.errors.get(request_id)
            if error is not None and error.code is grpc.StatusCode.RESOURCE_EXHAUSTED:
                # Only a request whose KV could never fit the pool fails so.
                longest_kv = min(len(spec.prompt) + expected_tokens, self.max_model_len) - 1
                assert harness.block_manager.blocks_needed(longest_kv) > self.num_blocks
            else:
                assert error is None or error.code is grpc.StatusCode.DEADLINE_EXCEEDED

    @property
    def max_model_len(self) -> int:
        return self.scheduler.max_model_len

    @property
    def num_blocks(self) -> int:
        return self.harness.block_manager.num_blocks

    def _expected(self, request: Request, spec: Spec) -> tuple[int, FinishReason]:
        """How many tokens a run without interference gives, and why it stops."""
        for count in range(1, spec.max_tokens + 1):
            if spec.script(count - 1) == EOS and not spec.ignore_eos:
                return count, FinishReason.STOP
            if request.num_prompt_tokens + count >= self.max_model_len:
                return count, FinishReason.LENGTH
        return spec.max_tokens, FinishReason.LENGTH


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(simulation=simulations())
def test_random_traffic_under_memory_pressure_keeps_every_invariant(simulation):
    config, specs = simulation
    run = Simulation(config, specs)
    run.run()
    run.check_outcomes()
