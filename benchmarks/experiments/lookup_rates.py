"""How often a lookup match's top continuation was the next token, in a model's own answers: per kind of match
and match length, per prompt set. What the lookup's priors (``eagle2_local/drafts/ngram.py``, ``_priors``)
stand for.

    python benchmarks/experiments/lookup_rates.py --prompts benchmarks/prompts/eagle --records 10:22 --json rates-eagle.json
    python benchmarks/experiments/lookup_rates.py --prompts benchmarks/prompts/code_edit_short.jsonl --split tune \
        --records 0:12 --model models/qwen2.5-coder-1.5b-instruct-q4_0.gguf --json rates-code.json

Each record's first user turn is answered by plain greedy decoding (``--max-tokens``, under the record's
``schema`` or ``grammar`` with ``--grammar``); a fresh :class:`~eagle2_local.drafts.ngram.NgramIndex` then reads
the prompt unscored and the answer scored, exactly as a lookup draft scores the tokens it commits, and every
score is tallied: COPY (the answer continuing a match in the prompt), REPEAT (in the answer so far), per match
length n. The report gives hits and trials per set and pooled, beside the priors in use. No draft runs, so no
calibration is made.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections import defaultdict
from pathlib import Path

from eagle2_local import Eagle2
from eagle2_local.bench.prompt_sets import SPLITS, load_prompt_sets
from eagle2_local.drafts.ngram import COPY, REPEAT, NgramIndex, _priors

KINDS = {"copy": COPY, "repeat": REPEAT}


def tally_answer(prompt: list[int], answer: list[int], max_n: int, counts: dict) -> None:
    """Score ``answer`` after ``prompt`` as a lookup draft's index does; add each score to ``counts``:
    (kind, n) -> [hits, trials]."""
    index = NgramIndex(max_n)
    index.answer_from = len(prompt)
    index.extend(prompt)
    learn = index.confidence.observe

    def observe(n: int, hit: bool, kind: int = 0) -> None:
        counts[kind, n][0] += int(hit)
        counts[kind, n][1] += 1
        learn(n, hit, kind)

    index.confidence.observe = observe
    index.extend(answer)


def rates_table(counts: dict, max_n: int) -> dict[str, list[list[int]]]:
    """Per kind name, [hits, trials] for n = 1..max_n."""
    return {name: [list(counts[kind, n]) for n in range(1, max_n + 1)] for name, kind in KINDS.items()}


def row(pairs: list[list[int]]) -> str:
    return " ".join(f"{h / t:5.2f}" if t else "    -" for h, t in pairs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="target GGUF (default: the default model)")
    ap.add_argument("--prompts", required=True, nargs="+", help="JSONL prompt sets (or folders of them)")
    ap.add_argument("--split", default="all", choices=["all", *SPLITS], help="records of this split only")
    ap.add_argument("--records", default="0:12", help="FIRST:LAST records of each set (after --split)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-n", type=int, default=8, help="the longest match the index tells apart (the draft's)")
    ap.add_argument("--grammar", action="store_true", help="answer under each record's schema or grammar")
    ap.add_argument("--json", help="write the counts here")
    args = ap.parse_args()
    first, last = (int(x) for x in args.records.split(":"))
    pooled: dict = defaultdict(lambda: [0, 0])
    sets = {}
    with Eagle2(args.model, n_threads=args.threads, draft="lookup", budget="fixed") as llm:
        for prompts in load_prompt_sets(args.prompts, last, args.split):
            counts: dict = defaultdict(lambda: [0, 0])
            indices = range(first, min(last, len(prompts.prompts)))
            for i in indices:
                prompt = llm.chat_tokens([{"role": "user", "content": prompts.prompts[i]}])
                grammar = prompts.grammar(i) if args.grammar else None
                llm.reset()
                answer = list(llm.generate(prompt, temp=0.0, max_tokens=args.max_tokens, speculative=False, stop=[],
                                           grammar=grammar))
                tally_answer(prompt, answer, args.max_n, counts)
            for key, (h, t) in counts.items():
                pooled[key][0] += h
                pooled[key][1] += t
            sets[prompts.name] = {"records": len(indices), **rates_table(counts, args.max_n)}
            print(f"{prompts.name:16s} copy   {row(sets[prompts.name]['copy'])}", flush=True)
            print(f"{'':16s} repeat {row(sets[prompts.name]['repeat'])}", flush=True)
    priors = _priors(args.max_n)
    total = rates_table(pooled, args.max_n)
    for name, kind in KINDS.items():
        print(f"{'pooled':16s} {name:6s} {row(total[name])}")
        print(f"{'prior':16s} {name:6s} " + " ".join(f"{p:5.2f}" for p in priors[kind][1:]))
    if args.json:
        report = {"command": "python " + " ".join(shlex.quote(a) for a in sys.argv), "model": args.model,
                  "max_tokens": args.max_tokens, "split": args.split, "records": args.records,
                  "grammar": args.grammar, "n": list(range(1, args.max_n + 1)), "sets": sets, "pooled": total,
                  "priors": {name: [round(float(p), 4) for p in priors[kind][1:]] for name, kind in KINDS.items()}}
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
