"""`cbserve bench`: the serving benchmark, cbserve against its peers on the same
requests (bench.harness), with its flags and its roofline; and the studies built on it:
the concurrency sweep, the HTTP front against gRPC, a small KV pool."""
