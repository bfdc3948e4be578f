#!/usr/bin/env bash
# llama.cpp's own n-gram lookup drafting vs plain decoding on the same prompts, from the llama.cpp that the
# installed llama-cpp-python vendors (built by build_llama_cpp.sh on first use; minutes).
#   Usage: benchmarks/experiments/llamacpp_ngram.sh MODEL [options of benchmarks/experiments/llamacpp_ngram.py]
#   e.g.   benchmarks/experiments/llamacpp_ngram.sh models/qwen2.5-coder-1.5b-instruct-q4_0.gguf --max-tokens 256 \
#            --spec "--spec-type ngram-mod" --json benchmarks/results/llamacpp_ngram.json
# Defaults: benchmarks/prompts/code_edit.jsonl, greedy, --threads 2, --spec "--spec-type ngram-simple".
set -euo pipefail
if [ $# -lt 1 ] || [ ! -f "$1" ]; then echo "error: give a GGUF model file as the first argument" >&2; exit 1; fi
here="$(cd "$(dirname "$0")" && pwd)"
model="$1"; shift
bin="$(bash "$here/../build_llama_cpp.sh")"
exec python "$here/llamacpp_ngram.py" --bin "$bin" --model "$model" "$@"
