"""The side-by-side benchmark (`eagle2-local bench`): prompt sets, the harness that runs plain decoding and
eagle2-local alternately on one model, and llama.cpp's own binaries on the same prompts."""
