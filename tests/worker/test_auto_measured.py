"""`--dtype auto` measured on this machine: real timings on tiny shapes, a made-up CPU
identity (name and flags) where the table must not decide, and the on-disk cache."""

from __future__ import annotations

import json

import pytest

from common.defaults import packaged_gguf_path
from worker_svc import native_build
from worker_svc.compute import auto_choice
from worker_svc.compute.auto_choice import TIE_MARGIN, decide, measured_choice
from worker_svc.compute.choice_cache import ChoiceKey, read_choice
from worker_svc.compute.measured import closest_measured
from worker_svc.compute.model_shapes import ProjectionShapes, read_projection_shapes
from worker_svc.compute.path_timing import StepTime
from worker_svc.compute.selection import path_order, select_path
from worker_svc.compute.weight_source import WeightSource

TINY = ProjectionShapes(hidden=64, intermediate=128, q_width=64, kv_width=32, vocab=256, layers=2)
# No avx2/fma: like no CPU in compute/measured.py, yet it computes bfloat16 natively.
UNKNOWN_FLAGS = frozenset({"sse4_2", "avx512_bf16"})
UNKNOWN_CPU = "Imaginary Vendor CPU 9000"
ZEN4_FLAGS = frozenset(
    {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"}
)


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CBSERVE_COMPUTE_PATH_CACHE", str(tmp_path / "choices"))
    # The machine's load is faked (the suite itself keeps two cores busy); the timings
    # are real.
    monkeypatch.setattr(auto_choice, "machine_busy", lambda: False)
    return tmp_path / "choices"


def _key(**change) -> ChoiceKey:
    fields = dict(
        cpu=UNKNOWN_CPU,
        flags=tuple(sorted(UNKNOWN_FLAGS)),
        shapes=TINY,
        candidates=("bfloat16", "float32"),
        threads=2,
        batch_m=32,
    )
    return ChoiceKey(**{**fields, **change})


def _figures_on_disk(cache_dir) -> dict[str, StepTime]:
    (file,) = cache_dir.glob("*.json")
    stored = json.loads(file.read_text())
    return {name: StepTime(*pair) for name, pair in stored["figures_ms"].items()}


def test_auto_on_a_cpu_absent_from_the_table_picks_by_measurement(monkeypatch, cache_dir):
    monkeypatch.setattr(native_build, "compiler", lambda: None)  # no q4_1: no build here
    assert closest_measured(UNKNOWN_FLAGS) is None
    path, why = select_path("auto", "cpu", UNKNOWN_FLAGS, shapes=TINY, cpu=UNKNOWN_CPU)
    assert "measured now" in why and "bfloat16" in why and "float32" in why
    figures = _figures_on_disk(cache_dir)
    assert set(figures) == {"bfloat16", "float32"}
    assert all(t.m1_ms > 0 and t.batch_ms > 0 for t in figures.values())
    # The generic order only seeds: the measured figures decide.
    assert path.name == decide(figures, ["bfloat16", "float32"])
    # The second start reads the choice back.
    again, why_again = select_path("auto", "cpu", UNKNOWN_FLAGS, shapes=TINY, cpu=UNKNOWN_CPU)
    assert again == path and "cached in" in why_again


def test_auto_times_q4_1_beside_the_float_paths(cache_dir):
    path, why = select_path("auto", "cpu", UNKNOWN_FLAGS, shapes=TINY, cpu=UNKNOWN_CPU)
    figures = _figures_on_disk(cache_dir)
    assert set(figures) == {"q4_1", "bfloat16", "float32"}
    assert path.name == decide(figures, ["q4_1", "bfloat16", "float32"]), why


def test_without_shapes_or_with_an_explicit_dtype_nothing_is_timed(monkeypatch, cache_dir):
    def no_timing(*args, **kwargs):
        raise AssertionError("timed")

    monkeypatch.setattr(auto_choice, "time_paths", no_timing)
    assert select_path("bfloat16", "cpu", UNKNOWN_FLAGS, shapes=TINY)[1] == "requested"
    assert "generic" in select_path("auto", "cpu", UNKNOWN_FLAGS)[1]
    assert not cache_dir.exists()


def test_the_cache_key_changes_with_the_shapes_and_the_cpu():
    base = _key().file()
    assert _key().file() == base
    wider = ProjectionShapes(**{**TINY.__dict__, "intermediate": 256})
    for other in (
        _key(shapes=wider),
        _key(shapes=ProjectionShapes(**{**TINY.__dict__, "vocab": 512})),
        _key(cpu="Another CPU"),
        _key(flags=tuple(sorted(UNKNOWN_FLAGS | {"avx512_fp16"}))),
        _key(threads=1),
    ):
        assert other.file() != base, other


def test_a_corrupt_cache_file_is_ignored_and_rewritten(monkeypatch):
    monkeypatch.setattr(native_build, "compiler", lambda: None)
    key = _key(threads=__import__("torch").get_num_threads())
    key.file().parent.mkdir(parents=True)
    key.file().write_text('{"key": {"cpu": "half a fi')
    assert read_choice(key)[0] is None and "corrupt" in read_choice(key)[1]
    choice = measured_choice(["bfloat16", "float32"], TINY, UNKNOWN_FLAGS, UNKNOWN_CPU)
    assert "measured now" in choice.source
    cached, _ = read_choice(key)
    assert cached is not None and cached.path == choice.path


def test_a_cached_choice_for_other_candidates_is_not_taken(monkeypatch):
    key = _key(candidates=("bfloat16", "float32"))
    key.file().parent.mkdir(parents=True)
    record = {"key": key.as_json(), "choice": "q4_1", "figures_ms": {"q4_1": [1, 1]}}
    key.file().write_text(json.dumps({**record, "measured_at": "then"}))
    assert read_choice(key)[0] is None


def test_decide_takes_the_fastest_and_lets_the_seed_break_near_ties():
    fast, slow = StepTime(10.0, 40.0), StepTime(30.0, 90.0)
    assert decide({"a": slow, "b": fast}, ["a", "b"]) == "b"
    near = StepTime(10.0 * (1 + TIE_MARGIN / 2), 40.0)
    assert decide({"a": near, "b": fast}, ["a", "b"]) == "a"
    assert decide({"a": near, "b": fast}, ["b", "a"]) == "b"


def test_projection_shapes_from_a_config_json(tmp_path):
    config = {
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "num_hidden_layers": 30,
        "vocab_size": 49152,
    }
    (tmp_path / "config.json").write_text(json.dumps({"text_config": config}))
    shapes = read_projection_shapes(tmp_path)
    assert shapes == ProjectionShapes(576, 1536, 576, 192, 49152, 30)
    assert shapes.qkv_width == 960 and shapes.head() == (49152, 576)
    (tmp_path / "config.json").write_text("{}")
    assert read_projection_shapes(tmp_path) is None
    assert read_projection_shapes(tmp_path / "absent") is None


def test_a_mixture_is_timed_at_the_width_one_token_reads(tmp_path):
    """Qwen3-MoE: k experts of moe_intermediate_size; Mixtral: k of intermediate_size;
    Qwen2-MoE: its shared expert besides."""
    base = {"hidden_size": 512, "num_attention_heads": 8, "num_hidden_layers": 4}
    base |= {"vocab_size": 1000, "intermediate_size": 3072, "num_experts_per_tok": 8}
    (tmp_path / "config.json").write_text(json.dumps(base | {"moe_intermediate_size": 256}))
    assert read_projection_shapes(tmp_path).intermediate == 8 * 256
    (tmp_path / "config.json").write_text(json.dumps(base))
    assert read_projection_shapes(tmp_path).intermediate == 8 * 3072
    shared = {"moe_intermediate_size": 256, "shared_expert_intermediate_size": 1024}
    (tmp_path / "config.json").write_text(json.dumps(base | shared))  # Qwen2-MoE
    assert read_projection_shapes(tmp_path).intermediate == 8 * 256 + 1024


@pytest.mark.model  # reads the GGUF's header (no tensor data)
@pytest.mark.skipif(packaged_gguf_path() is None, reason="no packaged GGUF")
def test_projection_shapes_from_the_shipped_gguf():
    shapes = read_projection_shapes(packaged_gguf_path())
    assert shapes == ProjectionShapes(576, 1536, 576, 192, 49152, 30)


def test_a_choice_timed_on_a_busy_machine_is_used_but_not_cached(monkeypatch, cache_dir):
    monkeypatch.setattr(auto_choice, "machine_busy", lambda: True)
    choice = measured_choice(["bfloat16", "float32"], TINY, UNKNOWN_FLAGS, UNKNOWN_CPU)
    assert choice.path in ("bfloat16", "float32") and "not cached" in choice.source
    assert read_choice(_key())[0] is None
    assert not list(cache_dir.glob("*.json"))


def test_a_bfloat16_checkpoint_times_its_bf16_rows_beside_the_float_paths(cache_dir):
    """Its BF16 rows timed as BF16 beside the float paths, the measurement deciding;
    q4_1's Q8_0 made at load is no candidate (it failed the accuracy gate)."""
    weights = WeightSource(gguf_blocks=False, stored_dtype="BF16")
    path, why = select_path(
        "auto", "cpu", UNKNOWN_FLAGS, shapes=TINY, cpu=UNKNOWN_CPU, weights=weights
    )
    figures = _figures_on_disk(cache_dir)
    assert set(figures) == {"bfloat16-weights", "bfloat16", "float32"}
    assert path.name == decide(figures, ["bfloat16-weights", "bfloat16", "float32"]), why
    (file,) = cache_dir.glob("*.json")
    key = json.loads(file.read_text())["key"]
    assert key["block_formats"] == [["bfloat16-weights", "BF16", "BF16"]]


def test_the_block_paths_time_the_formats_the_files_give_them(cache_dir):
    """q4_1 on a GGUF's own blocks is timed as the shipped file's Q4_1 and Q8_0; where
    it would make Q8_0 at load it is not offered at all."""
    select_path("auto", "cpu", UNKNOWN_FLAGS, shapes=TINY, cpu=UNKNOWN_CPU,
                weights=WeightSource(gguf_blocks=True, stored_dtype=None))  # fmt: skip
    (file,) = cache_dir.glob("*.json")
    key = json.loads(file.read_text())["key"]
    assert key["block_formats"] == [["q4_1", "Q4_1", "Q8_0"]]
    float32_dir = WeightSource(gguf_blocks=False, stored_dtype="F32")
    assert not float32_dir.offers("q4_1") and float32_dir.block_formats("q4_1") == ("Q8_0",) * 2


def test_bfloat16_weights_is_offered_for_a_bfloat16_checkpoint_only(monkeypatch):
    monkeypatch.setattr(auto_choice, "time_paths", lambda *a, **k: pytest.fail("timed"))
    for weights in (None, WeightSource(True, None), WeightSource(False, "F32")):
        path, _ = select_path("auto", "cpu", UNKNOWN_FLAGS, weights=weights)
        assert path.name != "bfloat16-weights"
    # A measured CPU's order holds it just before q4_1, which it ties with.
    order, source = path_order(ZEN4_FLAGS)
    assert "measured" in source and order.index("bfloat16-weights") == order.index("q4_1") - 1
