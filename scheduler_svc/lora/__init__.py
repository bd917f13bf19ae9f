"""LoRA adapters on the scheduler side: the registry of names a request may use
(registry.py). Which worker holds which adapter is the core's (core/adapter_residency.py)."""
