"""Structured outputs in the scheduler: constraints, their compiled grammars, a
matcher per request, and the per-step allowed-token bitmask sent to the worker.

Built on llguidance (no torch; it reads tokenizer.json): a grammar compiles in well
under a millisecond for typical schemas, a matcher is a cheap copy of the compiled
one, and a mask row costs a few microseconds per step.
"""
