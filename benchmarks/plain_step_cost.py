"""What a plain step costs inside the speculative loop, against plain decoding (issue 44 part 1).

Five ways of decoding the same greedy answer, alternated (in reverse order every other repetition), each timed
on the thread's CPU clock after the first token (the prompt's evaluation left out), so a loaded machine changes
little:

* ``plain``: a plain ``Eagle2`` (no draft, no feature rows): the baseline every benchmark divides by;
* ``head_plain_loop``: the default head's target context (feature rows on) in the plain loop;
* ``head_plain_steps``: the speculative loop with a policy that plans a plain step every round, so the head never
  drafts but the loop does everything else (the lookup's evidence, the policy, the statistics, the backlog);
* ``budget_runs``: the speculative loop with the auto tree budget where no round can pay (its "could this kind of
  round pay at all" verdict held at no), so it decides every round as it does where nothing drafts, with plain runs
  (one decision for several plain steps, ``ProbeSchedule.plain_run``);
* ``budget_every_step``: the same with plain runs off (``max_plain_run`` 1): a decision before every step.

Usage: python benchmarks/plain_step_cost.py [--context-chars 6500] [--max-tokens 64] [--repeat 3] [--threads 1]
[--model GGUF --draft KIND[:PATH]] [--json OUT]

With ``--model`` / ``--draft`` (as ``generate`` takes them; e.g. ``--draft lookup``) the two ``head_*`` ways run on
that model and draft instead of the default model and its head.

At more than one thread llama.cpp's other threads work outside the caller's thread clock: compare the wall-clock
medians then, on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from eagle2_local import Eagle2
from eagle2_local.tree_policy import PLAIN_STEP, RoundPlan, RoundResult

PROMPTS = Path(__file__).resolve().parent / "prompts" / "eagle"
QUESTION = "Write a long story about a dragon who learns to cook."


class AlwaysPlain:
    """A tree policy that never drafts: every round of the speculative loop is a plain step."""

    max_nodes = 1

    def begin_answer(self) -> None:
        pass

    def plan(self, fresh_tokens: int, lookup_rate: float = 0.0) -> RoundPlan:
        return PLAIN_STEP

    def free_plan(self) -> RoundPlan:
        return PLAIN_STEP

    def observe(self, result: RoundResult) -> None:
        pass

    def summary(self) -> None:
        return None


def never_pays(llm: Eagle2) -> None:
    """Hold the auto budget's verdict "could a round of this kind pay at all" at no, for both kinds: the budget
    then plans as it does where nothing drafts (every decision a plain step, or a plain run)."""
    llm.generator.policy._kind_can_pay = lambda kind: False


def runs_allowed(llm: Eagle2, longest: int) -> None:
    """The longest plain run the budget may plan (1: a decision before every step)."""
    llm.generator.policy.schedule.max_plain_run = longest


def passage(chars: int) -> str:
    """The first ``chars`` characters of EAGLE's questions run together (a long context of real text)."""
    texts = [json.loads(line)["turns"][0] for f in sorted(PROMPTS.glob("*.jsonl")) for line in f.open()]
    return " ".join(texts)[:chars]


def ms_per_token(llm: Eagle2, messages: list[dict], max_tokens: int, **kw) -> tuple[float, float]:
    """Thread CPU ms and wall ms per streamed token after the first (the prompt and the first token excluded)."""
    llm.reset()
    first, wall, n = None, 0.0, 0
    for chunk in llm.create_chat_completion(messages, max_tokens=max_tokens, temperature=0, stream=True, **kw):
        if not chunk["choices"][0]["delta"].get("content"):
            continue  # the role chunk comes before the prompt is evaluated
        if first is None:
            first, wall = time.thread_time(), time.perf_counter()
            continue
        n += 1
    return (time.thread_time() - first) / max(n, 1) * 1e3, (time.perf_counter() - wall) / max(n, 1) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context-chars", type=int, default=0, help="characters of passage before the question")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="llama.cpp threads (default 1)")
    ap.add_argument("--model", help="target GGUF (default: the default model)")
    ap.add_argument("--draft", help="as generate --draft names it (default: the model's default draft)")
    ap.add_argument("--json", type=Path, help="write the per-run figures here")
    args = ap.parse_args()
    text = (passage(args.context_chars) + "\n\n" if args.context_chars else "") + QUESTION
    messages = [{"role": "user", "content": text}]
    plain = Eagle2(args.model, plain=True, n_threads=args.threads, n_ctx=4096)
    head = Eagle2(args.model, draft=args.draft, n_threads=args.threads, n_ctx=4096, budget="fixed", total_tokens=60)
    head.generator.policy = AlwaysPlain()
    auto = Eagle2(args.model, draft=args.draft, n_threads=args.threads, n_ctx=4096)
    never_pays(auto)
    longest = auto.generator.policy.schedule.max_plain_run
    ways = {"plain": (plain, {}, None), "head_plain_loop": (head, {"speculative": False}, None),
            "head_plain_steps": (head, {"speculative": True}, None),
            "budget_runs": (auto, {"speculative": True}, lambda: runs_allowed(auto, longest)),
            "budget_every_step": (auto, {"speculative": True}, lambda: runs_allowed(auto, 1))}
    cpu: dict[str, list[float]] = {k: [] for k in ways}
    wall: dict[str, list[float]] = {k: [] for k in ways}
    for rep in range(args.repeat):
        for name, (llm, kw, setup) in (list(ways.items()) if rep % 2 == 0 else list(ways.items())[::-1]):
            if setup is not None:
                setup()
            c, w = ms_per_token(llm, messages, args.max_tokens, **kw)
            cpu[name].append(c)
            wall[name].append(w)
    med_cpu = {k: round(statistics.median(v), 3) for k, v in cpu.items()}
    med_wall = {k: round(statistics.median(v), 3) for k, v in wall.items()}
    out = {"model": args.model, "draft": args.draft, "threads": args.threads, "context_chars": args.context_chars,
           "prompt_tokens_about": len(head.model.tokenize(text)),
           "max_tokens": args.max_tokens, "cpu_ms": {k: [round(x, 3) for x in v] for k, v in cpu.items()},
           "wall_ms": {k: [round(x, 3) for x in v] for k, v in wall.items()}, "median_cpu_ms": med_cpu,
           "median_wall_ms": med_wall,
           "paired_over_plain_wall": {k: round(statistics.median(w / p for w, p in zip(v, wall["plain"])), 4)
                                      for k, v in wall.items() if k != "plain"},
           "steps_over_plain_cpu": round(med_cpu["head_plain_steps"] / med_cpu["plain"], 4),
           "steps_over_plain_wall": round(med_wall["head_plain_steps"] / med_wall["plain"], 4),
           **{f"{way}_over_plain_{clock}": round(med[way] / med["plain"], 4)
              for way in ("budget_runs", "budget_every_step") for clock, med in (("cpu", med_cpu), ("wall", med_wall))}}
    print(json.dumps(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    plain.close()
    head.close()
    auto.close()


if __name__ == "__main__":
    main()
