"""The LoRA half of the pool (PoolView's adapter members) in the one process that
owns the registry: the core, or the single scheduler process.

A load is checked twice before it is answered: by the registry (the directory, its
adapter_config.json, the rank against --max-lora-rank) and, where a worker is
connected, by one worker loading it into a slot (the target modules against its
model, its own rank limit); a worker's refusal undoes the registry's entry, so an
adapter that is listed is one that loads. Requests naming an unloaded adapter are
NOT_FOUND at once; the adapter leaves each worker's slots once nothing there uses it.
"""

from __future__ import annotations

import grpc
import structlog

from common.errors import ServiceError, StartupError
from scheduler_svc.config.lora import LoraConfig
from scheduler_svc.lora.registry import AdapterInfo, AdapterRegistry

log = structlog.get_logger("scheduler.adapters")


def open_registry(lora: LoraConfig | None, served_model_name: str) -> AdapterRegistry | None:
    """The registry with --lora-modules loaded; None with LoRA off. StartupError names
    the module that cannot be served."""
    if lora is None:
        return None
    try:
        return AdapterRegistry.from_config(lora, served_model_name)
    except ServiceError as error:
        raise StartupError(f"--lora-modules: {error.message}") from None


class PoolAdapters:
    """Mixed into WorkerPool, which sets `registry` and `engines`."""

    registry: AdapterRegistry | None
    engines: dict

    @property
    def lora_enabled(self) -> bool:
        return self.registry is not None

    def adapters(self) -> list[AdapterInfo]:
        """The adapters a request may name, sorted by name (none with LoRA off)."""
        return self.registry.adapters() if self.registry is not None else []

    def adapter(self, name: str) -> AdapterInfo | None:
        """The adapter a request names; None for "" (the base). ServiceError:
        NOT_FOUND for a name not loaded, INVALID_ARGUMENT with LoRA off."""
        if not name:
            return None
        if self.registry is None:
            raise ServiceError(
                f"lora_name {name!r}: this scheduler serves no LoRA adapters "
                "(start it with --enable-lora)",
                grpc.StatusCode.INVALID_ARGUMENT,
            )
        return self.registry.get(name)

    async def load_adapter(
        self, name: str, path: str, base_model_name: str | None = None
    ) -> AdapterInfo:
        """Registers the adapter and has a connected worker load it (see the module's
        doc); raises ServiceError with the reason it cannot be served."""
        if self.registry is None:
            raise ServiceError(
                "LoRA adapters are off; start the scheduler with --enable-lora",
                grpc.StatusCode.INVALID_ARGUMENT,
            )
        info = self.registry.load(name, path, base_model_name)
        engines = [engine for engine in self.engines.values() if engine.connected]
        if engines:
            engine = min(engines, key=lambda engine: engine.load)
            try:
                await engine.load_adapter_now(info)
            except ServiceError:
                self.registry.unload(name)
                raise
        log.info("LoRA adapter loaded", adapter=name, lora_id=info.lora_id, path=info.path)
        return info

    async def unload_adapter(self, name: str) -> None:
        """Forgets the adapter (NOT_FOUND if not loaded); each worker evicts it once no
        request there uses it."""
        if self.registry is None:
            raise ServiceError(
                "LoRA adapters are off; start the scheduler with --enable-lora",
                grpc.StatusCode.INVALID_ARGUMENT,
            )
        info = self.registry.unload(name)
        for engine in self.engines.values():
            engine.retire_adapter(info.lora_id)
        log.info("LoRA adapter unloaded", adapter=name, lora_id=info.lora_id)
