"""Tests of convert/ (the top-level converter package): head checkpoints to GGUF."""
