"""Pieces both processes share: defaults, config helpers, logging, generated gRPC code."""
