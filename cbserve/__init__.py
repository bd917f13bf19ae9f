"""cbserve: the Python client, the `cbserve` command and the local launcher.

    from cbserve import Client
    with Client("localhost:50051") as client:
        for chunk in client.generate("Hello", max_tokens=32):
            print(chunk.text, end="", flush=True)

Generated gRPC modules live beside it: `cbserve.v1` (the public API) and
`cbserve.worker.v1` (the scheduler-worker protocol).
"""

from __future__ import annotations

__all__ = ["AsyncClient", "Client", "Completion", "RetryPolicy"]


def __getattr__(name: str):
    # Lazy, so that importing the generated modules does not pull in the client.
    if name in __all__:
        from cbserve import client

        return getattr(client, name)
    raise AttributeError(name)
