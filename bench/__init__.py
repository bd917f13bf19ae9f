"""Benchmarks: the cbserve serving benchmark and transformers' static-batch baseline."""
