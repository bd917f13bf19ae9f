"""POST /v1/completions/render and /v1/chat/completions/render: the token ids a request
would run with, without running it (vLLM's render routes, which llm-d's endpoint
picker calls to tokenize with the engine's own tokenizer and chat template).

The body is the generation route's, translated exactly as that route translates it
(translate.py) and tokenized by the same function the one request path uses
(api/prompt.py): chat template, tools and all. The answer is vLLM's GenerateRequest
shape: the chat route answers one, the completions route a list (one per prompt):

    {"request_id": ..., "token_ids": [...], "features": null,
     "sampling_params": {...}, "model": ..., "stream": false, "stream_options": null,
     "cache_salt": null, "priority": 0, "kv_transfer_params": null}

sampling_params holds the sampling fields the request set, under cbserve's proto names
(most are vLLM's: max_tokens, temperature, top_p, top_k, seed, stop, ...).
"""

from __future__ import annotations

from google.protobuf.json_format import MessageToDict

from scheduler_svc.api.http.protocol import SamplingFields
from scheduler_svc.api.http.translate import Choice
from scheduler_svc.api.limits import ModelLimits
from scheduler_svc.api.prompt import prompt_token_ids
from scheduler_svc.api.tokenizer import Tokenizer


def render(
    body: SamplingFields,
    choices: list[Choice],
    tokenizer: Tokenizer,
    limits: ModelLimits,
    model: str,
) -> list[dict]:
    """One GenerateRequest-shaped dict per prompt (the n copies of a prompt share it)."""
    rendered: list[dict] = []
    seen_prompts: set[int] = set()
    for choice in choices:
        if choice.prompt_index in seen_prompts:
            continue
        seen_prompts.add(choice.prompt_index)
        request = choice.request
        rendered.append(
            {
                "request_id": request.request_id,
                "token_ids": prompt_token_ids(request, tokenizer, limits),
                "features": None,
                "sampling_params": MessageToDict(
                    request.sampling, preserving_proto_field_name=True
                ),
                "model": model,
                "stream": body.stream,
                "stream_options": None,
                "cache_salt": None,
                "priority": request.priority,
                "kv_transfer_params": None,
            }
        )
    return rendered
