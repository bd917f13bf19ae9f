"""Speculative decoding on the worker: drafts proposed from a sequence's own tokens
(common/ngram.py) and verified in the step that computes them (verify.py)."""
