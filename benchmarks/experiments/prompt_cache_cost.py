"""What reproducible prompt reuse costs on a long chat, against llama-server-style full reuse (cache_prompt).

    python benchmarks/experiments/prompt_cache_cost.py --threads 1 --json benchmarks/results/prompt-cache-1t.json

A chat of several turns (a passage from the vendored `sum` set, then follow-up questions) is answered twice per
repeat, once with each setting, alternating, on one model: the default (the cache reused only where a fresh
evaluation reproduces it; the rest evaluated in aligned PROMPT_CHUNK batches) and ``cache_prompt=True`` (every
cached token reused, the rest in n_batch batches). Per turn it records the prompt tokens, how many were reused
and the prompt-evaluation seconds (medians over repeats); `make_record.py` puts the table in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from eagle2_local import Eagle2
from eagle2_local.bench.harness import machine_info
from eagle2_local.bench.prompt_sets import load_prompt_sets

ROOT = Path(__file__).resolve().parents[2]
FOLLOW_UPS = ["Summarize that in two sentences.", "Who are the people named in it?",
              "What happened first, and what happened last?", "Give it a short title.",
              "What is one question the text leaves open?"]


def one_chat(llm: Eagle2, passage: str, max_tokens: int, cache_prompt: bool) -> list[dict]:
    """The whole chat from an empty cache; per turn: prompt tokens, reused tokens, prompt seconds."""
    llm.reset()
    messages, turns = [], []
    for question in [passage] + FOLLOW_UPS:
        messages.append({"role": "user", "content": question})
        out = llm.create_chat_completion(messages, max_tokens=max_tokens, temperature=0, cache_prompt=cache_prompt)
        st = llm.last_stats
        turns.append({"prompt_tokens": st.prompt_tokens, "reused": st.prompt_tokens_reused,
                      "prefill_s": st.prefill_s, "total_s": st.total_s})
        messages.append(out["choices"][0]["message"])
    return turns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="GGUF target (default: the built-in default model)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--passage", type=int, default=0, help="which prompt of the sum set starts the chat")
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args()
    passage = load_prompt_sets([str(ROOT / "benchmarks" / "prompts" / "eagle" / "sum.jsonl")], None)[0] \
        .prompts[args.passage]
    runs: dict[str, list[list[dict]]] = {"exact": [], "cache_prompt": []}
    with Eagle2(args.model, n_threads=args.threads, plain=True, n_ctx=4096) as llm:
        for _ in range(args.repeat):
            for mode in runs:
                runs[mode].append(one_chat(llm, passage, args.max_tokens, mode == "cache_prompt"))
    n_turns = len(FOLLOW_UPS) + 1
    table = []
    for t in range(n_turns):
        row = {"turn": t + 1}
        for mode, rs in runs.items():
            row[mode] = {"prompt_tokens": rs[0][t]["prompt_tokens"], "reused": rs[0][t]["reused"],
                         "prefill_s": statistics.median(r[t]["prefill_s"] for r in rs)}
        table.append(row)
    totals = {mode: statistics.median(sum(x["prefill_s"] for x in r) for r in rs) for mode, rs in runs.items()}
    chat_s = {mode: statistics.median(sum(x["total_s"] for x in r) for r in rs) for mode, rs in runs.items()}
    report = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine_info(),
              "load_average": os.getloadavg(), "command": "python " + " ".join(sys.argv),
              "threads": args.threads, "max_tokens": args.max_tokens, "repeat": args.repeat, "turns": table,
              "prefill_s_total": totals, "chat_s_total": chat_s}
    for row in table:
        e, c = row["exact"], row["cache_prompt"]
        print(f"turn {row['turn']}: exact reused {e['reused']}/{e['prompt_tokens']} prompt tokens in "
              f"{e['prefill_s'] * 1000:.0f} ms, cache_prompt {c['reused']}/{c['prompt_tokens']} in "
              f"{c['prefill_s'] * 1000:.0f} ms")
    print(f"prompt time over the chat: exact {totals['exact']:.2f} s, cache_prompt {totals['cache_prompt']:.2f} s; "
          f"whole chat {chat_s['exact']:.2f} s vs {chat_s['cache_prompt']:.2f} s")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"({time.perf_counter() - start:.0f} s)", file=sys.stderr)
