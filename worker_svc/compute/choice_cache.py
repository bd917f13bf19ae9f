"""The on-disk cache of `--dtype auto`'s measured choice, so that only a CPU's first
start with a model's shapes pays the few seconds of timing.

One JSON file per key under `$CBSERVE_COMPUTE_PATH_CACHE` (default
`~/.cache/cbserve/compute-paths`), as the kernels are cached (native_build.py). The
key is everything that can change the answer: the CPU's model name and its flags (a
cache shared between machines must never hand one CPU another's choice), the
projection shapes, the candidate paths, the thread count, the batch M timed and the
block formats the block paths were timed on.
The file repeats the key beside the choice and the figures, and a file that does not
parse, or whose key or choice does not match, is ignored (the caller measures again
and rewrites it): a cache can only ever cost a measurement, never a wrong path.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from worker_svc.compute.model_shapes import ProjectionShapes
from worker_svc.compute.path_timing import StepTime

# Bumped when what is timed changes, so that old choices are measured again (2: the
# block paths timed on the formats the model's files give them; 3: BF16 rows take the
# bf16 GEMM from bf16_gemm_from_m rows, and mixtures are timed at their active width).
FORMAT = 3


def cache_dir() -> Path:
    configured = os.environ.get("CBSERVE_COMPUTE_PATH_CACHE")
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "cbserve" / "compute-paths"


@dataclass(frozen=True)
class ChoiceKey:
    cpu: str
    flags: tuple[str, ...]  # sorted
    shapes: ProjectionShapes
    candidates: tuple[str, ...]  # sorted
    threads: int
    batch_m: int
    # (path, projections' format, head's format) of each block path timed, sorted.
    block_formats: tuple[tuple[str, str, str], ...] = ()

    def as_json(self) -> dict:
        return {**asdict(self), "format": FORMAT}

    def file(self) -> Path:
        digest = hashlib.sha256(json.dumps(self.as_json(), sort_keys=True).encode())
        return cache_dir() / f"{digest.hexdigest()[:20]}.json"


@dataclass(frozen=True)
class CachedChoice:
    path: str
    figures: dict[str, StepTime]
    measured_at: str
    file: Path


def read_choice(key: ChoiceKey) -> tuple[CachedChoice | None, str]:
    """The cached choice for `key`, or None and why not (for the start log)."""
    file = key.file()
    try:
        text = file.read_text()
    except FileNotFoundError:
        return None, "not measured yet"
    except OSError as exc:
        return None, f"unreadable: {exc}"
    try:
        stored = json.loads(text)
        if stored["key"] != json.loads(json.dumps(key.as_json())):
            return None, "another key in the file"
        figures = {
            name: StepTime(float(m1), float(batch))
            for name, (m1, batch) in stored["figures_ms"].items()
        }
        path = stored["choice"]
        if path not in key.candidates or set(figures) != set(key.candidates):
            return None, "its choice is not among the candidates"
        return CachedChoice(path, figures, str(stored["measured_at"]), file), ""
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return None, f"corrupt ({type(exc).__name__}), measured again"


def write_choice(key: ChoiceKey, path: str, figures: dict[str, StepTime]) -> Path | None:
    """Stores the choice atomically (workers starting together never read half a file);
    returns the file, or None where the cache cannot be written (the worker still runs)."""
    file = key.file()
    record = {
        "key": key.as_json(),
        "choice": path,
        "figures_ms": {name: [t.m1_ms, t.batch_ms] for name, t in figures.items()},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=file.parent, delete=False) as out:
            json.dump(record, out, indent=1)
        os.replace(out.name, file)
    except OSError:
        return None
    return file
