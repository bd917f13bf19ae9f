"""cbserve's benchmarks, one sub-package by what each measures: serving (`cbserve
bench`: cbserve against its peers, and the studies built on it) over harness (the
requests, the timing client, the statistics and the report that every serving-style run
shares), peers (llama.cpp, transformers, any OpenAI-compatible server), scheduler
(`cbserve bench scheduler`, null workers), accuracy (`cbserve bench accuracy`), micro
(kernels and worker steps, in process) and transport (the core-to-API-process link).
bench.commands is the subcommand table that `cbserve bench` and `python -m bench` share."""
