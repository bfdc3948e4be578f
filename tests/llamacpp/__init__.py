"""Tests of eagle2_local/llamacpp/: the llama.cpp bindings, batches, backend top-k, CPU buffers."""
