"""Drives the real Scheduler against the FakeWorker, one engine step at a time.

Outputs go through each request's TextStream, as the edge's Generate handler
runs them: text is made there, and a stop string ends the request by aborting it
in the scheduler, as the handler does.

Like the engine, it takes the requests the scheduler failed (take_failed)
after every schedule() and keeps their errors; a request gets either one
final output or one error, never both, never two.
"""

from __future__ import annotations

import functools
import itertools
from collections import defaultdict, deque
from collections.abc import Sequence

from common.defaults import converted_model_dir
from common.sampling_params import SamplingParams
from scheduler_svc.api.tokenizer import Tokenizer
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.core.plan import DeferredMasks, StepPlan
from scheduler_svc.core.request import FinishReason, Request, RequestError, RequestOutput
from scheduler_svc.core.scheduler import Scheduler
from scheduler_svc.output.text_stream import TextStream

from .fake_worker import FakeWorker, scripted

EOS = 2  # SmolLM2's <|im_end|>
THE = 260  # " the": the token a sequence samples when its script runs out

_request_ids = itertools.count()
_fresh_token_ids = itertools.count()


@functools.cache
def load_tokenizer() -> Tokenizer:
    return Tokenizer(converted_model_dir())


def encode(text: str) -> list[int]:
    return load_tokenizer().encode(text, add_special_tokens=False)


def make_request(
    prompt: int | Sequence[int] = 8,
    request_id: str | None = None,
    *,
    priority: int = 0,
    deadline: float | None = None,
    arrival_time: float = 0.0,
    **sampling,
) -> Request:
    """A request with `prompt` ids (or that many filler ids) and the given sampling.

    Filler prompts of equal length are equal, so they share prefix-cache blocks.
    """
    prompt_ids = list(range(100, 100 + prompt)) if isinstance(prompt, int) else list(prompt)
    sampling.setdefault("temperature", 0.0)
    return Request(
        request_id=request_id or f"req-{next(_request_ids)}",
        prompt_token_ids=prompt_ids,
        sampling=SamplingParams(**sampling),
        arrival_time=arrival_time,
        priority=priority,
        deadline=deadline,
    )


def unique_prompt(length: int) -> list[int]:
    """Prompt ids no other unique_prompt shares: no prefix-cache hit between them."""
    return [1000 + next(_fresh_token_ids) % 40000 for _ in range(length)]


class FakeClock:
    """The scheduler's clock, moved by hand so that deadlines are deterministic."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Harness:
    def __init__(
        self,
        *,
        max_num_seqs: int = 8,
        max_num_batched_tokens: int = 64,
        num_blocks: int = 64,
        block_size: int = 4,
        max_model_len: int = 256,
        deferred_masks: bool = True,
        drafts: bool = False,
        constrained_drafts: bool = True,
        **config,
    ) -> None:
        """`config`: further SchedulerConfig fields (prefix caching, bypasses, ...).

        One plan at a time unless async_scheduling=True is given: the step-by-step
        tests state what each plan holds after the result before it. deferred_masks:
        the worker accepts them (as this project's do), so constrained rows are
        planned ahead of their samples under async scheduling. drafts: the worker
        verifies drafts; constrained_drafts: constrained rows too, with a mask row per
        draft position (as this project's do).
        """
        self.clock = FakeClock()
        config.setdefault("async_scheduling", False)
        scheduler_config = SchedulerConfig(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, **config
        )
        self.scheduler = Scheduler(
            scheduler_config,
            max_in_flight=scheduler_config.max_steps_in_flight,
            deferred_masks=deferred_masks,
            drafts=drafts,
            constrained_drafts=constrained_drafts,
            num_blocks=num_blocks,
            block_size=block_size,
            max_model_len=max_model_len,
            eos_token_ids=(EOS,),
            clock=self.clock,
        )
        # Tokens each sequence samples, filled in once its request (and seq id) exists.
        self.scripts: dict[int, list[int]] = {}
        self.worker = FakeWorker(num_blocks, block_size, scripted(self.scripts, lambda *_: THE))
        self.outputs: dict[str, list[RequestOutput]] = defaultdict(list)
        self.requests: dict[str, Request] = {}
        # The edge's text state per request: it stays with the client's stream when a
        # request moves to another scheduler (tests move it with the outputs).
        self.streams: dict[str, TextStream] = {}
        # Errors of the requests the scheduler ended itself (take_failed).
        self.errors: dict[str, RequestError] = {}
        # Plans sent, oldest first. The worker runs each when the scheduler reads its
        # result, in the order sent, as a real one whose sampler waits for deferred
        # masks: those the scheduler sent come with it.
        self.in_flight: deque[StepPlan] = deque()
        # Deferred masks sent, by step id, until their plan runs (a test may lose one).
        self.deferred_masks: dict[int, DeferredMasks] = {}

    @property
    def block_manager(self):
        return self.scheduler.block_manager

    def add(self, request: Request, tokens: Sequence[int] = ()) -> Request:
        self.scripts[request.seq_id] = list(tokens)
        self.requests[request.request_id] = request
        self.streams[request.request_id] = TextStream(
            load_tokenizer(), request.prompt_token_ids, request.sampling
        )
        self.scheduler.add_request(request)
        return request

    def adopt(self, request: Request, source: Harness) -> None:
        """Queues a request taken from source's scheduler, with its script, outputs so far
        and text state, as the pool moves a lost worker's request and its stream."""
        self.scripts[request.seq_id] = source.scripts[request.seq_id]
        self.outputs[request.request_id] = source.outputs.pop(request.request_id, [])
        self.streams[request.request_id] = source.streams.pop(request.request_id)
        self.requests[request.request_id] = request
        self.scheduler.adopt(request)

    def step(self) -> StepPlan | None:
        """One engine iteration, as WorkerEngine runs it: plans sent while there is room
        in flight, then the oldest one's result applied; returns that plan (None if
        there was nothing to do)."""
        while self.may_send():
            plan = self.schedule()
            if plan is None:
                break
            self.send(plan)
        return self.answer_oldest() if self.in_flight else None

    def may_send(self) -> bool:
        return len(self.in_flight) < self.scheduler.max_in_flight

    def send(self, plan: StepPlan) -> None:
        self.in_flight.append(plan)

    def answer_oldest(self) -> StepPlan:
        """Applies the result of the oldest plan in flight, then sends the deferred
        masks of the next one, as the step loop does; returns that plan."""
        plan = self.in_flight.popleft()
        result = self.worker.step(plan, self.deferred_masks.pop(plan.step_id, None))
        outputs = self.scheduler.update_from_output(plan, result)
        masks = self.scheduler.take_deferred_masks()
        if masks is not None:
            self.deferred_masks[masks.step_id] = masks
        self.deliver(outputs)
        return plan

    def schedule(self) -> StepPlan | None:
        """schedule(), then collect the requests it failed, as the engine does."""
        plan = self.scheduler.schedule()
        self.collect_failed()
        return plan

    def collect_failed(self) -> None:
        for request in self.scheduler.take_failed():
            assert request.error is not None, f"{request.request_id} failed without an error"
            assert request.request_id not in self.errors, f"{request.request_id} failed twice"
            assert not self.finished(request.request_id), f"{request.request_id} had finished"
            assert request.is_finished and not self.scheduler.block_manager.has_blocks(
                request.seq_id
            )
            self.errors[request.request_id] = request.error

    def deliver(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            assert not self.finished(output.request_id), "output after the final one"
            assert output.request_id not in self.errors, "output after an error"
            output, stopped = self.streams[output.request_id].process(output)
            if stopped:
                self.scheduler.abort_request(output.request_id, FinishReason.STOP)
            self.outputs[output.request_id].append(output)

    def run(self, max_steps: int = 1000) -> int:
        """Steps until the scheduler is idle; returns the number of steps."""
        for steps in range(max_steps):
            if self.step() is None:
                return steps
        raise AssertionError(f"not idle after {max_steps} steps")

    def finished(self, request_id: str) -> bool:
        outputs = self.outputs.get(request_id)
        return bool(outputs) and outputs[-1].finish_reason is not None

    def text(self, request_id: str) -> str:
        return "".join(output.new_text for output in self.outputs[request_id])

    def token_ids(self, request_id: str) -> list[int]:
        return [t for output in self.outputs[request_id] for t in output.new_token_ids]

    def final(self, request_id: str) -> RequestOutput:
        assert self.finished(request_id), f"{request_id} has not finished"
        return self.outputs[request_id][-1]
