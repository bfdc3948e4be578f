"""The host's own time per round (wall time minus llama.cpp) on one chat answer, optionally under cProfile.

    python benchmarks/host_time.py --threads 1 --total-tokens 60 --max-tokens 128 [--profile 25] [--cpu-clock] [--dense]

The measurement: the default model with its shipped EAGLE-3 head (and lookup branches; ``--model``, ``--head``,
``--draft-model`` for others), fixed trees of ``--total-tokens`` nodes, greedy. Prints the generation's host figures (``stats()``: per round, draft and verify
side, per drafted node) and, with ``--profile N``, the N functions with the most own time. The answer's tokens
are printed as a checksum so a change to the round can be shown to leave them as they were.
``host_ms_per_round_median`` is the median over the tree rounds: a round preempted by another process moves it
less than the mean.

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
from eagle2_local.generator import GenerationStats  # noqa: E402
from eagle2_local import backend_topk  # noqa: E402

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
    args = ap.parse_args()
    backend_topk.IN_GRAPH_TOP_K = not args.dense
    per_round: list[float] = []  # host ms of every tree round: the median shrugs off preempted rounds
    add_round = GenerationStats.add_round

    def recording(stats, r) -> None:
        if r.plan.drafts:
            per_round.append((r.times.host_draft_s + r.times.host_verify_s) * 1e3)
        add_round(stats, r)

    GenerationStats.add_round = recording
    with Eagle2(args.model, head_path=args.head, draft_model_path=args.draft_model, n_threads=args.threads,
                n_gpu_layers=args.n_gpu_layers, total_tokens=args.total_tokens) as llm:
        messages = [{"role": "user", "content": PROMPT}]
        llm.create_chat_completion(messages, max_tokens=8, temperature=0.0)  # warm up (first-call costs)
        per_round.clear()
        prof = cProfile.Profile() if args.profile else None
        if prof:
            prof.enable()
        out = llm.create_chat_completion(messages, max_tokens=args.max_tokens, temperature=0.0)
        if prof:
            prof.disable()
        s = llm.stats()
    keys = ("engine", "n_tokens", "rounds", "tau", "mean_tree_size", "tokens_per_s", "rounds_s", "llama_s",
            "host_s", "host_ms_per_round", "host_draft_ms_per_round", "host_verify_ms_per_round", "host_us_per_node")
    text = out["choices"][0]["message"]["content"]
    print(json.dumps({**{k: s[k] for k in keys}, "profiled": bool(prof), "clock": "cpu" if args.cpu_clock else "wall",
                      "dense": args.dense, "host_ms_per_round_median": round(float(np.median(per_round)), 4),
                      "answer_sha256": hashlib.sha256(text.encode()).hexdigest()[:16]}))
    if prof:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(args.profile)
        print(buf.getvalue())


if __name__ == "__main__":
    main()
