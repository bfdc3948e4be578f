"""Time the numpy EAGLE-1/2 engine per tree level on SmolLM2, next to the target's time per token.

    python benchmarks/experiments/eagle1_draft_time.py [--head HEAD.gguf] [--prompts 4] [--max-tokens 48] [--threads 1]

Without ``--head`` a random head of SmolLM2's shape is written and converted (timing does not depend on the
weights, only on the shapes and the tree). Drafting uses EAGLE-2's default tree (60 nodes, depth 6, top-k 10):
every deeper level runs 10 rows through the head and the 49152-row LM head. The target's time per token comes from
plain greedy decoding of the same prompts in the same process. Writes
benchmarks/results/eagle1-numpy-draft-time-smollm2.json (rendered by make_record.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from eagle2_local import Eagle2
from eagle2_local.bench.harness import machine_info
from eagle2_local.bench.prompt_sets import interleaved, load_prompt_sets
from eagle2_local.convert.eagle1 import write_head
from eagle2_local.formats.eagle1_format import HeadParams
from eagle2_local.formats.models import default_model_path
from eagle2_local.measure.microbench import DraftTimes

ROOT = Path(__file__).resolve().parents[2]
EAGLE_SETS = ROOT / "benchmarks" / "prompts" / "eagle"  # EAGLE's six evaluation sets, vendored
OUT = ROOT / "benchmarks" / "results" / "eagle1-numpy-draft-time-smollm2.json"


def synthetic_smollm2_head(folder: Path) -> Path:
    """Random weights in the shapes the head format asks for (a Vicuna-style head: fc bias, no q/k/v bias)."""
    params = HeadParams(hidden_size=576, intermediate_size=1536, vocab_size=49152, n_head=9, n_head_kv=9,
                        head_dim=64, rms_eps=1e-5, rope_base=10000.0, fc_bias=True, qkv_bias=False)
    rng = np.random.default_rng(0)
    tensors = {name: (rng.standard_normal(shape) * shape[-1] ** -0.5).astype(np.float32)
               for name, shape in params.expected_shapes().items()}
    return write_head(folder / "head.gguf", params, tensors, {"source.checkpoint": "random"}, outtype="f16")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--head", default=None)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    prompts = [[{"role": "user", "content": p}]
               for p in interleaved(load_prompt_sets([str(EAGLE_SETS)], None), args.prompts)]
    model = default_model_path()
    with tempfile.TemporaryDirectory() as tmp:
        head = Path(args.head) if args.head else synthetic_smollm2_head(Path(tmp))
        with Eagle2(model, n_threads=args.threads) as plain:
            per_token = []
            for msgs in prompts:
                plain.create_chat_completion(msgs, max_tokens=args.max_tokens, temperature=0)
                s = plain.stats()
                per_token.append(s["verify_s"] / max(1, s["target_passes"]))
        times = DraftTimes()
        with Eagle2(model, head_path=head, n_threads=args.threads, draft_timer=times, lookup=False) as llm:
            verify = []
            for msgs in prompts:
                llm.create_chat_completion(msgs, max_tokens=args.max_tokens, temperature=0)
                s = llm.stats()
                verify.append(s["verify_s"] / max(1, s["target_passes"]))
            tree = llm.tree_params
    target_ms = statistics.median(per_token) * 1e3
    report = {
        "command": " ".join(["python benchmarks/experiments/eagle1_draft_time.py"] + sys.argv[1:]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine_info(),
        "model": model.name, "head": str(args.head or "random head of SmolLM2's shape (H 576, 9/9 heads, ff 1536), "
                                                    "embedding borrowed from the target"),
        "threads": args.threads, "prompts": args.prompts, "max_tokens": args.max_tokens,
        "tree": {"total_tokens": tree.total_tokens, "depth": tree.depth, "top_k": tree.top_k},
        "target_ms_per_token": round(target_ms, 3),
        "verify_ms_per_tree": round(statistics.median(verify) * 1e3, 3),
        "draft_ms_catch_up": round(statistics.median(times.catch_up_s) * 1e3, 3),
        "draft_ms_per_level": {str(k): round(statistics.median(v) * 1e3, 3) for k, v in sorted(times.level_s.items())},
        "calls_per_level": {str(k): len(v) for k, v in sorted(times.level_s.items())},
    }
    report["draft_ms_per_level_over_target_token"] = {
        k: round(v / target_ms, 3) for k, v in report["draft_ms_per_level"].items()}
    OUT.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
