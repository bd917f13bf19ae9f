"""`--model-impl null`: the real worker with no model, for measuring the scheduler.

It loads no weights and allocates no KV pool; it reads only what it must describe
(worker.py: the model's config.json for vocabulary, length and KV shape; its tokenizer
for which ids are ordinary text and which is EOS). Everything else is the real
worker's: the server, the reading of each plan into a step, and the runner's
bookkeeping (ModelRunner's sequence states and block tables), so the worker's own
per-step Python is in what is measured. Only the forward is replaced (runner.py):
each step samples real token ids (sampler.py) and is answered no sooner than the
simulated step time after it arrived.
"""
