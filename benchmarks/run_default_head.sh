#!/usr/bin/env bash
# The benchmark record for the default model + shipped head (draft cost, tau per category, tree budget).
# Run on an otherwise idle machine: llama.cpp's threads spin, so any other load distorts every figure. About 30
# minutes on 2 cores (10 of them the lossless sweep).
#   bash benchmarks/run_default_head.sh [E1_HEAD.gguf]   (an EAGLE-1/2 head of SmolLM2's size, for draft-cost)
set -euo pipefail
cd "$(dirname "$0")/.."
R=benchmarks/results
P=benchmarks/prompts/eagle
HEAD=$(python -c "from eagle2_local.formats.models import default_head_path as d; print(d())")
E=(python cli.py)
# losslessness first: the long sweep the default test run leaves out (50 prompts x 128 tokens, ~10 minutes)
python -m pytest -q -m slow
# draft cost per level, llama.cpp EAGLE-3 engine vs the numpy EAGLE-1/2 engine (same tree width)
"${E[@]}" draft-cost --head "$HEAD" --prompts $P/mt_bench.jsonl --n 2 --max-tokens 48 --threads 2 --json > $R/draft-cost-eagle3-default-head.json
if [ -n "${1:-}" ]; then
  "${E[@]}" draft-cost --head "$1" --prompts $P/mt_bench.jsonl --n 2 --max-tokens 48 --threads 2 --json > $R/draft-cost-eagle1-numpy-smollm2-size.json
fi
# tree budget: the default (budget auto, default model and head) against plain decoding, six prompt sets
"${E[@]}" bench --prompts $P --n 10 --max-tokens 64 --threads 2 --repeat 3 --recalibrate --json $R/bench-budget-default-head-auto.json
# tau per category at T=0 with EAGLE-2's default tree (60 nodes, depth 6, top-k 10)
"${E[@]}" bench --prompts $P --n 8 --max-tokens 64 --threads 2 --budget fixed --total-tokens 60 --json $R/bench-budget-default-head-fixed60.json
# tree budget: a sweep of small fixed trees, to see how close auto comes to the best fixed size
for n in 3 6; do
  "${E[@]}" bench --prompts $P --n 3 --max-tokens 64 --threads 2 --budget fixed --total-tokens $n --depth 3 --tree-top-k 2 --json $R/bench-budget-default-head-fixed$n.json
done
python benchmarks/make_record.py
