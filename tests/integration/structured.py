"""What the structured-output tests share: a tool with a bounded schema, and a greedy
chat call through the official `openai` client."""

from __future__ import annotations

# Bounded strings and lists: a small model that likes to ramble still has to close them.
NAME = {"type": "string", "maxLength": 12}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": NAME, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
MAX_TOKENS = 64


def chat(api, text: str, max_tokens: int = MAX_TOKENS, **fields):
    return api.chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": text}],
        temperature=0.0,
        max_tokens=max_tokens,
        **fields,
    )
