"""The serving benchmark (`cbserve bench`, bench.serving.serve) and its baselines."""
