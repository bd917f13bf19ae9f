"""`cbserve bench accuracy`: the accuracy gate of every compute path against float32
(perplexity and greedy replies), with llama.cpp's perplexity on the same tokens."""
