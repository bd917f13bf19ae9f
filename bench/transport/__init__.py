"""The transports measured for the link between a scheduler's core process and its API
processes: the messages and their codecs, the byte pipes, and what each costs."""
