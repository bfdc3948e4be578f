"""The auto budget's decisions with the clock taken out: each answer's rounds priced on the calibrated cost curve.

    python benchmarks/budget_replay.py --model models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --draft lookup \
        --prompts benchmarks/prompts/code_edit_short.jsonl --records 0:12 [--threads 1] [--depth 16]
    python benchmarks/budget_replay.py --prompts benchmarks/prompts/*.jsonl --split heldout --records 0:4 \
        --curve all --oracle --json benchmarks/results/oracle-default.json

A bench on a shared machine measures the load as much as the policy: the budget's cost model follows the plain
steps it observes and its guards judge realised round times. Here the cost model stays as calibrated (the cached
curve for these settings, adopted without the start-up check), every round and plain step "takes" its calibrated
time, and each prompt's speed is its tokens over the sum of its rounds' costs in plain steps (a plain step costs
1). The decisions then depend on the answers and on the few times the budget still reads from the round's own
clock (the model draft's deeper levels, a lookup round's drafting, the decode of a round that kept its root alone),
so a decision near a threshold may differ between runs; ``--counter-clock`` replaces the generator's clock by a
counter (0.1 ms a reading), and then they depend on the answers alone: two versions of the policy can be compared
on a busy machine (run each with ``PYTHONPATH`` at its checkout). It is a model, not a speed: host time and the
noise of real passes are left out; a bench on an idle machine has the last word.

``--curve NAME`` (repeatable; ``all``: every curve benchmarks/curves.json records for the model's file) replaces
the calibration by a recorded machine's curve, so the budget is judged on machines it does not run on; drafting
costs are the curve's record's, else this machine's calibration's in proportion to its plain step.

``--oracle`` judges the budget against the best schedule in hindsight (benchmarks/oracle.py). A
probe run decodes each answer plainly (T = 0) while the draft grows its full tree at every position, through the
runtime's own loop and tree code; what a tree of n nodes from its ranking would accept there is read off the
known answer, and dynamic programming finds the least cost on the same curve. Costs on both sides: c(n) for the
verification, plus the model draft's root and levels (the curve's drafting costs) for a round with a model
node; lookup and forced nodes draft free, and a backlog catch-up's extra cost is left out on both sides. The
speeds are reported per record and per set (tokens over cost, pooled), with the budget's share of the oracle's.

``--fresh`` answers each record after ``Eagle2.reset()``, as ``bench`` runs them: the lookup's learned rates then
start at its priors in every answer (without it the records of a set follow each other in one conversation's
object, as a server's requests do, and the rates carry from answer to answer at the priors' weight).

``--turns all`` replays every user turn of a multi-turn record (mt_bench's second turns, long_chat), each after
the mode's own earlier answers as ``bench`` runs a chat; by default only the first turn, as reports before it did.

``--depth`` other than the calibrated one reuses the calibration made at ``--calibrated-depth`` (a lookup's costs
do not depend on its depth); with no calibration cached for these settings one is made first (minutes).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import platform
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
from curves import Curve, curves_for, load_curves  # benchmarks/curves.py, beside this script
from oracle import (HistoryAcceptance, Schedule, SizeTable, best_schedule, confidence_schedule, hindsight_acceptance,
                    size_table)

from eagle2_local import Eagle2
from eagle2_local.bench.prompt_sets import SPLITS, load_prompt_sets
from eagle2_local.formats.models import default_model_path
from eagle2_local.measure import cost_cache
from eagle2_local.tree.draft_tree import Candidates
from eagle2_local.tree_policy import CostModel, RoundPlan, RoundResult, TreeBudget
from eagle2_local.tree_policy.learning import calibrated_round_s
from eagle2_local.tree_policy.sizing import SourceAcceptance

T = TypeVar("T")
TURN_JOIN = "\x00"  # between a chat's answers in a replayed record's text (and the set's answers hash)
Supply = Callable[[cost_cache.CostKey, Callable[[], CostModel]], CostModel]  # Eagle2(costs=...)


def freeze_time(budget: TreeBudget) -> None:
    """Costs stay as calibrated (``CostModel.frozen``); rounds and plain steps are observed at their calibrated cost,
    a model round's drafting included, as :func:`round_cost` prices it (``TreeBudget.calibrated_time``: the guard and
    the exploration account judge what the report charges). What deciding a plain step took is the generator's
    clock's (--counter-clock: a tenth of a ms a reading), so plain runs are planned as the live loop plans them."""
    budget.costs.frozen = True
    budget.calibrated_time = True


def counter_clock() -> Callable[[], float]:
    """A clock that advances 0.1 ms a reading: round times that depend on the loop's calls alone."""
    readings = itertools.count()
    return lambda: next(readings) * 1e-4


def calibration(depth: int) -> Supply:
    """This machine's calibration for ``Eagle2(costs=...)``: the one cached for the key, else the one cached at
    ``depth`` (a lookup's costs do not depend on its depth), else measured and cached; at most once per process (a
    calibration disturbed by other load is not cached on disk, and each model the replay opens would measure again,
    and differently), and a model of its own for each budget."""
    memo: dict[str, CostModel] = {}

    def costs(key: cost_cache.CostKey, measure: Callable[[], CostModel]) -> CostModel:
        name = key.file_name()
        if name not in memo:
            at_depth = cost_cache.CostKey(**{**key.__dict__, "extra": {**key.extra, "depth": depth}})
            cached = cost_cache.load_costs(key) or cost_cache.load_costs(at_depth)
            memo[name] = cached if cached is not None else cost_cache.cached_or_measured(key, measure)[0]
        return CostModel.from_dict(memo[name].to_dict())

    return costs


@dataclass
class Replayed:
    """One answer under the auto budget: each round as (nodes verified, tokens emitted, draft levels grown, the
    model draft ran), and the answer's text."""

    rounds: list[tuple[int, int, int, bool]]
    text: str

    @property
    def tokens(self) -> int:
        return sum(emitted for _, emitted, _, _ in self.rounds)

    def cost(self, costs: CostModel, drafting: bool = True) -> float:
        """Plain steps the rounds cost on ``costs`` (verification; with ``drafting``, the model draft's too)."""
        return sum(round_cost(costs, n, levels if drafting and model else 0) for n, _, levels, model in self.rounds)

    def trees(self) -> dict[int, int]:
        """Rounds per tree size (plain steps left out)."""
        return _counts(n for n, _, _, _ in self.rounds)

    def by_kind(self, costs: CostModel) -> dict[str, dict]:
        """Rounds that were not plain steps, by kind: ``model`` (a tree the model draft grew, lookup nodes merged in
        or not), ``lookup`` (lookup or forced nodes alone, drafted free) and ``peek`` (the model draft ran, the root
        was verified alone): each kind's rounds, tokens emitted and cost in plain steps, so a loss can be traced to
        the kind of round that made it (a kind pays where its tokens exceed its cost)."""
        out: dict[str, dict] = {}
        for n, emitted, levels, model in self.rounds:
            kind = ("model" if n > 1 else "peek") if model else ("lookup" if n > 1 else None)
            if kind is not None:
                _add_kind(out, kind, 1, emitted, round_cost(costs, n, levels if model else 0))
        return _rounded(out)


def _counts(sizes) -> dict[int, int]:
    """Rounds per tree size, plain steps (size 1) left out."""
    out: dict[int, int] = {}
    for n in sizes:
        if n > 1:
            out[n] = out.get(n, 0) + 1
    return dict(sorted(out.items()))


def round_cost(costs: CostModel, n: int, levels: int) -> float:
    """A round of n nodes whose model draft grew ``levels`` levels (0: no model draft ran), in plain steps: what
    the frozen budget is told it took (``calibrated_round_s``)."""
    return calibrated_round_s(costs, n, levels) / float(costs.verify_s(1))


class Recorder:
    """Hears the generation loop (a :class:`~eagle2_local.generation.listeners.RoundListener`): each round's
    result, each token batch emitted, each tree's candidates."""

    def __init__(self) -> None:
        self.rounds: list[RoundResult] = []
        self.emitted: list[int] = []
        self.candidates: list[tuple] = []

    def round(self, result: RoundResult) -> None:
        self.rounds.append(result)

    def tokens(self, tokens: list[int]) -> None:
        self.emitted.extend(int(t) for t in tokens)

    def tree(self, root: int, c: Candidates) -> None:
        self.candidates.append((root, c.tokens.copy(), c.scores.copy(), c.parents.copy(),
                                None if c.sources is None else c.sources.copy()))

    def listen(self, llm: Eagle2) -> None:
        """Hear ``llm``'s next answer alone (what was heard before is forgotten)."""
        llm.generator.listener = self
        self.rounds.clear()
        self.emitted.clear()
        self.candidates.clear()


class Probe:
    """A tree policy that has the draft grow its full tree every round and verifies the root alone: the answer is
    plain decoding's, and every position's candidates are seen (a :class:`~eagle2_local.tree_policy.TreePolicy`)."""

    def __init__(self, max_nodes: int, max_depth: int) -> None:
        self.max_nodes, self.max_depth = max_nodes, max_depth

    def plan(self, fresh_tokens: int = 1, lookup_rate: float = 0.0) -> RoundPlan:
        return RoundPlan(drafts=True, max_nodes=self.max_nodes, max_depth=self.max_depth,
                         size=lambda scores, times, sources=None: 1)

    free_plan = plan

    def observe(self, result) -> None:
        pass

    def begin_answer(self) -> None:
        pass

    def summary(self) -> None:
        return None


@dataclass
class Probed:
    """One answer decoded plainly under the :class:`Probe`: its tokens emitted after the first and, per state
    (tokens emitted so far), what trees of 1..N nodes would have done (oracle.SizeTable)."""

    n_tokens: int
    tables: list[SizeTable | None]

    def priced(self, costs: CostModel, max_nodes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per state and size: tokens accepted and drafting cost (the model draft's, grown to the tree's depth, for
        trees with a model node), with the verify costs c(n) of ``costs``, in plain steps."""
        acc = np.zeros((self.n_tokens, max_nodes), dtype=np.int64)
        draft = np.zeros(acc.shape)
        plain = float(costs.verify_s(1))
        for i, table in enumerate(self.tables):
            if table is not None:
                acc[i] = table.accepted
                draft[i] = [costs.draft_s(int(d)) / plain if m else 0.0 for d, m in zip(table.depth, table.model)]
        return acc, draft, costs.shape(np.arange(1, max_nodes + 1))

    def oracle(self, costs: CostModel, max_nodes: int) -> Schedule:
        """The best schedule on ``costs``: verification c(n) plus the model draft's cost for trees with a model
        node, grown to the tree's depth."""
        acc, draft, verify = self.priced(costs, max_nodes)
        return best_schedule(acc, verify, draft)

    def confidence(self, costs: CostModel, max_nodes: int,
                   acceptance: SourceAcceptance | HistoryAcceptance) -> Schedule:
        """The hindsight confidence rule's schedule (oracle.confidence_schedule) on ``costs``; a draft with a model
        part pays its root to be read at every position."""
        _, draft, verify = self.priced(costs, max_nodes)
        model = any(t is not None and t.model.any() for t in self.tables)
        peek = costs.draft_s(1) / float(costs.verify_s(1)) if model else 0.0
        return confidence_schedule(self.tables, acceptance, verify, draft, peek)


def probe(llm: Eagle2, recorder: Recorder, messages: list[dict], grammar, max_tokens: int) -> tuple[Probed, str]:
    """Decode one answer under the :class:`Probe` and tabulate every position's trees against it."""
    p = llm.tree_params
    llm.generator.policy = Probe(p.total_tokens, p.depth)
    recorder.listen(llm)
    out = llm.create_chat_completion(messages, max_tokens=max_tokens, temperature=0.0, grammar=grammar)
    seq = np.asarray(recorder.emitted, dtype=np.int64)  # the first token, then one a round
    n_tokens = len(recorder.rounds)
    if len(seq) != n_tokens + 1:
        raise RuntimeError(f"the probe emitted {len(seq)} tokens in {n_tokens} rounds: not one a round")
    tables: list[SizeTable | None] = [None] * n_tokens
    for i, (root, tok, score, parent, sources) in enumerate(recorder.candidates):
        if root != seq[i]:
            raise RuntimeError(f"round {i} drafted from {root}, not the answer's token {seq[i]}")
        tables[i] = size_table(root, tok, score, parent, sources, seq[i + 1:], p.total_tokens)
    return Probed(n_tokens, tables), out["choices"][0]["message"]["content"]


def each_turn(turns: list[str], answer: Callable[[list[dict]], tuple[T, str]]) -> tuple[list[T], str]:
    """Answer a chat's user turns in order, each after the earlier answers (``answer(messages)`` -> its result and
    text, as bench's modes answer a chat): the results, and the answers joined by :data:`TURN_JOIN`."""
    messages: list[dict] = []
    results, texts = [], []
    for turn in turns:
        messages.append({"role": "user", "content": turn})
        result, text = answer(messages)
        results.append(result)
        texts.append(text)
        messages.append({"role": "assistant", "content": text})
    return results, TURN_JOIN.join(texts)


def probe_chat(llm: Eagle2, recorder: Recorder, turns: list[str], grammar,
               max_tokens: int) -> tuple[list[Probed], str]:
    """:func:`probe` each user turn after the probe's own earlier answers (plain decoding's)."""
    return each_turn(turns, lambda messages: probe(llm, recorder, messages, grammar, max_tokens))


def replay(llm: Eagle2, recorder: Recorder, messages: list[dict], grammar, max_tokens: int) -> Replayed:
    """One answer under the auto budget, its rounds recorded."""
    recorder.listen(llm)
    out = llm.create_chat_completion(messages, max_tokens=max_tokens, temperature=0.0, grammar=grammar)
    rounds = [(r.n_nodes if r.plan.drafts else 1, r.n_emitted, len(r.times.levels),
               r.plan.drafts and not r.plan.free_only) for r in recorder.rounds]
    return Replayed(rounds, out["choices"][0]["message"]["content"])


def replay_chat(llm: Eagle2, recorder: Recorder, turns: list[str], grammar, max_tokens: int) -> Replayed:
    """Every user turn under the auto budget, each after its own earlier answers: the turns' rounds in order and
    their answers joined."""

    def answer(messages: list[dict]) -> tuple[Replayed, str]:
        done = replay(llm, recorder, messages, grammar, max_tokens)
        return done, done.text

    done, text = each_turn(turns, answer)
    return Replayed([r for one in done for r in one.rounds], text)


def joined(schedules: list[Schedule]) -> Schedule:
    """The schedules of a chat's answers as one: their tokens and costs added, their rounds in order."""
    return Schedule(sum(s.tokens for s in schedules), sum(s.cost for s in schedules),
                    tuple(n for s in schedules for n in s.sizes))


def curve_costs(calibrated: Supply, curve: Curve | None) -> Supply:
    """The budget's costs (``Eagle2(costs=...)``): this machine's calibration (``calibrated``), or a recorded
    ``curve`` with drafting costs from its record or in this calibration's proportions."""

    def costs(key: cost_cache.CostKey, measure: Callable[[], CostModel]) -> CostModel:
        if curve is not None and curve.draft is not None:  # nothing to take from this machine
            return curve.cost_model()
        here = calibrated(key, measure)
        return here if curve is None else curve.cost_model(here)

    return costs


def speed(tokens: int, cost: float) -> float:
    """Tokens per plain step of cost (1.0 for an answer without rounds)."""
    return round(tokens / cost, 4) if cost > 0 else 1.0


def set_summary(records: list[dict], oracle: bool) -> dict:
    """A set's speeds pooled (all its tokens over all its cost), the budget's median, and against the oracle: the
    budget's share of its speed and of its gain over plain steps, the worst record's share, and the records where
    the oracle drafts nothing, with how many of those the budget drafted in."""
    tokens = sum(r["tokens"] for r in records)
    out = {"budget": speed(tokens, sum(r["budget_cost"] for r in records)),
           "budget_median": round(float(np.median([r["budget"] for r in records])), 4),
           "verify_only_median": round(float(np.median([r["budget_verify_only"] for r in records])), 4),
           "kinds": _pooled_kinds(records)}
    if oracle:
        out["oracle"] = speed(sum(r["oracle_tokens"] for r in records), sum(r["oracle_cost"] for r in records))
        out["share"] = round(out["budget"] / out["oracle"], 4)
        gain = out["oracle"] - 1.0
        out["gain_share"] = round((out["budget"] - 1.0) / gain, 4) if gain > 1e-9 else None
        out["min_record_share"] = min(r["share"] for r in records)
        out["oracle_plain_records"] = sum(r["oracle_trees"] == 0 for r in records)
        out["budget_drafted_there"] = sum(r["oracle_trees"] == 0 and r["budget_trees"] > 0 for r in records)
        out["confidence"] = speed(sum(r["confidence_tokens"] for r in records),
                                  sum(r["confidence_cost"] for r in records))
        out["confidence_share"] = round(out["budget"] / out["confidence"], 4)
        out["confidence_of_oracle"] = round(out["confidence"] / out["oracle"], 4)
    return out


def _add_kind(out: dict[str, dict], kind: str, rounds: int, tokens: int, cost: float) -> None:
    """Add rounds of ``kind`` (their count, tokens emitted and cost in plain steps) to a tally by kind."""
    k = out.setdefault(kind, {"rounds": 0, "tokens": 0, "cost": 0.0})
    k["rounds"] += rounds
    k["tokens"] += tokens
    k["cost"] += cost


def _rounded(kinds: dict[str, dict]) -> dict[str, dict]:
    """A tally by kind with its costs rounded for the report (summed unrounded)."""
    return {kind: {**k, "cost": round(k["cost"], 4)} for kind, k in kinds.items()}


def _pooled_kinds(records: list[dict]) -> dict[str, dict]:
    """The records' rounds by kind (:meth:`Replayed.by_kind`) summed over the set."""
    out: dict[str, dict] = {}
    for r in records:
        for kind, k in r.get("kinds", {}).items():
            _add_kind(out, kind, k["rounds"], k["tokens"], k["cost"])
    return _rounded(out)


def record_line(name: str, i: int, rec: dict) -> str:
    line = (f"{name:16s} {i:3d} tokens {rec['tokens']:4d} budget {rec['budget']:.3f} "
            f"(verify only {rec['budget_verify_only']:.3f}) trees {rec['budget_trees']:3d}")
    for kind, k in rec.get("kinds", {}).items():
        line += f" {kind} {k['rounds']}r {k['tokens']}t/{k['cost']:.1f}"
    if "oracle" in rec:
        line += f" | oracle {rec['oracle']:.3f} trees {rec['oracle_trees']:3d} share {rec['share']:.3f}"
        line += f" | confidence {rec['confidence']:.3f} trees {rec['confidence_trees']:3d}"
    return line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="target GGUF (default: the default model)")
    ap.add_argument("--draft", help="as generate --draft names it (default: the model's default draft)")
    ap.add_argument("--prompts", required=True, nargs="+", help="JSONL prompt sets (or folders of them)")
    ap.add_argument("--split", default="all", choices=["all", *SPLITS], help="records of this split only")
    ap.add_argument("--records", default="0:12", help="FIRST:LAST records of each set (after --split; default 0:12)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--depth", type=int, default=None, help="draft levels (default: the API's default)")
    ap.add_argument("--calibrated-depth", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--turns", default="first", choices=["first", "all"],
                    help="a multi-turn record's first user turn only (default), or every turn after the mode's own "
                         "earlier answers, as bench runs them (each answer at most --max-tokens)")
    ap.add_argument("--curve", action="append", default=[],
                    help="a curve of benchmarks/curves.json (repeatable; 'all': the model's; default: calibrated)")
    ap.add_argument("--oracle", action="store_true", help="judge the budget against the best schedule in hindsight")
    ap.add_argument("--fresh", action="store_true",
                    help="each record after Eagle2.reset(), as bench runs them (lookup rates start at the priors)")
    ap.add_argument("--json", help="write the per-record and per-set results here")
    ap.add_argument("--counter-clock", action="store_true",
                    help="the generator's clock advances 0.1 ms a reading: decisions that depend on the answers alone")
    args = ap.parse_args()
    first, last = (int(x) for x in args.records.split(":"))
    calibrated = calibration(args.calibrated_depth)
    recorder = Recorder()
    model_file = str(args.model or default_model_path())
    curves: list[Curve | None] = [None]
    if args.curve:
        known = load_curves()
        curves = curves_for(model_file) if args.curve == ["all"] else [known[n] for n in args.curve]
        if not curves:
            raise SystemExit(f"no curve recorded for {model_file} in benchmarks/curves.json")
    opened = dict(n_threads=args.threads, draft=args.draft, budget="auto", depth=args.depth)
    results: dict = {}
    for prompts in load_prompt_sets(args.prompts, last, args.split):
        indices = list(range(first, min(last, len(prompts.prompts))))
        chats = [(prompts.turns(i) if args.turns == "all" else prompts.turns(i)[:1], prompts.grammar(i))
                 for i in indices]
        probes = []
        if args.oracle:  # the probe replaces the policy: a fixed tree's, which needs no calibration
            with Eagle2(args.model, **{**opened, "budget": "fixed"}) as llm:
                for turns, g in chats:
                    if args.fresh:
                        llm.reset()
                    probes.append(probe_chat(llm, recorder, turns, g, args.max_tokens))
        fitted = hindsight_acceptance([t for probed, _ in probes for one in probed for t in one.tables])
        for curve in curves:
            name = "calibrated" if curve is None else curve.name
            records, texts = [], []
            with Eagle2(args.model, **opened, costs=curve_costs(calibrated, curve)) as llm:
                freeze_time(llm.generator.policy)
                if args.counter_clock:
                    llm.generator.clock = counter_clock()
                llm.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=4, temperature=0.0)
                costs, max_nodes = llm.generator.policy.costs, llm.tree_params.total_tokens
                for k, (turns, grammar) in enumerate(chats):
                    if args.fresh:
                        llm.reset()
                    done = replay_chat(llm, recorder, turns, grammar, args.max_tokens)
                    texts.append(done.text)
                    cost = done.cost(costs)
                    rec = {"record": indices[k], "tokens": done.tokens, "budget_cost": round(cost, 4),
                           "budget": speed(done.tokens, cost),
                           "budget_verify_only": speed(done.tokens, done.cost(costs, drafting=False)),
                           "budget_trees": sum(done.trees().values()), "trees": done.trees(),
                           "kinds": done.by_kind(costs)}
                    if probes:
                        probed, plain_text = probes[k]
                        best = joined([one.oracle(costs, max_nodes) for one in probed])
                        rec.update(oracle_tokens=best.tokens, oracle_cost=round(best.cost, 4),
                                   oracle=speed(best.tokens, best.cost), oracle_trees=best.drafted_rounds,
                                   oracle_sizes=_counts(best.sizes), same_answer=done.text == plain_text)
                        rec["share"] = round(rec["budget"] / rec["oracle"], 4)
                        ref = joined([one.confidence(costs, max_nodes, fitted) for one in probed])
                        rec.update(confidence_tokens=ref.tokens, confidence_cost=round(ref.cost, 4),
                                   confidence=speed(ref.tokens, ref.cost), confidence_trees=ref.drafted_rounds,
                                   confidence_share=round(rec["budget"] / speed(ref.tokens, ref.cost), 4))
                    records.append(rec)
                    print(record_line(prompts.name, indices[k], rec), flush=True)
            summary = {**set_summary(records, args.oracle), "costs": costs.summary(), "records": records,
                       "answers_sha256": hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:16]}
            results.setdefault(prompts.name, {})[name] = summary
            print(json.dumps({"set": prompts.name, "curve": name,
                              **{k: v for k, v in summary.items() if k not in ("records", "costs")}}), flush=True)
    if args.json:
        report = {"command": "python " + " ".join(shlex.quote(a) for a in sys.argv), "model": model_file,
                  "draft": args.draft, "threads": args.threads, "max_tokens": args.max_tokens, "split": args.split,
                  "turns": args.turns,
                  "records": args.records, "machine": {"cpu": platform.processor() or platform.machine()},
                  "curves": {c.name: {"machine": c.machine, "context": c.context, "source": c.source}
                             for c in curves if c is not None},
                  "sets": results}
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
