"""KV that moves between workers (worker.proto's SendKv and ReceiveKv): layout.py, the
chunks' bytes; sender.py, the source's side; receiver.py, the destination's; shm.py, the
shared-memory segment the bytes go through between two workers on one host."""
