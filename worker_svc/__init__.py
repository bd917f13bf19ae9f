"""The model worker: owns the weights and the KV pool, runs each step's plan."""
