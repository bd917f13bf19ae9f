"""The output side: token ids to text (detokenizer), stop conditions, and the
per-request processor that turns a step's tokens into what the client streams.
"""
