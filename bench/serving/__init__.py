"""`cbserve bench`: the serving benchmark on ShareGPT or random prompts, its client,
its metrics and its report (table, JSON, plots), and the studies built on it (the
concurrency sweep, the HTTP front against gRPC, a small KV pool)."""
