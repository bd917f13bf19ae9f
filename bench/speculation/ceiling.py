"""How many tokens a step prompt lookup can give on a workload, offline: the ceiling of
what speculation can gain there, apart from what a verify row costs.

    python -m bench.speculation.ceiling [--workload edit] [--num-prompts 8] [--k 4,6,8,16]

The replies are float32's greedy ones (transformers on the default model; greedy
speculation returns exactly these), so a step's accepted drafts are the leading
drafts equal to the reply's next tokens. Two proposers are replayed over them:
- `lookup`: the worker's own (common/ngram.py), at each --lookup min..max;
- `oracle`: of every earlier position whose preceding n tokens (n = the minimum)
  equal the sequence's last n, the one whose continuation matches the reply longest:
  no n-gram proposer that drafts from the sequence's own tokens can do better.
Each row prints tokens a step (the reply's tokens over the steps it took: 1 + the
accepted drafts a step) and the acceptance rate. With a verify row costing c of a
one-row step, a step of k drafts costs 1 + c k, so the decode's speed-up is at most
tokens a step / (1 + c x drafts a step): the measured c is printed by
`python -m bench.micro.draft_rows`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from common.defaults import default_model_path
from common.ngram import NgramIndex

# (tokens so far, k, the reply's tokens still to come) -> drafts; only the oracle reads
# the third.
Proposer = Callable[[Sequence[int], int, Sequence[int]], list[int]]


def greedy_replies(workload: str, num_prompts: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """(prompt, float32 greedy reply) pairs of the speculation benchmark's workload."""
    import torch
    from transformers import AutoModelForCausalLM

    from bench.harness.spec_workloads import make_requests

    model_dir = default_model_path()
    requests = make_requests(workload, num_prompts, seed, model_dir, None)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    pairs = []
    for request in requests:
        ids = torch.tensor([request.prompt_token_ids])
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=request.max_tokens, do_sample=False)
        pairs.append((request.prompt_token_ids, out[0, ids.shape[1] :].tolist()))
    return pairs


def oracle(min_n: int) -> Callable[[], Proposer]:
    """A proposer that knows the reply."""

    def make() -> Proposer:
        def propose(tokens: Sequence[int], k: int, upcoming: Sequence[int]) -> list[int]:
            length, best = len(tokens), []
            suffix = list(tokens[length - min_n :])
            for end in range(min_n, length):
                if list(tokens[end - min_n : end]) != suffix:
                    continue
                run = 0
                while run < k and end + run < length and run < len(upcoming):
                    if tokens[end + run] != upcoming[run]:
                        break
                    run += 1
                if run > len(best):
                    best = list(tokens[end : end + run])
            return best

        return propose

    return make


def replay(pairs, make_proposer: Callable[[], Proposer], k: int) -> tuple[float, float, float]:
    """(tokens a step, drafts a step, acceptance rate) of greedy speculation at k drafts."""
    steps = drafts = accepted = 0
    for prompt, reply in pairs:
        propose, tokens, at = make_proposer(), list(prompt), 0
        while at < len(reply):
            room = len(reply) - at - 1  # the last token of the reply needs no draft
            draft = propose(tokens, min(k, room), reply[at:]) if room > 0 else []
            taken = 0
            while taken < len(draft) and draft[taken] == reply[at + taken]:
                taken += 1
            tokens.extend(reply[at : at + taken + 1])
            at += taken + 1
            steps, drafts, accepted = steps + 1, drafts + len(draft), accepted + taken
    total = sum(len(reply) for _, reply in pairs)
    return total / steps, drafts / steps, accepted / max(drafts, 1)


def lookup(min_n: int, max_n: int) -> Callable[[], Proposer]:
    def make() -> Proposer:
        index = NgramIndex(min_n, max_n)
        return lambda tokens, k, _upcoming: index.propose(tokens, k)

    return make


def print_row(name: str, k: int, row: tuple[float, float, float]) -> None:
    print(f"{name:<14} {k:3d}  {row[0]:11.2f}  {row[1]:11.2f}  {row[2]:10.2f}")


def main(argv: list[str] | None = None, prog: str = "python -m bench.speculation.ceiling") -> None:
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--workload", default="edit", choices=("edit", "summarize", "chat"))
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--k", default="4,6,8,16", help="drafts a step, comma-separated")
    parser.add_argument("--lookup", default="2:4,2:8,3:8", help="min:max n-gram sizes")
    args = parser.parse_args(argv)
    pairs = greedy_replies(args.workload, args.num_prompts, args.seed)
    print(
        f"{args.workload}: {len(pairs)} prompts, {sum(len(p) for p, _ in pairs)} prompt tokens, "
        f"{sum(len(r) for _, r in pairs)} reply tokens (float32 greedy)"
    )
    print("proposer        k  tokens/step  drafts/step  acceptance")
    sizes = [tuple(int(n) for n in pair.split(":")) for pair in args.lookup.split(",")]
    for k in (int(v) for v in args.k.split(",")):
        for min_n, max_n in sizes:
            print_row(f"lookup {min_n}..{max_n}", k, replay(pairs, lookup(min_n, max_n), k))
        for min_n in sorted({s[0] for s in sizes}):
            print_row(f"oracle n={min_n}", k, replay(pairs, oracle(min_n), k))


if __name__ == "__main__":
    main()
