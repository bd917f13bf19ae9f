"""Builds a ready ModelRunner from a WorkerConfig: model, KV pool, attention backend.

Used by the server, and usable in-process (tests, benchmarks) without gRPC.
"""

from __future__ import annotations

import time
import uuid

import structlog
import torch

from cbserve.worker.v1 import worker_pb2
from worker_svc.attention import select_backend
from worker_svc.compute.cpu_features import cpu_flags, cpu_name
from worker_svc.compute.model_shapes import read_projection_shapes
from worker_svc.compute.selection import select_path
from worker_svc.compute.weight_source import read_weight_source
from worker_svc.config import WorkerConfig
from worker_svc.heap_policy import applied_heap_policy
from worker_svc.kv_pool import KVPool, KVPoolSpec, dtype_name, kv_cache_dtype
from worker_svc.lora.loading import enable_lora, lora_description
from worker_svc.model_loader import (
    has_attention_sinks,
    load_model,
    own_forward_serves,
    resolve_device,
)
from worker_svc.model_runner import ModelRunner
from worker_svc.shared_kv_memory import shared_pool_available
from worker_svc.speculation.row_cost import measure_draft_row_cost
from worker_svc.wait_policy import applied_policy
from worker_svc.worker import Worker, pool_blocks

log = structlog.get_logger("worker_svc.startup")


def build_worker(config: WorkerConfig) -> Worker:
    """Load everything; raises ModelLoadError, BackendUnavailableError,
    ComputePathUnavailableError or ValueError.

    Call it on the thread that will run the forward passes: torch's intra-op
    thread count (OpenMP) is a per-thread setting there.
    """
    if config.model_impl == "null":
        from worker_svc.null.worker import build_null_worker  # no weights, no KV memory

        return build_null_worker(config)
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    device = resolve_device(config.device)
    path, path_choice = select_path(
        config.dtype,
        device.type,
        cpu_flags(),
        own_forward=own_forward_serves(config.model, config.model_impl),
        # auto times its candidates on these shapes at a CPU's first start (compute/auto_choice.py).
        shapes=read_projection_shapes(config.model) if config.dtype == "auto" else None,
        weights=read_weight_source(config.model) if config.dtype == "auto" else None,
    )
    loaded = load_model(config.model, path, device, config.model_impl, compile=config.compile)
    if config.compile:
        started = time.perf_counter()
        loaded.model.warm_up(loaded.num_kv_heads, loaded.head_dim, loaded.dtype)
        log.info("forward_compiled", seconds=round(time.perf_counter() - started, 1))
    processor = _processor(device)
    kv_dtype = kv_cache_dtype(config.kv_cache_dtype, loaded.dtype, loaded.compute_path, device.type)
    backend, why = select_backend(
        config.attention_backend,
        device,
        loaded.dtype,
        config.block_size,
        loaded.head_dim,
        kv_dtype=kv_dtype,
        sinks=has_attention_sinks(loaded.model),
    )
    spec = KVPoolSpec(
        num_layers=loaded.num_layers,
        num_kv_heads=loaded.num_kv_heads,
        head_dim=loaded.head_dim,
        block_size=config.block_size,
        dtype=kv_dtype,
    )
    shared = config.kv_pool_shared and config.kv_transfer_shm and shared_pool_available()
    pool = KVPool(spec, pool_blocks(config, spec), device, shared=shared)
    log.info(
        "worker_built",
        model=loaded.name,
        compute_path=loaded.compute_path,
        compute_path_choice=path_choice,
        model_impl=loaded.model_impl,
        architecture=loaded.architecture.name if loaded.architecture else None,
        compiled=config.compile,
        native_decode=native_decode_status(loaded.model),
        weights_on_huge_pages=getattr(loaded.model, "block_weights_on_huge_pages", None),
        processor=processor,
        threads=torch.get_num_threads(),
        device=str(device),
        backend=backend.name,
        backend_choice=why,
        kv_blocks=pool.num_blocks,
        kv_bytes=pool.num_bytes,
        kv_pool_shared=pool.shared_memory is not None,
        kv_pool_huge_pages=pool.huge_pages,
        kv_cache_dtype=dtype_name(kv_dtype),
        openmp_wait_policy=applied_policy(),
        malloc_policy=applied_heap_policy(),
    )
    runner = ModelRunner(loaded, pool, backend)
    if config.lora_limits is not None:
        slots = enable_lora(runner, config.lora_limits)
        log.info("lora_slots", slots=slots.num_slots - 1, max_rank=slots.max_rank)
    # Timed where a decode step is a few milliseconds (the native step); elsewhere the
    # scheduler's fit starts from its default and learns from the steps it sees.
    draft_row_cost = 0.0
    if native_decode_status(loaded.model) == "native decode steps":
        draft_row_cost = measure_draft_row_cost(runner)
        log.info("draft_row_cost", share_of_a_decode_step=round(draft_row_cost, 4))
    description = worker_pb2.WorkerDescription(
        model_name=loaded.name,
        dtype=loaded.compute_path,
        device=str(device),
        num_kv_blocks=pool.num_blocks,
        block_size=config.block_size,
        max_model_len=loaded.max_model_len,
        vocab_size=loaded.vocab_size,
        attention_backend=backend.name,
        instance_id=uuid.uuid4().hex,
        model_impl=loaded.model_impl,
        processor=processor,
        accepts_deferred_masks=True,
        accepts_draft_tokens=True,
        accepts_constrained_drafts=True,
        draft_row_cost=draft_row_cost,
        **lora_description(config.lora_limits),
    )
    return Worker(runner, description, torch.get_num_threads())


def native_decode_status(model) -> str:
    own = getattr(model, "model", model)  # a CompiledForward wraps the own model
    return getattr(own, "native_decode_status", "off: not the q4_1 own forward")


def _processor(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()
