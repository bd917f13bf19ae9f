"""The edge's output side: token ids to text (detokenizer), stop strings, and the
stream of text deltas a request's client reads. The token stops are the core's
(core/token_stops.py): nothing here is imported by the core.
"""
