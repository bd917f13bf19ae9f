"""The workers: one engine (step loop) per worker, the pool that places requests,
discovery, liveness, and what happens to the requests of a lost worker.
"""
