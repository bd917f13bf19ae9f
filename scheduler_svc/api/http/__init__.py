"""The OpenAI-compatible HTTP front of the scheduler (FastAPI on uvicorn).

It only translates: an OpenAI request becomes cbserve.v1.GenerateRequests that go
through GenerationService.generate, the same path as gRPC's Generate (validation,
tokenization, placement, scheduling, stop handling), and the responses are shaped
back into OpenAI's JSON and server-sent events.
"""
