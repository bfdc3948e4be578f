"""Forced tokens under a grammar: which rule for small allowed sets drafts best, and what the search costs.

For each record of a prompt set with a ``schema``/``grammar`` field, the model decodes its constrained greedy answer
plainly and speculatively with forced tokens as its only draft (no model draft, fixed trees), once per rule of the
forced drafter:

* ``single``: only a single allowed token is proposed;
* ``chain``: also a chain of allowed tokens not met before (each a prefix of the longest), as its longest token;
* ``learned``: also the target's earlier choices among the same allowed set (no chain guess);
* ``chain+learned``: both (the default).

Printed per rule: tau (tokens per target pass, a count: the machine's load does not change it), forced nodes
verified and accepted, and whether every answer equals the plain one. ``--host`` also times, at every position of
the plain answers, the prefix-forest search against the whole-vocabulary mask (medians, microseconds).

    python benchmarks/experiments/grammar_forced.py --prompts benchmarks/prompts/extract_schema.jsonl -n 8 --max-tokens 160
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from eagle2_local import Eagle2
from eagle2_local.bench.prompt_sets import load_prompt_sets
from eagle2_local.drafts.forced import CHAIN_PRIOR
from eagle2_local.formats.models import default_model_path

RULES = {"single": (0.0, False), "chain": (CHAIN_PRIOR, False), "learned": (0.0, True),
         "chain+learned": (CHAIN_PRIOR, True)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="GGUF (default: the default model)")
    ap.add_argument("--prompts", default="benchmarks/prompts/extract_schema.jsonl")
    ap.add_argument("-n", type=int, default=8, help="records")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--total-tokens", type=int, default=16)
    ap.add_argument("--host", action="store_true", help="also time the forced search against the full mask")
    ap.add_argument("--out", default=None, help="write the figures here as JSON")
    args = ap.parse_args()
    ps = load_prompt_sets([args.prompts], args.n)[0]
    model = args.model or default_model_path()  # named, so the default model's shipped head is not attached
    with Eagle2(model, lookup=False, n_ctx=4096, n_threads=args.threads, total_tokens=args.total_tokens,
                depth=8) as llm:
        prompts = [llm.chat_tokens([{"role": "user", "content": ps.prompts[i]}]) for i in range(len(ps.prompts))]
        grammars = [ps.grammar(i) for i in range(len(ps.prompts))]
        plain = [list(llm.generate(p, temp=0.0, max_tokens=args.max_tokens, grammar=g, speculative=False))
                 for p, g in zip(prompts, grammars)]
        report = {"load": os.getloadavg()[0], "records": len(prompts),
                  "tokens": sum(map(len, plain)), "rules": {}}
        forced = llm.generator.forced_draft()
        for rule, (prior, learn) in RULES.items():
            forced.chain_prior, forced.learn = prior, learn
            forced.chosen.clear()  # each rule starts cold (the drafter keeps its picks across generations)
            passes = produced = nodes = accepted = same = 0
            for p, g, ref in zip(prompts, grammars, plain):
                out = list(llm.generate(p, temp=0.0, max_tokens=args.max_tokens, grammar=g))
                st = llm.last_stats
                passes += st.target_passes
                produced += st.pass_tokens
                nodes += st.nodes_by_source.get("forced", 0)
                accepted += st.accepted_by_source.get("forced", 0)
                same += out == ref
            report["rules"][rule] = {"tau": round(produced / passes, 3), "forced_nodes": nodes,
                                     "forced_accepted": accepted, "identical": f"{same}/{len(prompts)}"}
            print(rule, report["rules"][rule], flush=True)
        forced.chain_prior, forced.learn = CHAIN_PRIOR, True
        if args.host:
            report["host_us"] = host_times(llm, forced.forest, grammars, plain)
            print("host", report["host_us"])
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


def host_times(llm: Eagle2, forest, grammars, answers) -> dict:
    """Median microseconds per position of the forest search (split by whether it found a small set) and of the
    whole-vocabulary mask."""
    found, gave_up, full = [], [], []
    for grammar, answer in zip(grammars, answers):
        state = grammar.state(llm.model)
        for tok in answer:
            t0 = time.perf_counter()
            allowed, _ = forest.allowed_set(state)
            t1 = time.perf_counter()
            state.mask()
            t2 = time.perf_counter()
            (found if allowed is not None else gave_up).append(t1 - t0)
            full.append(t2 - t1)
            state.accept(tok)
        state.close()
    med = lambda xs: round(float(np.median(xs)) * 1e6, 1) if xs else None  # noqa: E731
    return {"search_found": med(found), "search_gave_up": med(gave_up), "full_mask": med(full),
            "positions": len(full), "found_share": round(len(found) / max(len(full), 1), 3)}


if __name__ == "__main__":
    main()
