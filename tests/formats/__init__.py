"""Tests of eagle2_local/formats/: GGUF reading and writing, the cache folder."""
