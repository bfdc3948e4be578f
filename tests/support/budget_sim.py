"""A simulated machine for the tree budget: true plain-step, verify and draft times (times a load factor the test
varies), a draft whose acceptance follows its path confidence, and a fake clock that only the simulation moves.
``run`` drives a TreeBudget exactly as the generation loop does (one plan, one result per round), so budget decisions and their
realised throughput can be tested deterministically, without llama.cpp and without timing anything."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from eagle2_local.tree.proposals import LOOKUP, MODEL
from eagle2_local.tree_policy import RoundResult, RoundTimes, TreeBudget

# SmolLM2-135M with the default head on this 2-core CPU, 2 threads (NOTES.md#the-tree-budget): verify of n nodes
# in plain steps, plain step 7.6 ms, draft root 1.8 ms, draft level 6.3 ms. No tree pays here.
CPU_SIZES = [1, 2, 3, 4, 8, 16, 32, 60]
CPU_SHAPE = [1.0, 1.80, 2.24, 3.05, 5.17, 9.46, 15.9, 27.4]
# A calibration poisoned by load: verify seconds measured while other work kept both cores busy.
POISONED_SIZES = [1, 2, 3, 32, 60]
POISONED_VERIFY = [3.04, 2.90, 0.12, 3.16, 2.69]


@dataclass
class World:
    plain_s: float = 0.0076
    sizes: list[int] = field(default_factory=lambda: list(CPU_SIZES))
    shape: list[float] = field(default_factory=lambda: list(CPU_SHAPE))
    root_s: float = 0.0018
    level_s: float = 0.0063
    token_s: float | None = None  # catch-up seconds per backlog token (None: 5% of the root's)
    accept_power: float = 1.0  # acceptance = exp(score) ** power: 1 = a calibrated draft
    load: float = 1.0
    now: float = 0.0
    # lookup branches (a merged draft's free part, or a lookup draft): in a round, with probability copy_rate
    # the text holds a match, proposed as a chain of max_depth tokens at the lookup's own confidence lookup_p
    # each (also the evidence the budget's plan hears), each really right (given its parent) with probability
    # copy_p; asking the lookup costs look_s
    copy_rate: float = 0.0
    lookup_p: float = 0.9
    copy_p: float = 0.95
    look_s: float = 0.0

    def clock(self) -> float:
        return self.now

    def catch_up_time(self, fresh: int) -> float:
        """The draft ingesting ``fresh`` tokens, the root included."""
        per_token = 0.05 * self.root_s if self.token_s is None else self.token_s
        return self.load * (self.root_s + per_token * (fresh - 1))

    def plain_time(self) -> float:
        return self.load * self.plain_s

    def verify_time(self, n: int) -> float:
        return self.load * self.plain_s * float(np.interp(n, self.sizes, self.shape))


@dataclass
class Tally:
    tree_rounds: list[bool] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)

    def rate(self, start: int = 0) -> float:
        return sum(self.tokens[start:]) / sum(self.seconds[start:])

    def tree_share(self, start: int = 0) -> float:
        return float(np.mean(self.tree_rounds[start:]))


def level_scores(rng: np.random.Generator, k: int = 10, depth: int = 6) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per level: the level's candidate scores and its frontier (the k best), EAGLE-2-like on a peaked draft."""
    frontier = np.zeros(1)
    out = []
    for _ in range(depth):
        child = np.log(np.sort(rng.dirichlet(np.full(k, 0.05), len(frontier)), axis=1)[:, ::-1] + 1e-300)
        cum = (frontier[:, None] + child).ravel()
        frontier = np.sort(cum)[::-1][:k]
        out.append((cum, frontier))
    return out


def lookup_chain(world: World, rng: np.random.Generator, depth: int) -> tuple[np.ndarray, int]:
    """One round's lookup proposals (a chain's path scores; empty without a match) and how many of its tokens
    the target would accept."""
    if world.copy_rate <= 0 or rng.random() >= world.copy_rate:
        return np.zeros(0), 0
    right = rng.random(depth) < world.copy_p
    return np.log(world.lookup_p) * np.arange(1, depth + 1), int(np.argmin(right)) if not right.all() else depth


def run(budget: TreeBudget, world: World, rounds: int, rng: np.random.Generator, tally: Tally | None = None,
        load_at=None, prompt: int = 1, model_draft: bool = True) -> Tally:
    """``rounds`` rounds of the speculative loop on ``world``; ``load_at(i)`` may set the load per round;
    ``prompt``: the tokens the draft has not read when the loop starts (a new prompt's length);
    ``model_draft`` False: the draft is a lookup alone."""
    tally = tally or Tally()
    fresh = prompt
    for i in range(rounds):
        if load_at is not None:
            world.load = load_at(i)
        t0 = world.now
        # whether the text holds a match this round, known before the plan: the lookup's evidence (its rate)
        chain, copied = lookup_chain(world, rng, budget.max_depth)
        plan = budget.plan(fresh, world.lookup_p if len(chain) else 0.0)
        times = RoundTimes(start=world.now)
        if plan.drafts:
            world.now += world.look_s * world.load
            cands, sources, d = np.zeros(0), np.zeros(0, dtype=np.int8), 0
            if plan.free_only or not model_draft:  # the lookup alone: its catch-up costs nothing
                times.levels.append(world.now)
            else:
                world.now += world.catch_up_time(fresh)  # grows with the backlog
                for d, (scores, frontier) in enumerate(level_scores(rng, depth=budget.max_depth), start=1):
                    if d > 1:
                        world.now += world.load * world.level_s
                    cands = np.concatenate([cands, scores])
                    times.levels.append(world.now)
                    if not plan.go_deeper(cands, frontier, d, times):
                        break
                sources = np.zeros(len(cands), dtype=np.int8)
            cands = np.concatenate([cands, chain])
            sources = np.concatenate([sources, np.full(len(chain), LOOKUP, dtype=np.int8)])
            n = plan.nodes(cands, times, sources)
            order = np.lexsort((np.arange(len(cands)), -cands))[:n - 1]
            chosen, chosen_src = cands[order], sources[order]
            times.drafted = world.now
            world.now += world.verify_time(n) if n > 1 else world.plain_time()
            times.verified = times.done = world.now
            model = chosen_src == MODEL
            accepted = np.zeros(len(chosen), dtype=bool)
            accepted[model] = rng.random(int(model.sum())) < np.exp(chosen[model]) ** world.accept_power
            in_chain = np.flatnonzero(~model)  # the chain's kept nodes, best (shallowest) first
            accepted[in_chain[:copied]] = True
            emitted = 1 + max(min(int(accepted[model].sum()), d), min(copied, len(in_chain)))
            budget.observe(RoundResult(plan, times, emitted, chosen, chosen_src, accepted))
            tally.tree_rounds.append(n > 1)
            tally.sizes.append(n)
            fresh = 1
        else:
            times.drafted = world.now
            world.now += world.plain_time()
            times.verified = times.done = world.now
            budget.observe(RoundResult(plan, times))
            emitted = 1
            tally.tree_rounds.append(False)
            fresh += 1
        tally.tokens.append(emitted)
        tally.seconds.append(world.now - t0)
    return tally
