"""τ of a merged draft against each of its parts, with the same fixed trees: does merging lookup branches into a
model draft's trees keep τ at least that of the better part?

    python benchmarks/experiments/tau_merged.py --sizes 16,60 --depth 8 [--model M.gguf --draft-model D.gguf | --head H.gguf] \
        --prompts benchmarks/prompts/eagle --prompts benchmarks/prompts/code_edit_short.jsonl --records 4

For every prompt set and tree size it answers ``--records`` records, the first after ``--skip`` (first turns,
greedy, fixed trees of that many nodes) three times: the model draft alone (``lookup=False``), the lookup alone,
and the two merged (the default), and prints τ (tokens per target pass, a count: the machine's load does not move
it) per set as one JSON line per (set, size). Default draft: the default model's shipped head.
"""

from __future__ import annotations

import argparse
import json

from eagle2_local import Eagle2
from eagle2_local.bench.prompt_sets import load_prompt_sets

DRAFTS = ("model", "lookup", "merged")


def tau_of(model: str | None, model_draft: dict, which: str, size: int, depth: int, threads: int,
           prompts: list[str], max_tokens: int) -> float:
    """τ over ``prompts`` answered by one draft configuration with fixed trees of ``size`` nodes."""
    kwargs = {"draft": "lookup"} if which == "lookup" else {**model_draft, "lookup": which == "merged"}
    passes = tokens = 0
    with Eagle2(model, n_threads=threads, budget="fixed", total_tokens=size, depth=depth, **kwargs) as llm:
        for prompt in prompts:
            llm.create_chat_completion([{"role": "user", "content": prompt}], max_tokens=max_tokens,
                                       temperature=0.0)
            st = llm.stats()
            passes += st["target_passes"]
            tokens += st["pass_tokens"]
    return round(tokens / max(passes, 1), 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="target GGUF (default: the default model)")
    ap.add_argument("--head", help="EAGLE head GGUF (default: the default model's shipped head)")
    ap.add_argument("--draft-model", help="a same-vocabulary draft model GGUF instead of a head")
    ap.add_argument("--prompts", action="append", required=True, help="a prompt set (.jsonl or a folder of them)")
    ap.add_argument("--records", type=int, default=4)
    ap.add_argument("--skip", type=int, default=0,
                    help="leave out each set's first SKIP records (a check on records a setting was not chosen on)")
    ap.add_argument("--sizes", default="16,60", help="tree sizes (nodes, root included), comma-separated")
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--drafts", default=",".join(DRAFTS), help="which of model, lookup, merged to run")
    args = ap.parse_args()
    drafts = args.drafts.split(",")
    model_draft = ({"draft_model_path": args.draft_model} if args.draft_model else
                   {"head_path": args.head} if args.head else {})
    for prompt_set in load_prompt_sets(args.prompts, args.skip + args.records):
        prompts = prompt_set.prompts[args.skip:]
        for size in (int(s) for s in args.sizes.split(",")):
            taus = {which: tau_of(args.model, model_draft, which, size, args.depth, args.threads, prompts,
                                  args.max_tokens) for which in drafts}
            ratio = ({"merged_over_best_part": round(taus["merged"] / max(taus["model"], taus["lookup"]), 3)}
                     if len(taus) == len(DRAFTS) else {})
            print(json.dumps({"set": prompt_set.name, "nodes": size, "depth": args.depth, **taus, **ratio}),
                  flush=True)


if __name__ == "__main__":
    main()
