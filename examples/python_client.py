"""The cbserve Python client in three calls: a streamed chat reply, a completion with its
usage, and the model's limits.

    make run                                   # in one terminal
    .venv/bin/python examples/python_client.py [--server localhost:50051]
"""

from __future__ import annotations

import argparse
import sys

import grpc

from cbserve import Client


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="localhost:50051", help="scheduler HOST:PORT")
    parser.add_argument("--max-tokens", type=int, default=48, help="tokens per reply")
    args = parser.parse_args(argv)

    with Client(args.server) as client:
        try:
            # 1. A chat reply, streamed as it is produced. temperature=0 is greedy, so the
            #    reply is the same every time; the chat template is applied by the server.
            print("chat: ", end="", flush=True)
            for chunk in client.generate(
                chat=[("user", "What is the capital of France?")],
                temperature=0.0,
                max_tokens=args.max_tokens,
                timeout=60,
            ):
                print(chunk.text, end="", flush=True)
            print()

            # 2. A whole completion at once: sampled, repeatable thanks to the seed.
            completion = client.complete(
                "Once upon a time",
                temperature=0.8,
                seed=7,
                max_tokens=args.max_tokens,
                timeout=60,
            )
            usage = completion.usage
            print(f"completion: {completion.text!r}")
            print(
                f"usage: finish_reason={completion.finish_reason} "
                f"prompt_tokens={usage.prompt_tokens} "
                f"completion_tokens={usage.completion_tokens} "
                f"cached_prompt_tokens={usage.cached_prompt_tokens}"
            )

            # 3. What the server runs.
            info = client.model_info()
            print(
                f"model: {info.model_name} max_model_len={info.max_model_len} "
                f"kv_capacity_tokens={info.kv_capacity_tokens} workers={info.num_workers}"
            )
        except grpc.RpcError as error:
            print(f"\nerror: {error.code().name}: {error.details()}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
