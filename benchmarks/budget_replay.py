"""The auto budget's decisions with the clock taken out: each answer's rounds priced on the calibrated cost curve.

    python benchmarks/budget_replay.py --model models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --draft lookup \
        --prompts benchmarks/prompts/code_edit_short.jsonl --records 0:12 [--threads 1] [--depth 16]

A bench on a shared machine measures the load as much as the policy: the budget's cost model follows the plain
steps it observes and its guards judge realised round times. Here the cost model stays as calibrated (the cached
curve for these settings, adopted without the start-up check), every round and plain step "takes" its calibrated
time, and each prompt's speed is its tokens over the sum of its rounds' costs in plain steps (a plain step costs
1). The decisions then depend on the answers alone, so two versions of the policy can be compared on a busy
machine (run each with ``PYTHONPATH`` at its checkout). It is a model, not a speed: host time and the noise of
real passes are left out; a bench on an idle machine has the last word.

``--depth`` other than the calibrated one reuses the calibration made at ``--calibrated-depth`` (a lookup's costs
do not depend on its depth); with no calibration cached for these settings one is made first (minutes).
"""

from __future__ import annotations

import argparse
import hashlib
import json

import numpy as np

import eagle2_local.api as api
from eagle2_local import Eagle2, costs as cost_cache
from eagle2_local.bench import load_prompt_sets
from eagle2_local.generator import GenerationStats
from eagle2_local.tree_policy import budget as budget_mod, costs as cost_model


def freeze_time() -> None:
    """Costs stay as calibrated; rounds and plain steps are observed at their calibrated cost."""
    for name in ("observe_plain", "observe_verify", "observe_draft", "observe_catch_up"):
        setattr(cost_model.CostModel, name, lambda self, *args, **kwargs: None)
    observe, plain = budget_mod.TreeBudget.observe, budget_mod.TreeBudget._plain

    def observe_nodes(self, result) -> None:
        self._replay_nodes = result.n_nodes if result.plan.drafts else 1
        observe(self, result)

    budget_mod.TreeBudget.observe = observe_nodes
    budget_mod.TreeBudget._realised_s = lambda self, times, kind: float(
        self.costs.verify_s(getattr(self, "_replay_nodes", 1)))
    budget_mod.TreeBudget._plain = lambda self, seconds: plain(self, float(self.costs.verify_s(1)))
    api.check_costs = lambda target, costs, params: (True, {"replay": "start-up check skipped"})


def reuse_calibration(depth: int) -> None:
    """A calibration cached at ``depth`` serves any depth (copied under the new key on first use)."""
    measured_or_cached = cost_cache.cached_or_measured

    def cached(key, measure, refresh=False, directory=None, check=None):
        folder = directory or cost_cache.cache_dir()
        if not (folder / key.file_name()).exists():
            source = cost_cache.CostKey(**{**key.__dict__, "extra": {**key.extra, "depth": depth}})
            if (folder / source.file_name()).exists():
                record = json.loads((folder / source.file_name()).read_text())
                record["key"] = key.as_dict()
                (folder / key.file_name()).write_text(json.dumps(record))
        return measured_or_cached(key, measure, refresh, directory, check)

    api.cached_or_measured = cached


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="target GGUF (default: the default model)")
    ap.add_argument("--draft", help="as generate --draft names it (default: the model's default draft)")
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--records", default="0:12", help="FIRST:LAST records of --prompts (default 0:12)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--depth", type=int, default=None, help="draft levels (default: the API's default)")
    ap.add_argument("--calibrated-depth", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    first, last = (int(x) for x in args.records.split(":"))
    freeze_time()
    reuse_calibration(args.calibrated_depth)
    rounds: list[tuple[int, int]] = []  # (nodes verified, tokens emitted) of each round of the answer
    add_round = GenerationStats.add_round

    def recording(stats, result) -> None:
        rounds.append((result.n_nodes if result.plan.drafts else 1, result.n_emitted))
        add_round(stats, result)

    GenerationStats.add_round = recording
    prompts = load_prompt_sets([args.prompts], last)[0]
    speeds, texts = [], []
    with Eagle2(args.model, n_threads=args.threads, draft=args.draft, budget="auto", depth=args.depth) as llm:
        llm.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=4, temperature=0.0)
        curve = llm.generator.policy.costs
        for i in range(first, last):
            rounds.clear()
            out = llm.create_chat_completion([{"role": "user", "content": prompts.prompts[i]}],
                                             max_tokens=args.max_tokens, temperature=0.0, grammar=prompts.grammar(i))
            texts.append(out["choices"][0]["message"]["content"])
            tokens = sum(emitted for _, emitted in rounds)
            cost = sum(float(curve.verify_s(n) / curve.verify_s(1)) for n, _ in rounds)
            sizes: dict[int, int] = {}
            for n, _ in rounds:
                if n > 1:
                    sizes[n] = sizes.get(n, 0) + 1
            speeds.append(tokens / cost)
            print(f"{i:3d} tokens {tokens:4d} rounds {len(rounds):4d} cost {cost:7.1f} speed {tokens / cost:.3f} "
                  f"trees {dict(sorted(sizes.items()))}", flush=True)
    print(json.dumps({"median": round(float(np.median(speeds)), 3), "mean": round(float(np.mean(speeds)), 3),
                      "answers_sha256": hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:16]}))


if __name__ == "__main__":
    main()
