"""`cbserve bench formats`: the GGUF files people download, each beside llama.cpp."""
