"""The HTTP front fuzzed from its own /openapi.json by schemathesis, over a live stack.

A scheduler with the HTTP front and one null worker (`--model-impl null`: the default
model's description and tokenizer, real token ids, no weights), so that a thousand
generated requests cost seconds. Every answer must be no server error, a status the
document declares for its route, of a declared content type and in the declared
schema; a method a route does not serve must be answered 405 with `Allow` (the
coverage phase sends each one). The KV pool is small, so that no generated max_tokens
makes a request long. With --enable-lora (a real float32 worker: the null one holds no
adapters), the adapter routes and /v1/models are fuzzed on their own.

schemathesis runs here through its engine (what its CLI runs), not its pytest plugin:
the plugin's fixture-loaded schemas read a node attribute pytest 9.2 no longer has.
"""

from __future__ import annotations

import pytest
import schemathesis
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import Status, events, from_schema

from cbserve.local_stack import LocalStack

pytestmark = pytest.mark.process

CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "unsupported_method",
)
# 8 blocks of 16 tokens: no request holds more than 128 tokens.
NULL_WORKER_ARGS = ["--model-impl", "null", "--num-kv-blocks", "8"]
# Fuzzing examples per route; the coverage phase adds its own (about 200 a route).
EXAMPLES_PER_ROUTE = 10
# Fixed, so that a failure is reproduced by the next run.
SEED = 20261128


def _config() -> SchemathesisConfig:
    return SchemathesisConfig.from_dict(
        {
            "seed": SEED,
            "generation": {"max-examples": EXAMPLES_PER_ROUTE},
            "phases": {
                "examples": {"enabled": False},
                "coverage": {"enabled": True},
                "fuzzing": {"enabled": True},
                "stateful": {"enabled": False},
            },
            "checks": {"enabled": False, **{name: {"enabled": True} for name in CHECKS}},
        }
    )


@pytest.fixture(scope="module")
def front():
    with LocalStack(http_port=0, worker_args=NULL_WORKER_ARGS) as stack:
        yield stack


def _failures(finished: events.ScenarioFinished) -> list[str]:
    recorder = finished.recorder
    found = []
    for case_id, checks in recorder.checks.items():
        for check in checks:
            if check.status == Status.FAILURE:
                case = recorder.cases[case_id].value
                info = check.failure_info
                detail = info.failure.title if info is not None else ""
                found.append(f"{case.method} {case.path} {check.name}: {detail}")
    return found


def test_every_answer_is_what_the_document_declares(front):
    _fuzz(schemathesis.openapi.from_url(f"{front.http_url}/openapi.json", config=_config()))


@pytest.fixture(scope="module")
def lora_front():
    # The null worker has no adapter slots: a float32 worker, and only the routes that
    # generate nothing are fuzzed.
    lora = ["--enable-lora", "--max-loras", "1", "--max-lora-rank", "8"]
    worker = ["--dtype", "float32", "--num-kv-blocks", "8", *lora]
    with LocalStack(http_port=0, worker_args=worker, scheduler_args=lora) as stack:
        yield stack


@pytest.mark.model
def test_the_lora_routes_answer_what_the_document_declares(lora_front):
    schema = schemathesis.openapi.from_url(f"{lora_front.http_url}/openapi.json", config=_config())
    _fuzz(schema.include(path_regex="^/v1/(load_lora_adapter|unload_lora_adapter|models)$"))


def _fuzz(schema) -> None:
    failures: list[str] = []
    errors: list[str] = []
    checked: set[str] = set()
    methods: set[str] = set()
    for event in from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            failures += _failures(event)
            for checks in event.recorder.checks.values():
                checked.update(check.name for check in checks)
            methods.update(i.request.method for i in event.recorder.interactions.values())
        elif isinstance(event, events.NonFatalError | events.FatalError):
            errors.append(repr(getattr(event, "value", None) or event.exception))
    assert not errors, errors
    assert not failures, "\n".join(failures)
    # Every check ran on some answer, and methods the routes do not serve were sent.
    assert checked >= set(CHECKS), checked
    assert {"PUT", "DELETE", "PATCH"} <= methods, methods
