"""Scheduler limits and policies, validated once at construction, one module per part
of the process: the core (core.py), the waits on workers and clients (faults.py),
the process itself (process.py) and the edge's doors (edge.py).

They are also `python -m scheduler_svc`'s flags (common.cli_config): each `flag(...)`
field of SCHEDULER_CONFIGS is one, with the variable CBSERVE_SCHEDULER_<FLAG>; those
marked `forwarded_by` are `cbserve serve`'s (and `cbserve bench`'s) too.
"""

from scheduler_svc.config.core import BATCHING_MODES, SchedulerConfig
from scheduler_svc.config.edge import EdgeConfig
from scheduler_svc.config.faults import MIN_WORKER_TIMEOUT_S, FaultConfig
from scheduler_svc.config.process import ENV_PREFIX, MAX_API_PROCESSES, ProcessConfig

# Every config `python -m scheduler_svc` builds from its flags, in the order of its help.
SCHEDULER_CONFIGS = (ProcessConfig, SchedulerConfig, FaultConfig, EdgeConfig)

__all__ = [
    "BATCHING_MODES",
    "ENV_PREFIX",
    "MAX_API_PROCESSES",
    "MIN_WORKER_TIMEOUT_S",
    "SCHEDULER_CONFIGS",
    "EdgeConfig",
    "FaultConfig",
    "ProcessConfig",
    "SchedulerConfig",
]
