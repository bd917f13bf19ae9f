"""`cbserve bench speculation`: n-gram speculative decoding off and on, side by side."""
