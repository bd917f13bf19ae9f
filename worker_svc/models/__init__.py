"""The worker's model layer: architectures beside the compute paths that run them.

- `architectures/`: one declaration per family (Llama, Mistral, Qwen2, Qwen3, Gemma 3),
  with a lazy registry from a config's class name or model type;
  `declaration.py` says what a declaration holds, `config_file.py` reads config.json
  without transformers.
- `forward/`: the float forward composed from a declaration (float32, the reference;
  bfloat16; float16), torch.compile around it, and transformers' modules as the fallback
  for what no declaration covers.
- `qblock/`: the block path (`--dtype q4_1`): GGUF blocks or Q8_0 quantized at load,
  and the native decode step, which runs what the declaration asks or says why not.
- `int8/`: SmoothQuant folding for the int8 path (Llama layout).
- `checkpoint/`: tensors from safetensors or GGUF under transformers' names.

Every model is called the same way:
`model(input_ids [T], positions [T], attention_context, sample_rows) -> logits`.
"""

from __future__ import annotations

MODEL_IMPLS = ("auto", "cbserve", "transformers")
