"""`cbserve bench scheduler`: how many tokens a second one scheduler streams, and at
what CPU, with null workers; beside it the floor of bare gRPC streaming and the costs of
the scheduler's parts alone (its core loop, detokenization, structured outputs)."""
