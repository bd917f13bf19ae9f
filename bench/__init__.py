"""The serving benchmark (`cbserve bench`, bench.serve) and its baselines."""
