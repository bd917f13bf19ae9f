"""LoRA adapters in the core: slots, the step's adapter limit, prefix keys, KV events,
placement and the vLLM metric, with the fake worker (no model)."""

from __future__ import annotations

from scheduler_svc.core.adapter_residency import AdapterResidency
from scheduler_svc.core.scheduler import Scheduler
from scheduler_svc.kv_events.replica import ReplicaKVEvents
from scheduler_svc.lora.metrics import LoraCollector
from scheduler_svc.lora.registry import AdapterInfo
from scheduler_svc.workers.adapter_loads import adapters_in_use
from scheduler_svc.workers.placement import pick_for_new

from .harness import EOS, Harness, make_request, unique_prompt


def adapter(name: str, lora_id: int) -> AdapterInfo:
    return AdapterInfo(name, lora_id, f"/adapters/{name}", "base", 8, ("q_proj",))


A, B, C = adapter("a", 1), adapter("b", 2), adapter("c", 3)
BYPASSES = 2


def lora_harness(num_slots: int, max_loras: int, kv_events=None, **kwargs) -> Harness:
    """A Harness whose scheduler has LoRA slots (the Harness builds one without)."""
    harness = Harness(**kwargs)
    old = harness.scheduler
    harness.residency = AdapterResidency(num_slots, max_loras)
    harness.scheduler = Scheduler(
        old.config,
        num_blocks=old.block_manager.num_blocks,
        block_size=old.block_manager.block_size,
        max_model_len=old.max_model_len,
        eos_token_ids=(EOS,),
        clock=harness.clock,
        kv_events=kv_events,
        adapters=harness.residency,
    )
    harness.tick, harness.loading = 0, []  # run_with_loads's clock and loads in flight
    return harness


def run_with_loads(
    harness: Harness, load_steps: int = 1, max_steps: int = 2000, until_idle: bool = True
) -> list[set]:
    """Steps as the engine does, loads answered load_steps steps after they start;
    checks every new sequence's slot; returns each plan's set of adapter ids."""
    residency, scheduler = harness.residency, harness.scheduler
    by_seq = {r.seq_id: r for r in harness.requests.values()}
    per_step = []
    for _ in range(max_steps):
        harness.tick += 1
        for _, lora_id in [entry for entry in harness.loading if entry[0] <= harness.tick]:
            residency.loaded(lora_id)
        harness.loading = [entry for entry in harness.loading if entry[0] > harness.tick]
        for _slot, info in residency.start_loads(adapters_in_use(scheduler)):
            harness.loading.append((harness.tick + load_steps, info.lora_id))
        plan = harness.schedule()
        if plan is None:
            if not scheduler.has_unfinished_requests():
                return per_step
            continue
        for sequence in plan.new_sequences:
            request = by_seq[sequence.seq_id]
            if request.adapter is None:
                assert sequence.adapter_slot == 0
            else:
                assert residency.is_ready(request.adapter.lora_id), "planned before its load"
                assert sequence.adapter_slot == residency.slot(request.adapter.lora_id)
        seq_ids = [s.seq_id for s in plan.new_sequences + plan.continuing_sequences]
        ids = {by_seq[s].adapter.lora_id for s in seq_ids if by_seq[s].adapter is not None}
        per_step.append(ids)
        harness.send(plan)
        harness.answer_oldest()
    if until_idle:
        raise AssertionError("not idle")
    return per_step


def add(harness: Harness, info: AdapterInfo | None, prompt, tokens, **kwargs):
    request = make_request(prompt, max_tokens=len(tokens), **kwargs)
    request.adapter = info
    return harness.add(request, tokens)


def test_more_adapters_than_max_loras_each_step_holds_at_most_max_loras():
    harness = lora_harness(num_slots=2, max_loras=1, max_bypasses=2)
    expected = {}
    for index, info in enumerate([A, B, None, C, A, B, C, None, A]):
        tokens = [500 + index, 600 + index, 700 + index]
        request = add(harness, info, unique_prompt(6), tokens, arrival_time=index)
        expected[request.request_id] = tokens
    per_step = run_with_loads(harness, load_steps=2)
    assert max(len(ids) for ids in per_step) == 1
    assert {frozenset(ids) for ids in per_step if ids} == {frozenset({i}) for i in (1, 2, 3)}
    for request_id, tokens in expected.items():
        assert harness.token_ids(request_id) == tokens, request_id


def test_an_old_request_of_another_adapter_is_not_starved_by_later_ones():
    harness = lora_harness(num_slots=1, max_loras=1, max_bypasses=BYPASSES, max_num_seqs=2)
    add(harness, A, unique_prompt(4), [1, 2, 3, 4], arrival_time=0)
    run_with_loads(harness, max_steps=2, until_idle=False)  # A loads
    old = add(harness, B, unique_prompt(4), [9], arrival_time=1)
    for step in range(60):
        # A steady stream of A requests, each newer than `old`: A is never idle.
        add(harness, A, unique_prompt(4), [5, 6], arrival_time=2 + step)
        add(harness, A, unique_prompt(4), [5, 6], arrival_time=2 + step)
        run_with_loads(harness, max_steps=2, until_idle=False)
        if harness.finished(old.request_id):
            break
    assert harness.token_ids(old.request_id) == [9]
    assert step < 20, f"B waited {step} rounds behind later A requests"


def test_lru_evicts_only_slots_nothing_uses():
    residency = AdapterResidency(num_slots=2, max_loras=2)
    residency.want(A)
    residency.want(B)
    assert residency.start_loads(set()) == [(1, A), (2, B)]
    residency.loaded(1)
    residency.loaded(2)
    residency.touch([2])
    residency.touch([1])  # A is now the most recently used, B the least
    residency.want(C)
    assert residency.start_loads(in_use={2}) == [(1, C)], "B is in use: A goes, not B"
    assert not residency.holds(1) and residency.holds(3) and not residency.is_ready(3)
    residency.want(A)
    assert residency.start_loads(in_use={2}) == [], "C loading, B in use: A waits"
    residency.loaded(3)
    assert residency.start_loads(in_use={2, 3}) == []
    assert residency.start_loads(in_use={2}) == [], "C loaded since the last step: kept"
    residency.touch([])  # a step was planned (C's requests had their chance)
    assert residency.start_loads(in_use={2}) == [(1, A)]


def test_a_request_entering_only_prefetches_into_a_free_slot():
    residency = AdapterResidency(num_slots=1, max_loras=1)
    residency.want(A)
    residency.start_loads(set())
    residency.loaded(1)
    residency.touch([])
    residency.want(B, evict=False)
    assert residency.start_loads(set()) == [] and not residency.wanted
    residency.want(B)
    assert residency.start_loads(set()) == [(1, B)]


def test_retired_adapter_leaves_its_slot_once_unused():
    residency = AdapterResidency(num_slots=1, max_loras=1)
    residency.want(A)
    residency.start_loads(set())
    residency.loaded(1)
    residency.retire(1)
    assert residency.sweep_retired(in_use={1}) == []
    assert residency.sweep_retired(in_use=set()) == [1]
    assert not residency.holds(1)


def test_prefix_blocks_are_never_shared_across_adapters():
    harness = lora_harness(num_slots=2, max_loras=2, enable_prefix_caching=True)
    prompt = unique_prompt(12)
    first = add(harness, A, prompt, [1])
    run_with_loads(harness)
    assert first.cached_prompt_tokens == 0
    hits = {}
    for name, info in (("b", B), ("base", None), ("a", A)):
        request = add(harness, info, prompt, [1])
        run_with_loads(harness)
        hits[name] = request.cached_prompt_tokens
    assert hits == {"b": 0, "base": 0, "a": 8}


def test_kv_events_name_the_adapter():
    batches = []
    events = ReplicaKVEvents(lambda ts, batch: batches.append(batch))
    harness = lora_harness(num_slots=1, max_loras=1, kv_events=events)
    add(harness, A, unique_prompt(8), [1])
    add(harness, None, unique_prompt(8), [1])
    run_with_loads(harness)
    events.flush()
    stored = [e for batch in batches for e in batch if e[0] == "BlockStored"]
    assert {(e[5], e[7]) for e in stored} == {(1, "a"), (None, None)}


class _Candidate:
    def __init__(self, name, waiting=0, load=0, holds=()):
        self.name, self.num_waiting, self.load, self.num_submitted = name, waiting, load, 0
        self._holds = set(holds)

    def fits(self, num_tokens):
        return True

    def cached_prefix_tokens(self, token_ids, root=None):
        return 0

    def holds_adapter(self, lora_id):
        return lora_id in self._holds


def test_placement_prefers_a_worker_holding_the_adapter():
    idle, holder = _Candidate("idle"), _Candidate("holder", load=3, holds={1})
    assert pick_for_new([idle, holder], [1, 2], 10, A).name == "holder"
    assert pick_for_new([idle, holder], [1, 2], 10, B).name == "idle"
    assert pick_for_new([idle, holder], [1, 2], 10, None).name == "idle"
    busy = _Candidate("busy", waiting=2, load=3, holds={1})
    assert pick_for_new([idle, busy], [1, 2], 10, A).name == "idle", "a backlog attracts none"


def test_lora_requests_info_metric():
    harness = lora_harness(num_slots=2, max_loras=2)
    add(harness, A, unique_prompt(4), [1, 2, 3])
    add(harness, C, unique_prompt(4), [1, 2, 3])
    add(harness, None, unique_prompt(4), [1, 2, 3])
    harness.residency.want(A)
    harness.residency.start_loads(set())
    harness.residency.loaded(1)
    harness.schedule()  # a runs, c waits for its load
    engine = type("Engine", (), {"scheduler": harness.scheduler})()
    pool = type("Pool", (), {"engines": {"w": engine}})()
    (family,) = LoraCollector(pool, max_loras=2, clock=lambda: 1234.5).collect()
    (sample,) = family.samples
    assert family.name == "vllm:lora_requests_info"
    assert sample.labels == {
        "running_lora_adapters": "a",
        "waiting_lora_adapters": "c",
        "max_lora": "2",
    }
    assert sample.value == 1234.5
