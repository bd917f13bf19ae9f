"""The scheduler: queues, request state, paged-KV block tables, the per-step plan.

Nothing under this package imports torch; `tests/scheduler/test_no_torch.py`
keeps it that way.
"""
