"""`cbserve bench replicas`: cbserve replicas on loopback behind SGLang's model gateway.

    cbserve bench replicas                          # issue 33: 3 replicas, 32 x 4 turns
    cbserve bench replicas --conversations 8 --no-kill

Starts --replicas replicas (each a scheduler with its own null worker, as `cbserve
serve` runs them) and, for each phase, the `sglang-router` gateway in front
(bench/replicas/fleet.py); drives multi-turn conversations through it
(bench/replicas/conversations.py) and compares the cached prompt tokens each policy
keeps with what one replica serving everything keeps (bench/replicas/phases.py).
The markdown table goes to stdout and --out-dir.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

from bench.flag_main import flag_main
from bench.replicas.config import ReplicasBenchConfig
from bench.replicas.fleet import router_missing, start_replicas
from bench.replicas.phases import (
    Phase,
    behind_router,
    model_name,
    one_replica,
    with_a_replica_killed,
)
from bench.scheduler.run import children_log_to, cpu_model


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def table(phases: list[Phase]) -> str:
    reference = phases[0].cached_tokens or 1
    rows = [
        "| phase | turns answered | hung | prompt tokens | cached (usage) | cached (replicas' "
        "`cbserve_prefix_cache_hits_total`) | vs one replica | router retries | slowest s | "
        "wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for phase in phases:
        killed = f" (killed after {phase.killed_at_turn})" if phase.killed_at_turn else ""
        rows.append(
            f"| {phase.name}{killed} | {phase.answered}/{phase.sent} | {phase.hung} | "
            f"{phase.prompt_tokens} | {phase.cached_tokens} | {phase.metric_hits} "
            f"({'/'.join(map(str, phase.per_replica_hits))}) | "
            f"{phase.cached_tokens / reference:.3f}x | {phase.router_retries} | "
            f"{phase.slowest_s:.2f} | {phase.wall_s:.1f} |"
        )
    return "\n".join(rows)


def run(config: ReplicasBenchConfig, command: str) -> int:
    missing = router_missing()
    if missing:
        _say(f"cannot run: {missing}")
        return 2
    config.out_dir.mkdir(parents=True, exist_ok=True)
    log = config.out_dir / "processes.log"
    _say(f"starting {config.replicas} replicas (scheduler + null worker each); logs in {log}")
    stacks = []
    phases: list[Phase] = []
    try:
        with children_log_to(log):
            stacks += start_replicas(config.replicas, config.null_step_ms,
                                     config.num_kv_blocks, log)  # fmt: skip
        model = model_name(stacks[0])
        _say("  one replica serving everything ...")
        phases.append(one_replica(config, stacks, model))
        for index, policy in enumerate(config.policies, start=1):
            _say(f"  {config.replicas} replicas behind the router, {policy} ...")
            phases.append(behind_router(config, stacks, model, policy, config.seed + index, log))
        if config.kill:
            _say("  cache_aware with a replica killed mid-run ...")
            seed = config.seed + len(config.policies) + 1
            phases.append(with_a_replica_killed(config, stacks, model, seed, log))
    finally:
        for stack in stacks:
            stack.stop()
    text = (
        f"`{command}` on {cpu_model()}: {config.replicas} replicas, {config.conversations} "
        f"conversations x {config.turns} turns, {config.concurrency} at a time\n\n{table(phases)}"
    )
    print(text)
    (config.out_dir / "results.md").write_text(text + "\n")
    data = [{**asdict(p), "answered": p.answered, "cached_tokens": p.cached_tokens}
            for p in phases]  # fmt: skip
    (config.out_dir / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    for phase in phases:
        for result in phase.results:
            if not result.ok:
                _say(f"{phase.name}: conversation {result.conversation} turn {result.turn}: "
                     f"status {result.status} {result.error}")  # fmt: skip
    return 0 if all(p.answered == p.sent for p in phases) else 1


def main(argv: list[str] | None = None, prog: str = "python -m bench.replicas.run") -> int:
    return flag_main(ReplicasBenchConfig, run, argv, prog, __doc__.split("\n\n")[0])


if __name__ == "__main__":
    sys.exit(main())
