"""Adapters to llama.cpp: the model and context wrappers over llama-cpp-python's C API and their batches, llama.cpp
set up, logged and timed in this process, its extra entry points and backend functions, CPU weight buffers, the
RPC backend, top-k on the backend, BLAS threads, and llama.cpp's own binaries (for side-by-side benchmarks).
Nothing above this folder calls llama_cpp directly."""
