"""The suite's two tiers, and the guard that keeps the fast one fast.

`make test` runs everything but `slow`. `make test-fast` (pytest --fast) runs only
the tests that start no process and load no model weights: the scheduler on its fake
worker, configs, codecs, translation, the benchmark's pure parts. Two markers say
what a test needs:

- `process`: it starts a process (a stack of real worker and scheduler processes, a
  CLI run with `python -m`, docker-compose, kubectl, ...; not the millisecond tools
  of CHEAP_COMMANDS);
- `model`: it needs the model's weights, loaded in the test process (transformers
  or the worker's own loader) or in a worker it starts.

Every test under tests/integration/ gets both; a test that asks for one of the
fixtures in MODEL_FIXTURES gets `model`; any other test marks itself. Nothing has to
be remembered for the fast tier to stay right: under --fast, a test that starts a
process or opens a weights file anyway fails, naming the marker it lacks. Building a
kernel is not starting a process in this sense (`_builds_a_kernel`): the fast tier
stays green from a cold kernel cache.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

FAST_MARKEXPR = "not slow and not process and not model"
TESTS_DIR = Path(__file__).resolve().parent
# Whole directories whose every test starts a real stack on the model.
STACK_DIRS = (TESTS_DIR / "integration",)
# Fixtures that load the model's weights in the test process.
MODEL_FIXTURES = frozenset({"loaded_model", "reference_model", "make_runner"})
PROCESS_EVENTS = frozenset(
    {
        "subprocess.Popen",
        "os.posix_spawn",
        "os.spawn",
        "os.system",
        "os.fork",
        "os.forkpty",
        "os.exec",
    }
)
# Commands that run for milliseconds and are no part of what is tested: the test CA's
# certificates (tests/tls_certs.py), the stdlib's platform.processor() (`uname -p`),
# matplotlib's font lookup the first time it runs in a fresh home (`fc-list`), and
# ctypes.util.find_library's `ldconfig -p` (huge_pages.py and model_loader.py find libc).
CHEAP_COMMANDS = frozenset({"openssl", "uname", "fc-list", "ldconfig"})
WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth")


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        help=f"the fast tier: only tests marked neither process nor model (-m '{FAST_MARKEXPR}')"
        "; a test that starts a process or loads weights anyway fails",
    )


def pytest_configure(config) -> None:
    if config.getoption("fast"):
        config.option.markexpr = FAST_MARKEXPR
        _Guard.install()


def pytest_ignore_collect(collection_path, config) -> bool | None:
    """Under --fast, STACK_DIRS are not even imported: all of them is process and model."""
    if config.getoption("fast") and Path(collection_path).resolve() in STACK_DIRS:
        return True
    return None


def mark_tiers(items) -> None:
    """The markers this module's rules give (tests/conftest.py calls it at collection)."""
    for item in items:
        path = Path(str(item.path)).resolve()
        if any(path.is_relative_to(directory) for directory in STACK_DIRS):
            item.add_marker(pytest.mark.process)
            item.add_marker(pytest.mark.model)
        elif MODEL_FIXTURES.intersection(item.fixturenames):
            item.add_marker(pytest.mark.model)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _Guard.seen = []
    _Guard.active = _Guard.installed
    try:
        yield
    finally:
        _Guard.active = False


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if _Guard.seen and report.when == "call" and not report.failed:
        report.outcome = "failed"
        report.longrepr = "\n".join(_Guard.seen)


def _builds_a_kernel(popen_args: tuple) -> bool:
    """The C compiler building one of the worker's kernels into its cache
    (worker_svc/native_build.py): allowed in the fast tier. The kernel tests are pure
    functions of the build; the five builds the tier makes from a cold cache cost about
    3 s of compiler CPU once per machine and source (measured on a Zen 4), a warm cache
    nothing; and a pre-build list would go stale the day a kernel is added, which a
    warm cache hides: the tier would turn red only on the next fresh machine, as it did."""
    from worker_svc.native_build import cache_dir, compiler

    argv = popen_args[1] if len(popen_args) > 1 else None
    if not isinstance(argv, list | tuple) or not argv or str(argv[0]) != compiler():
        return False
    cache = str(cache_dir())
    return any(str(arg).startswith(cache) for arg in argv[1:])


class _Guard:
    """Records (and refuses, where it can) what a fast-tier test must not do."""

    installed = False
    active = False
    seen: list[str] = []

    @classmethod
    def install(cls) -> None:
        cls.installed = True
        sys.addaudithook(cls._audit)
        # The Rust reader of safetensors files raises no audit event: wrap its entry
        # point before anything imports it (transformers and safetensors.torch bind it
        # by name at their import).
        import safetensors

        opener = safetensors.safe_open

        def guarded_safe_open(filename, *args, **kwargs):
            cls._refuse("model", f"opens weights {filename}")
            return opener(filename, *args, **kwargs)

        safetensors.safe_open = guarded_safe_open

    @classmethod
    def _audit(cls, event: str, args: tuple) -> None:
        if not cls.active:
            return
        if event == "subprocess.Popen" and (
            Path(str(args[0])).name in CHEAP_COMMANDS or _builds_a_kernel(args)
        ):
            return
        if event in PROCESS_EVENTS:
            command = args[1] if event == "subprocess.Popen" and len(args) > 1 else args
            cls._refuse("process", f"starts a process ({event}: {command})")
        elif (
            event == "open"
            and isinstance(args[0], str | Path)
            and str(args[0]).endswith(WEIGHT_SUFFIXES)
        ):
            cls._refuse("model", f"opens weights {args[0]}")

    @classmethod
    def _refuse(cls, marker: str, what: str) -> None:
        cls.active = False  # the failure's own reporting may open files
        message = (
            f"--fast: this test {what}; mark it @pytest.mark.{marker} "
            "(see tests/tiers.py) or keep it out of the fast tier"
        )
        cls.seen.append(message)
        raise RuntimeError(message)
