"""Draft-head converters: EAGLE checkpoints (config.json + weights) → GGUF for eagle2-local and llama.cpp."""
