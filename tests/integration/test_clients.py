"""The client examples against the session's stack (it only reads from it).

examples/python_client.py must run and print what cbserve.Client gets for the same
requests. examples/node/generate.js is a plain gRPC client in another language, built
from the .proto file alone (@grpc/proto-loader, no generated code): for one greedy
request it must stream exactly the text the Python client gets, and exit non-zero on a
gRPC error. Node.js and npm are required: without them these tests fail, they do not skip.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cbserve.client import Client

ROOT = Path(__file__).resolve().parents[2]
PYTHON_EXAMPLE = ROOT / "examples" / "python_client.py"
NODE_EXAMPLE = ROOT / "examples" / "node"
NODE_MIN_VERSION = (18, 3)  # node:util parseArgs
RUN_TIMEOUT_S = 300
REQUEST_TIMEOUT_S = 120
EXAMPLE_MAX_TOKENS = 16
GREEDY_TOKENS = 16
PROMPT = "The capital of France is"
CHAT_PROMPT = "What is the capital of France?"


def _run(argv: list[str], timeout_s: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=False
    )


def test_python_example_prints_what_the_client_gets(stack):
    ran = _run(
        [
            sys.executable,
            str(PYTHON_EXAMPLE),
            "--server",
            stack.address,
            "--max-tokens",
            str(EXAMPLE_MAX_TOKENS),
        ]
    )
    assert ran.returncode == 0, ran.stderr

    # The same requests as the example makes (keep in step with examples/python_client.py).
    with Client(stack.address) as client:
        chat = client.complete(
            chat=[("user", CHAT_PROMPT)],
            temperature=0.0,
            max_tokens=EXAMPLE_MAX_TOKENS,
            timeout=REQUEST_TIMEOUT_S,
        )
        completion = client.complete(
            "Once upon a time",
            temperature=0.8,
            seed=7,
            max_tokens=EXAMPLE_MAX_TOKENS,
            timeout=REQUEST_TIMEOUT_S,
        )
        info = client.model_info()

    assert chat.text and completion.text
    assert ran.stdout.startswith(f"chat: {chat.text}\n"), ran.stdout
    assert f"\ncompletion: {completion.text!r}\n" in ran.stdout, ran.stdout
    usage = completion.usage
    assert (
        f"\nusage: finish_reason={completion.finish_reason} "
        f"prompt_tokens={usage.prompt_tokens} completion_tokens={usage.completion_tokens} "
    ) in ran.stdout, ran.stdout
    assert f"\nmodel: {info.model_name} max_model_len={info.max_model_len} " in ran.stdout
    assert ran.stdout.endswith(f"workers={info.num_workers}\n"), ran.stdout


@functools.cache
def _node_client() -> tuple[str, str]:
    """(node, generate.js) with the example's locked dependencies installed by `npm ci`."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} not found on PATH: the Node.js client example needs "
            f"Node.js >= {'.'.join(map(str, NODE_MIN_VERSION))} and npm "
            "(e.g. apt-get install nodejs npm)",
            pytrace=False,
        )
    node = shutil.which("node")
    version = _run([node, "--version"], timeout_s=60).stdout.strip()
    parts = tuple(int(part) for part in version.lstrip("v").split(".")[:2])
    if parts < NODE_MIN_VERSION:
        pytest.fail(f"node {version} is too old for examples/node (needs >= 18.3)", pytrace=False)
    # npm ci installs exactly package-lock.json (and fails if package.json disagrees);
    # --prefer-offline reuses npm's cache, so a second run needs no network.
    installed = _run(
        [
            shutil.which("npm"),
            "ci",
            "--prefix",
            str(NODE_EXAMPLE),
            "--no-audit",
            "--no-fund",
            "--prefer-offline",
            "--loglevel=error",
        ]
    )
    if installed.returncode != 0:
        pytest.fail(f"npm ci in examples/node failed:\n{installed.stderr}", pytrace=False)
    return node, str(NODE_EXAMPLE / "generate.js")


def _node_generate(address: str, *args: str) -> subprocess.CompletedProcess:
    node, script = _node_client()
    return _run(
        [node, script, "--server", address, "--timeout", str(REQUEST_TIMEOUT_S), *args],
        timeout_s=REQUEST_TIMEOUT_S + 60,
    )


@pytest.mark.parametrize("chat", [False, True], ids=["prompt", "chat"])
def test_node_client_streams_what_the_python_client_gets(stack, chat):
    prompt = CHAT_PROMPT if chat else PROMPT
    greedy = {"temperature": 0.0, "max_tokens": GREEDY_TOKENS, "ignore_eos": True}
    flags = ["--temperature", "0", "--max-tokens", str(GREEDY_TOKENS), "--ignore-eos"]

    ran = _node_generate(stack.address, *flags, *(["--chat"] if chat else []), prompt)
    assert ran.returncode == 0, ran.stderr

    source = {"chat": [("user", prompt)]} if chat else {"prompt": prompt}
    with Client(stack.address) as client:
        expected = client.complete(timeout=REQUEST_TIMEOUT_S, **source, **greedy)
    assert len(expected.token_ids) == GREEDY_TOKENS
    assert expected.text.strip()
    assert ran.stdout == expected.text + "\n"
    assert "[LENGTH] request_id=" in ran.stderr, ran.stderr
    assert f" completion_tokens={GREEDY_TOKENS} " in ran.stderr, ran.stderr


def test_node_client_exits_non_zero_on_a_grpc_error(stack):
    ran = _node_generate(stack.address, "--temperature", "500", PROMPT)
    assert ran.returncode == 1, (ran.stdout, ran.stderr)
    assert ran.stdout == ""
    assert "generate.js: INVALID_ARGUMENT: sampling.temperature" in ran.stderr, ran.stderr
