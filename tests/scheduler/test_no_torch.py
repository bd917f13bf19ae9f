"""The scheduler process must never load torch or transformers, even indirectly."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import scheduler_svc

pytestmark = pytest.mark.process

REPO_ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("torch", "transformers")


def test_importing_every_scheduler_module_loads_neither_torch_nor_transformers():
    # Every module of every sub-package, not only the top level.
    modules = sorted(
        info.name for info in pkgutil.walk_packages(scheduler_svc.__path__, prefix="scheduler_svc.")
    )
    assert "scheduler_svc.core.scheduler" in modules
    script = "\n".join(
        [
            "import importlib, sys",
            f"for name in {modules!r}:",
            "    importlib.import_module(name)",
            f"loaded = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})",
            "print(loaded)",
            "sys.exit(1 if loaded else 0)",
        ]
    )
    completed = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
