"""How far the oracle is out of reach: a rule that reads the draft's confidence, against the oracle and the budget.

    python benchmarks/confidence_reference.py benchmarks/results/oracle-lookup-heldout.json --draft lookup \
        [--probes /tmp/probes-lookup.pkl] [--history 2]

The oracle (benchmarks/oracle.py) knows which round the target will accept. A policy knows only the
draft's ranking and scores. This re-probes the records of a ``budget_replay.py --oracle --json`` report (same
prompts, split and record ranges, T = 0) and prices, on each curve of that report with the costs it recorded, the
oracle's schedule and the hindsight confidence rule's (``oracle.confidence_schedule``: acceptance maps fitted to the
set's own candidates, the best expected rate a round, a model draft's root paid at every position). The budget's
speeds are the report's own. A table per set and curve: budget, confidence rule and oracle speed-ups, and the
shares between them. ``--probes`` keeps the probes (a pickle) to rerun the pricing without decoding again.
``--history K`` adds the rule that also reads the draft's record at the K positions before each round
(``oracle.HistoryAcceptance``: one map per number of first guesses that were right), fitted the same way.
"""

from __future__ import annotations

import argparse
import json
import pickle
from pathlib import Path

from budget_replay import Probed, Recorder, probe  # benchmarks/, beside this script
from curves import load_curves
from oracle import hindsight_acceptance, hindsight_history_acceptance

from eagle2_local import Eagle2
from eagle2_local.bench.prompt_sets import load_prompt_sets
from eagle2_local.tree_policy import CostModel


def probe_report(report: dict, draft: str | None, threads: int) -> dict[str, list[Probed]]:
    """Every set's records of the report, probed (each command of the report names a set and its range)."""
    out: dict[str, list[Probed]] = {}
    recorder = Recorder()
    with Eagle2(None, n_threads=threads, draft=draft, budget="fixed") as llm:
        for command in report["commands"]:
            words = command.split()
            prompts, (first, last) = words[words.index("--prompts") + 1], words[words.index("--records") + 1].split(":")
            for prompt_set in load_prompt_sets([prompts], int(last), report["split"]):
                probes = []
                for i in range(int(first), min(int(last), len(prompt_set.prompts))):
                    messages = [{"role": "user", "content": prompt_set.prompts[i]}]
                    probed, _ = probe(llm, recorder, messages, prompt_set.grammar(i), report["max_tokens"])
                    probes.append(probed)
                    print(f"probed {prompt_set.name} {i}: {probed.n_tokens} tokens", flush=True)
                out[prompt_set.name] = probes
    return out


def recorded_costs(curve_name: str, summary: dict) -> CostModel:
    """The curve as the replay priced it: its verify points, drafting in the proportions the replay recorded."""
    plain = summary["verify_ms"]["1"] / 1e3
    drafting = CostModel([1], [plain], summary["draft_root_ms"] / 1e3, summary["draft_level_ms"] / 1e3)
    return load_curves()[curve_name].cost_model(drafting)


def pooled_speed(schedules) -> float:
    """A set's speed-up: all its schedules' tokens over all their cost (budget_replay.py pools the same way)."""
    schedules = list(schedules)
    return sum(s.tokens for s in schedules) / sum(s.cost for s in schedules)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", help="a budget_replay.py --oracle --json report")
    ap.add_argument("--draft", help="the draft to probe (default: the report's own)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--probes", help="pickle of the probes: read if it exists, else written")
    ap.add_argument("--history", type=int, default=0,
                    help="also price a rule reading the draft's record at this many positions before each round")
    ap.add_argument("--json", help="write the table here")
    args = ap.parse_args()
    report = json.loads(Path(args.report).read_text())
    cache = Path(args.probes) if args.probes else None
    if cache is not None and cache.exists():
        probes = pickle.loads(cache.read_bytes())
    else:
        probes = probe_report(report, args.draft or report.get("draft"), args.threads)
        if cache is not None:
            cache.write_bytes(pickle.dumps(probes))
    rows = []
    extra = f" confidence + last {args.history} / oracle |" if args.history else ""
    print("| set | curve | budget | confidence rule | oracle | budget / oracle | confidence / oracle "
          "| budget / confidence |" + extra)
    print("|---|---|---|---|---|---|---|---|" + ("---|" if args.history else ""))
    for name, by_curve in report["sets"].items():
        for curve_name, summary in by_curve.items():
            records = summary["records"]
            probed = probes[name][:len(records)]
            costs, max_nodes = recorded_costs(curve_name, summary["costs"]), len(probed[0].tables[0].accepted)
            fitted = hindsight_acceptance([t for p in probed for t in p.tables])
            oracle = pooled_speed(p.oracle(costs, max_nodes) for p in probed)
            confidence = pooled_speed(p.confidence(costs, max_nodes, fitted) for p in probed)
            budget = sum(r["tokens"] for r in records) / sum(r["budget_cost"] for r in records)
            row = {"set": name, "curve": curve_name, "budget": round(budget, 3), "confidence": round(confidence, 3),
                   "oracle": round(oracle, 3)}
            cells = ""
            if args.history:
                by_record = hindsight_history_acceptance([p.tables for p in probed], args.history)
                row["confidence_history"] = round(pooled_speed(p.confidence(costs, max_nodes, by_record)
                                                               for p in probed), 3)
                cells = f" {row['confidence_history'] / oracle:.2f} |"
            rows.append(row)
            print(f"| {name} | {curve_name} | {budget:.3f} | {confidence:.3f} | {oracle:.3f} | {budget / oracle:.2f} "
                  f"| {confidence / oracle:.2f} | {budget / confidence:.2f} |" + cells, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"report": args.report, "draft": args.draft, "history": args.history,
                                               "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
