"""What a verify step costs on this worker, per number of drafts: the start-up
measurement (worker_svc/speculation/row_cost.py) at several draft counts, in process.

    python -m bench.micro.draft_rows [--drafts 2,4,6,7] [--repeats 5] [--dtype q4_1]

For each count k it prints the share of a one-row decode step one more row costs
((t(1 + k) / t(1) - 1) / k, the median of --repeats measurements) and the step's
whole cost 1 + k * share: what the scheduler's draft rule weighs acceptance against.
The worker measures k = 4 only (WorkerDescription.draft_row_cost); this shows where
the cost per row changes with the rows (the kernels' tiles take 8 rows of x, and a
call two tiles). The measurement's prompt repeats an 8-token cycle, so k is at most 7.
"""

from __future__ import annotations

import argparse
import statistics

from bench.micro.measure_dtype import make_runner
from worker_svc.compute.cpu_features import cpu_name
from worker_svc.speculation.row_cost import measure_draft_row_cost


def main(argv: list[str] | None = None, prog: str = "python -m bench.micro.draft_rows") -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--drafts", default="2,4,6,7")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="q4_1")
    args = parser.parse_args(argv)
    runner = make_runner(args.dtype, 400)
    print(f"CPU: {cpu_name()}, {args.dtype}, median of {args.repeats}")
    for drafts in (int(k) for k in args.drafts.split(",")):
        share = statistics.median(
            measure_draft_row_cost(runner, drafts=drafts) for _ in range(args.repeats)
        )
        print(f"{drafts} drafts: {share:.3f} of a step a row, a step {1 + drafts * share:.2f}x")


if __name__ == "__main__":
    main()
