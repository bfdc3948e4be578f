"""The speculative loop's between-round host calls, warm and right after a target decode (issue 44 part 1).

    python benchmarks/experiments/host_cold_cache.py [--threads 2] [--answers 3] [--calls 100] [--json OUT]

A decode streams the model's weights through the CPU's caches, so the Python that runs next finds its code and
objects evicted. This times the calls the loop makes between two decodes at a plain step (the tree budget's
``plan`` and ``observe``, the lookup's evidence ``next_rate``) three ways, medians in microseconds: warm (called in
a tight loop), after a sweep over 128 MB of memory, and right after a ``decode_one`` of the target, which is where the
loop calls them. The budget and the draft are the default model's, after ``--answers`` greedy answers to EAGLE qa
prompts (so they hold a real answer's state). Calls repeat on the same state: ``plan`` counts each call as a round,
``observe`` each as a plain step, so the budget's counters move, not its decisions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from eagle2_local import Eagle2
from eagle2_local.tree_policy import PLAIN_STEP, RoundResult, RoundTimes

PROMPTS = Path(__file__).resolve().parents[1] / "prompts" / "eagle" / "qa.jsonl"


def median_us(call: Callable[[], object], before: Callable[[], object] | None, n: int) -> float:
    """Median microseconds of ``call``, each time right after ``before`` (None: back to back)."""
    times = []
    for _ in range(n):
        if before is not None:
            before()
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--answers", type=int, default=3, help="qa answers that set up the budget's and draft's state")
    ap.add_argument("--calls", type=int, default=100, help="timed calls per way")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    llm = Eagle2(None, n_threads=args.threads, n_ctx=4096)
    rows = [json.loads(line) for line in PROMPTS.open()][:args.answers]
    for row in rows:
        llm.reset()
        llm.create_chat_completion([{"role": "user", "content": row["turns"][0]}], max_tokens=128, temperature=0)
    budget, draft, target = llm.generator.policy, llm.generator.engine, llm.generator.target
    text = list(llm.generator.tokens)
    plain = RoundResult(PLAIN_STEP, RoundTimes(0.0, drafted=0.0, verified=0.012, done=0.0121))
    rates = iter(np.random.default_rng(0).random(10 * args.calls).tolist())  # a new rate each call, as in a text
    calls = {"plan, no lookup match": lambda: budget.plan(1, 0.0),
             "plan, a new lookup rate": lambda: budget.plan(1, next(rates)),
             "observe, a plain step": lambda: budget.observe(plain),
             "next_rate, the same text": lambda: draft.next_rate(text)}
    sweep = np.ones(128 * 2**20 // 8)
    token = [text[-1]]

    def decode() -> None:
        token[0] = int(target.decode_one(token[0]).logits[0].argmax())

    out: dict[str, dict[str, float]] = {}
    for name, call in calls.items():
        out[name] = {"warm_us": round(median_us(call, None, args.calls), 1),
                     "after_128mb_sweep_us": round(median_us(call, sweep.sum, args.calls), 1),
                     "after_a_decode_us": round(median_us(call, decode, args.calls), 1)}
        print(f"{name:28s} " + "  ".join(f"{k} {v}" for k, v in out[name].items()))
    if args.json:
        args.json.write_text(json.dumps({"threads": args.threads, "answers": args.answers, "calls": args.calls,
                                         "medians": out}, indent=1) + "\n")
    llm.close()


if __name__ == "__main__":
    main()
