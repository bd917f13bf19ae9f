"""The `cbserve` command: generate, info, drain, serve.

cbserve generate "Once upon a time" --max-tokens 64
cbserve generate --chat "What is the capital of France?"
cbserve info
cbserve drain --worker HOST:PORT   # move a worker's requests, with their KV, to the others
cbserve serve            # the same as `make run`
cbserve bench --baselines static,hf   # the serving benchmark (bench/, in a source checkout)
cbserve bench scheduler               # the scheduler's capacity, with null workers
cbserve --version
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc
from google.protobuf.descriptor import FieldDescriptor

from cbserve.v1 import generation_pb2 as pb
from common.defaults import DEFAULT_SCHEDULER_PORT

DEFAULT_SERVER = os.environ.get("CBSERVE_SERVER", f"localhost:{DEFAULT_SCHEDULER_PORT}")

_FLOATS = (FieldDescriptor.CPPTYPE_FLOAT, FieldDescriptor.CPPTYPE_DOUBLE)
# The client's numbers (cbserve.v1.SamplingParams), each a flag of its own name -> its
# type; a flag left out is not sent (server default). The lists and the switch are
# spelled in _add_generate.
SAMPLING_FLAGS = {
    field.name: float if field.cpp_type in _FLOATS else int
    for field in pb.SamplingParams.DESCRIPTOR.fields
    if not field.is_repeated and field.cpp_type != FieldDescriptor.CPPTYPE_BOOL
}


def _add_connection(parser: argparse.ArgumentParser) -> None:
    """How to reach the scheduler: its address, its key, and TLS."""
    parser.add_argument(
        "--server", default=DEFAULT_SERVER, help=f"scheduler address ({DEFAULT_SERVER})"
    )
    parser.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="the scheduler's --api-key, sent as `authorization: Bearer KEY` "
        "(default: $CBSERVE_API_KEY, its first key when comma-separated)",
    )
    parser.add_argument(
        "--tls-ca",
        default=None,
        metavar="PEM",
        help="speak TLS to a scheduler started with --tls-cert, trusting this CA",
    )


def _client(args: argparse.Namespace):
    from cbserve.client import Client
    from cbserve.connection import api_key_from_env

    api_key = args.api_key if args.api_key is not None else api_key_from_env()
    try:
        return Client(args.server, api_key=api_key, tls_ca=args.tls_ca)
    except ValueError as error:  # an unusable key, or a --tls-ca file that is not a CA
        raise SystemExit(f"cbserve: {error}") from None


def _add_generate(subparsers) -> None:
    parser = subparsers.add_parser("generate", help="stream a reply to the terminal")
    parser.add_argument("prompt", help="the prompt (or the user message with --chat)")
    parser.add_argument("--chat", action="store_true", help="apply the model's chat template")
    parser.add_argument("--system", default=None, help="system message (with --chat)")
    _add_connection(parser)
    for name, kind in SAMPLING_FLAGS.items():
        parser.add_argument("--" + name.replace("_", "-"), type=kind, default=None)
    # A terminal user wants a repeatable, sensible answer: greedy unless asked to
    # sample. The API's default stays vLLM's (1.0) for programs.
    parser.set_defaults(temperature=0.0)
    parser.add_argument(
        "--stop", action="append", default=None, help="stop string; repeat for several"
    )
    parser.add_argument(
        "--stop-token-id", action="append", type=int, default=None, dest="stop_token_ids"
    )
    parser.add_argument("--ignore-eos", action="store_true", default=None)
    parser.add_argument(
        "--lora-name",
        default="",
        metavar="NAME",
        help="generate with this LoRA adapter of the server's (GenerateRequest.lora_name; "
        "`cbserve info` lists them); default: the base model",
    )
    parser.add_argument("--timeout", type=float, default=None, help="deadline in seconds")
    parser.add_argument("--usage", action="store_true", help="print token counts and finish reason")


def _generate(args: argparse.Namespace) -> int:
    from cbserve.client import Completion

    sampling = {
        field.name: getattr(args, field.name) for field in pb.SamplingParams.DESCRIPTOR.fields
    }
    sampling = {name: value for name, value in sampling.items() if value is not None}
    if args.chat:
        turns = ([("system", args.system)] if args.system else []) + [("user", args.prompt)]
        source = {"chat": turns}
    else:
        source = {"prompt": args.prompt}
    completion = Completion()
    with _client(args) as client:
        try:
            replies = client.generate(
                timeout=args.timeout, lora_name=args.lora_name, **source, **sampling
            )
            for response in replies:
                completion.add(response)
                sys.stdout.write(response.text)
                sys.stdout.flush()
        except grpc.RpcError as error:
            print(f"\ncbserve: {error.code().name}: {error.details()}", file=sys.stderr)
            return 1
    sys.stdout.write("\n")
    if args.usage:
        usage = completion.usage
        print(
            f"[{completion.finish_reason}] prompt_tokens={usage.prompt_tokens} "
            f"completion_tokens={usage.completion_tokens} "
            f"cached_prompt_tokens={usage.cached_prompt_tokens}",
            file=sys.stderr,
        )
    return 0


def _info(args: argparse.Namespace) -> int:
    with _client(args) as client:
        try:
            print(client.model_info())
        except grpc.RpcError as error:
            print(f"cbserve: {error.code().name}: {error.details()}", file=sys.stderr)
            return 1
    return 0


def _add_drain(subparsers) -> None:
    parser = subparsers.add_parser(
        "drain",
        help="move every request off one worker (with its KV) to the others, then take "
        "that worker out of service",
    )
    parser.add_argument(
        "--worker",
        required=True,
        metavar="HOST:PORT",
        help="the worker to drain, as the scheduler dials it (cbserve info lists them)",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="deadline in seconds (600)")
    _add_connection(parser)


def _drain(args: argparse.Namespace) -> int:
    from cbserve.connection import api_key_from_env, call_metadata, open_channel
    from cbserve.v1 import admin_pb2, admin_pb2_grpc

    api_key = args.api_key if args.api_key is not None else api_key_from_env()
    try:
        metadata = call_metadata(api_key)
        channel = open_channel(args.server, None, args.tls_ca, asyncio=False)
    except ValueError as error:
        raise SystemExit(f"cbserve: {error}") from None
    with channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        try:
            reply = stub.DrainWorker(
                admin_pb2.DrainWorkerRequest(address=args.worker),
                timeout=args.timeout,
                metadata=metadata,
            )
        except grpc.RpcError as error:
            print(f"cbserve: {error.code().name}: {error.details()}", file=sys.stderr)
            return 1
    print(
        f"drained {args.worker} in {reply.seconds:.2f} s: "
        f"{reply.requests_moved} requests moved with their KV "
        f"({reply.blocks_moved} blocks, {reply.bytes_moved} bytes, "
        f"{reply.tokens_not_recomputed} tokens not recomputed), "
        f"{reply.requests_recomputed} recomputed, {reply.requests_requeued} requeued"
    )
    return 0


def _bench_found() -> bool:
    """bench/ lives in the source tree, beside the installed packages: from the
    `cbserve` script it is importable only once the checkout is on sys.path."""
    import importlib.util

    if importlib.util.find_spec("bench") is None:
        from common.defaults import REPO_ROOT

        if not (REPO_ROOT / "bench" / "commands.py").exists():
            return False
        sys.path.insert(0, str(REPO_ROOT))
    return True


def package_version() -> str:
    """The installed distribution's version (pyproject.toml's, as pip recorded it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cbserve")
    except PackageNotFoundError:
        # Run from a checkout that was never installed (`python -m cbserve.cli`).
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["bench"] and _bench_found():
        # `bench scheduler`, `bench accuracy`: flags of their own (the table is shared
        # with `python -m bench`); `cbserve bench`'s parser stays the serving benchmark's.
        from bench import commands

        code = commands.run(given[1:], prog="cbserve bench")
        if code is not None:
            return code
    parser = argparse.ArgumentParser(prog="cbserve", description="cbserve command line")
    parser.add_argument("--version", action="version", version=f"cbserve {package_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_generate(subparsers)
    info = subparsers.add_parser("info", help="print the served model's limits")
    _add_connection(info)
    _add_drain(subparsers)
    from cbserve.launch import add_serve_arguments

    add_serve_arguments(
        subparsers.add_parser("serve", help="run scheduler and worker here (make run)")
    )
    if _bench_found():
        from bench.commands import SUBCOMMANDS, listing
        from bench.serving import options as bench_options

        bench_options.add_arguments(
            subparsers.add_parser(
                "bench",
                help="serving benchmark (like `vllm bench serve`); also `cbserve bench "
                + "|".join(SUBCOMMANDS)
                + " --help`",
                epilog=listing("cbserve bench"),
                formatter_class=argparse.RawDescriptionHelpFormatter,
            )
        )
    args = parser.parse_args(argv)
    if args.command == "generate":
        return _generate(args)
    if args.command == "info":
        return _info(args)
    if args.command == "drain":
        return _drain(args)
    if args.command == "bench":
        from bench.serving.serve import run

        return run(args, bench_options.recorded_command(["cbserve", *given]))
    from cbserve.launch import serve

    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
