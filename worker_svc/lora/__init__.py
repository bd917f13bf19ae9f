"""LoRA adapters in the worker (issue 43): the slot store, a step's rows by adapter,
reading PEFT directories, and the delta the decoder layers add."""
