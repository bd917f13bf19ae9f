"""CPU per token of the scheduler's core loop alone, in process, with no gRPC.

`python -m bench.scheduler.core_cost [--requests 256] [--tokens 64] [--sync]`: one Scheduler
(the real one: admission, block tables, plans, the token stop checks; text is the
edge's, output/text_stream.py) drives N requests of 64-token prompts to T output
tokens each, EOS ignored, answered by a stand-in that samples one token for every
sequence whose scheduled tokens reach its end, exactly as a worker would. Two plans
are in flight as with async scheduling unless --sync. Printed: process CPU seconds
per token of schedule() and update_from_output(), apart and together. The stand-in's
own time is not counted.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections import deque

from common.defaults import converted_model_dir
from common.sampling_params import SamplingParams
from scheduler_svc.api.tokenizer import Tokenizer
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.core.plan import StepOutput, StepPlan
from scheduler_svc.core.request import Request
from scheduler_svc.core.scheduler import Scheduler

# Ordinary words of SmolLM2's vocabulary, so that detokenizing costs what it costs.
FIRST_TOKEN_ID = 1000


class _StandIn:
    """Tokens each sequence has and has computed; samples where a plan reaches the end."""

    def __init__(self) -> None:
        self.lengths: dict[int, int] = {}
        self.computed: dict[int, int] = {}

    def step(self, plan: StepPlan) -> StepOutput:
        for seq_id in plan.finished_seq_ids:
            self.lengths.pop(seq_id, None)
            self.computed.pop(seq_id, None)
        scheduled = [(s.seq_id, s.num_scheduled_tokens) for s in plan.new_sequences]
        for new in plan.new_sequences:
            self.lengths[new.seq_id] = len(new.prompt_token_ids) + len(new.output_token_ids)
            self.computed[new.seq_id] = new.num_computed_tokens
        scheduled += [(s.seq_id, s.num_scheduled_tokens) for s in plan.continuing_sequences]
        output = StepOutput(step_id=plan.step_id)
        for seq_id, count in scheduled:
            self.computed[seq_id] += count
            if self.computed[seq_id] == self.lengths[seq_id]:
                self.lengths[seq_id] += 1
                output.seq_ids.append(seq_id)
                output.token_ids.append(FIRST_TOKEN_ID + (seq_id * 7 + self.lengths[seq_id]) % 5000)
        return output


def run(num_requests: int, num_tokens: int, in_flight: int, profile: bool) -> None:
    tokenizer = Tokenizer(converted_model_dir())
    config = SchedulerConfig(
        max_num_seqs=512, max_num_batched_tokens=32768, async_scheduling=in_flight > 1
    )
    scheduler = Scheduler(
        config,
        num_blocks=num_requests * 12,
        block_size=16,
        max_model_len=2048,
        eos_token_ids=tokenizer.eos_token_ids,
        max_in_flight=config.max_steps_in_flight,
    )
    for index in range(num_requests):
        prompt = [FIRST_TOKEN_ID + (index * 64 + i) % 5000 for i in range(64)]
        sampling = SamplingParams(max_tokens=num_tokens, ignore_eos=True, temperature=0.0)
        scheduler.add_request(Request(f"r{index}", prompt, sampling))
    stand_in, sent = _StandIn(), deque()
    profiler = cProfile.Profile() if profile else None
    schedule_s = update_s = 0.0
    while True:
        while len(sent) < scheduler.max_in_flight:
            started = time.process_time()
            plan = scheduler.schedule()
            schedule_s += time.process_time() - started
            if plan is None:
                break
            sent.append((plan, stand_in.step(plan)))
        if not sent:
            break
        plan, result = sent.popleft()
        if profiler:
            profiler.enable()
        started = time.process_time()
        scheduler.update_from_output(plan, result)
        update_s += time.process_time() - started
        if profiler:
            profiler.disable()
    total = num_requests * num_tokens
    print(
        f"{num_requests} requests x {num_tokens} tokens, {scheduler.max_in_flight} plan(s) in "
        f"flight: scheduler core {(schedule_s + update_s) / total * 1e6:.1f} us of CPU per "
        f"token (schedule {schedule_s / total * 1e6:.1f}, update_from_output "
        f"{update_s / total * 1e6:.1f})"
    )
    if profiler:
        pstats.Stats(profiler).sort_stats("cumtime").print_stats(12)


def main(argv: list[str] | None = None, prog: str = "python -m bench.scheduler.core_cost") -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--sync", action="store_true", help="one plan in flight")
    parser.add_argument("--profile", action="store_true", help="cProfile update_from_output")
    args = parser.parse_args(argv)
    run(args.requests, args.tokens, 1 if args.sync else 2, args.profile)


if __name__ == "__main__":
    main()
