"""What drafts from earlier answers cost (eagle2_local/drafts/history.py): the memory of a HistoryIndex holding
10,000 answers of ~200 tokens (each after 32 prompt tokens), and the host time of one tree level that consults it.

    PYTHONPATH=. python benchmarks/history_cost.py [--answers 10000] [--length 200] [--nodes 8] [--levels 2000]

The answers are drawn from a Zipf-like vocabulary of 49,152 tokens (SmolLM2's size) with phrases repeated
across answers, so 3-grams recur as in real text and chains are walked. A level is one
``HistoryRounds.rows`` call over ``--nodes`` nodes, each a context of 16 tokens: half taken from an indexed
answer (long matches: the chains are walked and counted), half drawn fresh (mostly no match), each context new
(no cached result), as at a round's level. Time: ``time.thread_time()`` (this thread's CPU time), per level.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np

from eagle2_local.drafts.history import HistoryIndex, HistoryRounds

VOCAB = 49_152


def answers(n: int, length: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """``n`` (prompt tail, answer) pairs: Zipf-distributed tokens, a third of each answer copied from a pool of
    2,000 common phrases of 8-24 tokens."""
    rng = np.random.default_rng(seed)
    ranks = np.minimum(rng.zipf(1.2, size=n * (length + 32) * 2), VOCAB - 1).tolist()
    phrases = [[int(t) for t in rng.integers(0, VOCAB, int(rng.integers(8, 25)))] for _ in range(2000)]
    out, at = [], 0
    for _ in range(n):
        body: list[int] = []
        while len(body) < length:
            if rng.random() < 0.3:
                body += phrases[int(rng.integers(0, len(phrases)))]
            else:
                body += ranks[at:at + 12]
                at += 12
        out.append((ranks[at:at + 32], body[:length]))
        at += 32
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--answers", type=int, default=10_000)
    ap.add_argument("--length", type=int, default=200)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--levels", type=int, default=2000)
    args = ap.parse_args()
    records = answers(args.answers, args.length)
    tracemalloc.start()
    index = HistoryIndex(max_tokens=10 ** 8, max_answers=args.answers)
    for tail, answer in records:
        index.add(answer, tail)
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"memory: {size / 1e6:.1f} MB for {len(index)} answers, {index.n_tokens} tokens "
          f"({size / index.n_tokens:.1f} bytes a token), {len(index._last)} distinct 3-grams")
    rng = np.random.default_rng(1)
    rounds = HistoryRounds(index)
    contexts = []
    for _ in range(args.levels * args.nodes):
        if rng.random() < 0.5:
            tail, answer = records[int(rng.integers(0, len(records)))]
            at = int(rng.integers(16, len(answer)))
            contexts.append(answer[at - 16:at])
        else:
            contexts.append([int(t) for t in rng.integers(0, 2000, 16)])
    width = 10
    cands = list(range(args.nodes))
    start = time.thread_time()
    matched = 0
    for level in range(args.levels):
        nodes = contexts[level * args.nodes:(level + 1) * args.nodes]
        tokens: list[list[int]] = [[] for _ in nodes]
        probs: list[list[float]] = [[] for _ in nodes]
        rounds.rows([], nodes, cands, tokens, probs, width)
        matched += sum(1 for row in tokens if row)
        rounds.clear()
    spent = time.thread_time() - start
    print(f"host time: {spent / args.levels * 1e3:.3f} ms per level of {args.nodes} nodes "
          f"({spent / (args.levels * args.nodes) * 1e6:.1f} us a node; {matched} of "
          f"{args.levels * args.nodes} nodes matched)")


if __name__ == "__main__":
    main()
