"""What a tree costs the plain steps after it: plain decodes timed after a plain decode and after a tree.

    python benchmarks/experiments/after_tree_cost.py [--threads 2] [--repeat 30] [--nodes 4] [--json OUT]

The tree budget prices a tree round by its own verification, timed size by size. This times the target's plain
steps the way the loop takes them (the context grows, a tree keeps its root) in each repetition: four plain steps
(the last one timed: a plain step after a plain step), a tree of ``--nodes`` nodes, then two plain steps (the
first and second after a tree). Medians in milliseconds, and each after-tree step's excess over the plain one, in
plain steps (what :attr:`CostModel.switch_steps` learns online). Default model, random tokens, 96 tokens of context
to start, rolled back to it past 1,500.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from eagle2_local import Eagle2
from eagle2_local.measure.microbench import bushy_tree


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--nodes", type=int, default=4, help="nodes of the tree between the plain steps")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    target = Eagle2(None, n_threads=args.threads, n_ctx=4096).generator.target
    rng = np.random.default_rng(0)
    n_vocab = target.model.n_vocab
    target.reset()
    target.prefill(rng.integers(0, n_vocab, 96))

    def plain() -> float:
        token = int(rng.integers(0, n_vocab))
        t0 = time.perf_counter()
        target.decode_one(token)
        return time.perf_counter() - t0

    def tree() -> float:
        t0 = time.perf_counter()
        target.verify(bushy_tree(args.nodes, rng, n_vocab), copy=False, features=False)
        seconds = time.perf_counter() - t0
        target.commit(np.array([0]))  # the root alone is kept, as a round that accepted nothing
        return seconds

    times: dict[str, list[float]] = {"plain after plain": [], "tree": [], "first plain after the tree": [],
                                     "second plain after the tree": []}
    for _ in range(args.repeat):
        for _ in range(4):
            last = plain()
        times["plain after plain"].append(last)
        times["tree"].append(tree())
        times["first plain after the tree"].append(plain())
        times["second plain after the tree"].append(plain())
        if target.n_past > 1500:
            target.rollback(96)
    ms = {k: round(statistics.median(v) * 1e3, 3) for k, v in times.items()}
    base = ms["plain after plain"]
    excess = {k: round(v / base - 1.0, 3) for k, v in ms.items() if k.endswith("after the tree")}
    out = {"threads": args.threads, "repeat": args.repeat, "nodes": args.nodes, "median_ms": ms,
           "excess_steps": excess, "tree_steps": round(ms["tree"] / base, 3)}
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
