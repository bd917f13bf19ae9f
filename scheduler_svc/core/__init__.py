"""The core: requests, queues, KV block tables and the per-step plan.

Pure Python with no I/O: schedule() returns a plan, update_from_output() takes
what the worker computed. Nothing here knows about gRPC streams or workers.
"""
