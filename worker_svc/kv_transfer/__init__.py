"""KV that moves between workers (worker.proto's SendKv and ReceiveKv): layout.py, the
chunks' bytes; sender.py, the source's side; receiver.py, the destination's."""
