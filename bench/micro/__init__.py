"""Micro-benchmarks of the worker, in process: its kernels (projections, block-quantized
matmuls, paged attention) and whole steps of the model, path against path."""
