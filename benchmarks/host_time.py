"""The host's own time per round (wall time minus llama.cpp) on one chat answer, optionally under cProfile.

    python benchmarks/host_time.py --threads 1 --total-tokens 60 --max-tokens 128 [--profile 25] [--cpu-clock] [--dense] [--no-lookup]
    python benchmarks/host_time.py --threads 1 --total-tokens 16 --max-tokens 128 --cpu-clock --draft lookup \
        --prompts benchmarks/prompts/code_edit_short.jsonl --records 4 [--tree-hash]

The measurement: the default model with its shipped EAGLE-3 head (and lookup branches; ``--model``, ``--head``,
``--draft-model`` for others), fixed trees of ``--total-tokens`` nodes, greedy. Prints the generation's host figures (``stats()``: per round, draft and verify
side, per drafted node) and, with ``--profile N``, the N functions with the most own time. The answer's tokens
are printed as a checksum so a change to the round can be shown to leave them as they were.
``--draft`` names any draft (``lookup``, ``head:h.gguf``, as ``generate --draft``); ``--prompts`` answers the first
``--records`` records of a prompt set (each record's first turn) instead of the one chat question, all in one run
(a lookup must have text to copy from to propose anything), each under its record's ``schema`` or ``grammar`` if
it has one. ``--tree-hash`` prints a hash of every selected tree
(tokens, parents, score bits, sources): a change that claims to leave the trees as they were can show it.
``between_rounds_ms_median``: the host's time from one round's end to the next one's start (emitting the
tokens, the statistics, the policy's plan and the lookup's evidence for it), which the per-round figure leaves
out; it includes this script's own recording (a few us).
``host_ms_per_round_median`` is the median over the tree rounds: a round preempted by another process moves it
less than the mean. ``benchmarks/host_split.py`` (same options) lists which functions the host time goes to.

``--cpu-clock`` times everything with the thread's CPU clock instead of the wall clock: on a shared machine a
wall-clock host figure also counts the time other processes held the core; with one llama.cpp thread the
generation runs on this thread, so CPU time splits into llama.cpp and host work the same way (each clock
read costs ~0.5 us more, which the host figure includes). ``--dense`` drafts with whole logit rows in numpy
(the EAGLE-3 engine's path before the in-graph top-k), for an A/B.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import json
import pstats
import sys
import time

if "--cpu-clock" in sys.argv:  # before eagle2_local binds time.perf_counter as its default clock
    time.perf_counter = time.thread_time

import numpy as np  # noqa: E402

from eagle2_local import Eagle2  # noqa: E402
from eagle2_local.bench.prompt_sets import load_prompt_sets
from eagle2_local.decoding.stats import GenerationStats  # noqa: E402
from eagle2_local.generation import generator
from eagle2_local.llamacpp import backend_topk

PROMPT = "Explain how a hash table works, with a short example in Python."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--total-tokens", type=int, default=60)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="print the N functions with most own time")
    ap.add_argument("--cpu-clock", action="store_true", help="time with the thread's CPU clock (shared machines)")
    ap.add_argument("--dense", action="store_true", help="dense logit rows in numpy instead of the in-graph top-k")
    ap.add_argument("--model", help="target GGUF (default: the default model)")
    ap.add_argument("--head", help="EAGLE-3 head GGUF (default: the default model's shipped head)")
    ap.add_argument("--draft-model", help="a draft model GGUF instead of a head")
    ap.add_argument("--n-gpu-layers", type=int, default=None, help="layers offloaded to a GPU build's device")
    ap.add_argument("--draft", help="the draft, as generate --draft names it (lookup, head:h.gguf, ...)")
    ap.add_argument("--prompts", help="a prompt set (.jsonl) whose records' first turns are answered")
    ap.add_argument("--records", type=int, default=1, help="how many of --prompts' records (default 1)")
    ap.add_argument("--tree-hash", action="store_true", help="print a hash of every selected tree")
    ap.add_argument("--no-lookup", action="store_true",
                    help="no lookup branches in a head's or draft model's trees (the draft alone)")
    ap.add_argument("--budget", choices=("fixed", "auto"), default="fixed",
                    help="fixed trees of --total-tokens nodes (default), or the auto budget up to that many")
    args = ap.parse_args()
    backend_topk.IN_GRAPH_TOP_K = not args.dense
    prompt_set = load_prompt_sets([args.prompts], args.records)[0] if args.prompts else None
    prompts = prompt_set.prompts if prompt_set is not None else [PROMPT]
    grammars = [prompt_set.grammar(i) if prompt_set is not None else None for i in range(len(prompts))]
    per_round: list[tuple[float, float]] = []  # (draft, verify) host ms of every tree round, for medians
    trees = hashlib.sha256()
    add_round = GenerationStats.add_round
    select_tree = generator.select_tree

    between: list[float] = []  # ms from one round's end to the next one's start (same answer)
    last_done: list[float | None] = [None]

    def recording(stats, r) -> None:
        if r.plan.drafts:
            per_round.append((r.times.host_draft_s * 1e3, r.times.host_verify_s * 1e3))
        if last_done[0] is not None:
            between.append((r.times.start - last_done[0]) * 1e3)
        add_round(stats, r)
        last_done[0] = r.times.done

    def hashing(*args, **kwargs):
        tree = select_tree(*args, **kwargs)
        for a in (tree.tokens, tree.parents, tree.scores, tree.sources):
            trees.update(np.ascontiguousarray(a).tobytes())
        return tree

    GenerationStats.add_round = recording
    if args.tree_hash:
        generator.select_tree = hashing
    with Eagle2(args.model, head_path=args.head, draft_model_path=args.draft_model, n_threads=args.threads,
                n_gpu_layers=args.n_gpu_layers, total_tokens=args.total_tokens, draft=args.draft,
                budget=args.budget, lookup=False if args.no_lookup else None) as llm:
        llm.create_chat_completion([{"role": "user", "content": prompts[0]}], max_tokens=8,
                                   temperature=0.0)  # warm up (first-call costs)
        per_round.clear()
        trees = hashlib.sha256()
        prof = cProfile.Profile() if args.profile else None
        texts, parts = [], []
        between.clear()
        for prompt, grammar in zip(prompts, grammars):
            last_done[0] = None
            if prof:
                prof.enable()
            out = llm.create_chat_completion([{"role": "user", "content": prompt}], max_tokens=args.max_tokens,
                                             temperature=0.0, grammar=grammar)
            if prof:
                prof.disable()
            texts.append(out["choices"][0]["message"]["content"])
            parts.append(llm.last_stats)
    s = sum(parts, GenerationStats()).as_dict()  # the answers as one: τ over all passes, host over all rounds
    keys = ("engine", "n_tokens", "rounds", "tau", "mean_tree_size", "tokens_per_s", "rounds_s", "llama_s",
            "host_s", "host_ms_per_round", "host_draft_ms_per_round", "host_verify_ms_per_round", "host_us_per_node")
    draft_ms, verify_ms = np.array(per_round).reshape(-1, 2).T

    def median(ms: np.ndarray) -> float | None:  # None: no tree round (an auto budget may run plain steps only)
        return round(float(np.median(ms)), 4) if len(ms) else None
    print(json.dumps({**{k: s[k] for k in keys}, "profiled": bool(prof), "clock": "cpu" if args.cpu_clock else "wall",
                      "dense": args.dense, "tree_rounds": len(per_round),
                      "host_ms_per_round_median": median(draft_ms + verify_ms),
                      "host_draft_ms_median": median(draft_ms), "host_verify_ms_median": median(verify_ms),
                      "between_rounds_ms_median": median(np.array(between)),
                      "answer_sha256": hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:16],
                      **({"trees_sha256": trees.hexdigest()[:16]} if args.tree_hash else {})}))
    if prof:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(args.profile)
        print(buf.getvalue())


if __name__ == "__main__":
    main()
