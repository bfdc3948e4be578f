"""What taking a rejected chain back costs on a recurrent or hybrid model, both ways (docs/design.md §10): llama.cpp's
per-token state snapshots (``n_rs_seq``) and a checkpoint of the recurrent state put back with the accepted tokens
decoded again (what a model without snapshots needs). Timed against a plain step, on random text.

    python benchmarks/synthetic_model.py qwen35 models/synthetic-qwen3.5-0.8b.gguf --shape qwen3.5-0.8b
    python benchmarks/rollback_cost.py --model models/synthetic-qwen3.5-0.8b.gguf --threads 2 [--json OUT.json]

Per way and chain length n (root included), the medians of: a plain step; one round (verify the chain, keep
``--accept`` of its nodes, commit) plus the next plain step, which applies a snapshot's take-back; and the bytes
a checkpoint saves. A round that keeps every node costs the verify alone, so the difference to a fully accepted
round is the rollback's price.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from eagle2_local.decoding.target import Target
from eagle2_local.llamacpp.llama import LlamaModel
from eagle2_local.llamacpp.settings import ContextSettings
from eagle2_local.tree.draft_tree import DraftTree


def time_rounds(model: LlamaModel, threads: int, n: int, accept: int, checkpoints: bool, repeats: int,
                context: int, seed: int = 0) -> dict:
    """Medians (ms) of a plain step, a fully accepted chain round and a round keeping ``accept`` nodes, each with
    the plain step after it."""
    rng = np.random.default_rng(seed)
    settings = ContextSettings(n_ctx=context + repeats * 4 * (n + 2) + 64, n_batch=64, n_seq_max=1,
                               n_threads=threads, n_rs_seq=n - 1)
    target = Target(model, settings, checkpoints=checkpoints)
    try:
        target.prefill(rng.integers(0, model.n_vocab, context))
        plain, full, partial = [], [], []
        chain = np.arange(-1, n - 1)
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            target.decode_one(int(rng.integers(0, model.n_vocab)))
            plain.append(time.perf_counter() - t0)
            for keep, out in ((n, full), (accept, partial)):
                t0 = time.perf_counter()
                target.verify(DraftTree.from_parents(rng.integers(0, model.n_vocab, n), chain))
                target.commit(np.arange(keep))
                target.decode_one(int(rng.integers(0, model.n_vocab)))  # applies a snapshot's take-back
                out.append(time.perf_counter() - t0)
        state = len(target.ctx.save_seq(0, partial=True))
    finally:
        target.close()
    ms = lambda xs: float(np.median(xs[1:]) * 1e3)  # noqa: E731 - the first run warms up
    return {"n": n, "accept": accept, "way": "checkpoints" if checkpoints else "snapshots",
            "plain_ms": ms(plain), "round_all_kept_ms": ms(full), "round_rejected_ms": ms(partial),
            "checkpoint_bytes": state}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sizes", default="4,9", help="chain lengths, root included")
    ap.add_argument("--accept", type=int, default=2, help="nodes a rejected round keeps (root included)")
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    model = LlamaModel(args.model)
    if not (model.recurrent or model.hybrid):
        raise SystemExit(f"{args.model} is an attention model: nothing recurrent to take back")
    rows = [time_rounds(model, args.threads, int(n), args.accept, checkpoints, args.repeats, args.context)
            for n in args.sizes.split(",") for checkpoints in (False, True)]
    print(f"{'way':<12} {'n':>3} {'plain ms':>9} {'all kept':>9} {'rejected':>9} {'ckpt KiB':>9}")
    for r in rows:
        print(f"{r['way']:<12} {r['n']:>3} {r['plain_ms']:>9.1f} {r['round_all_kept_ms']:>9.1f} "
              f"{r['round_rejected_ms']:>9.1f} {r['checkpoint_bytes'] / 1024:>9.0f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"command": "python benchmarks/rollback_cost.py " + " ".join(
                f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None and k != "json"),
                "threads": args.threads, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
