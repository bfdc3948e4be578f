"""Time the numpy EAGLE-1/2 engine per tree level on SmolLM2, next to the target's time per token.

    python benchmarks/eagle1_draft_time.py [--head HEAD.gguf] [--prompts 4] [--max-tokens 48] [--threads 1]

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

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from conftest import load_prompts  # noqa: E402
from convert.eagle1 import convert_head  # noqa: E402
from eagle2_local import Eagle2  # noqa: E402
from eagle2_local.bench import machine_info  # noqa: E402
from eagle2_local.microbench import DraftTimes  # noqa: E402
from eagle2_local.models import default_model_path  # noqa: E402
from eagle_heads import head_config, head_tensors, write_head_dir  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "eagle1-numpy-draft-time-smollm2.json"


def synthetic_smollm2_head(folder: Path) -> Path:
    cfg = head_config("vicuna", hidden=576, vocab=49152, n_head=9, ff=1536)
    return convert_head(write_head_dir(folder / "head", cfg, head_tensors(cfg, seed=0, with_embedding=False)),
                        folder / "head.gguf", outtype="f16")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--head", default=None)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    prompts = [[{"role": "user", "content": p}] for p in load_prompts(args.prompts)]
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
        "command": " ".join(["python benchmarks/eagle1_draft_time.py"] + sys.argv[1:]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine_info(),
        "model": model.name, "head": str(args.head or "random head of SmolLM2's shape (H 576, 9/3 heads, ff 1536), "
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
