"""The auto budget's tests share: cost curves (``flat``: GPU-like, ``steep``: this CPU's), rounds observed as the
generator reports them, simulated machines (``LOADED``, ``GPU``, ``QWEN_CPU``) and answers on them; and the budget's
state set directly, where the package sets it only from rounds: a test starts from "this kind of round wins" or
"loses" without playing the rounds that would lead there."""

from __future__ import annotations

import numpy as np

from eagle2_local.tree.proposals import LOOKUP
from eagle2_local.tree_policy import PLAIN_STEP, CostModel, RoundPlan, RoundResult, RoundTimes, TreeBudget
from tests.support.budget_sim import CPU_SIZES, Tally, World, run

SIZES = [1, 2, 4, 8, 16, 32, 64]
STEEP = [1.0, 1.77, 2.72, 4.45, 7.94, 15.0, 28.1]  # SmolLM2 on this 2-core CPU (docs/design.md §4), x one token


def flat(one_token: float = 0.010, draft_level: float = 0.0005) -> CostModel:
    """GPU-like: 64 nodes cost what one token costs; a cheap head drafts."""
    return CostModel(SIZES, [one_token * (1 + 0.002 * n) for n in SIZES], draft_level, draft_level)


def steep(one_token: float = 0.009, draft_root: float = 0.001, draft_level: float = 0.002) -> CostModel:
    return CostModel(SIZES, [one_token * c for c in STEEP], draft_root, draft_level)


def eagle_like_scores(rng: np.random.Generator, k: int = 10, depth: int = 6) -> np.ndarray:
    """Candidate scores of an EAGLE-2 tree grown on a peaked synthetic draft: each node's children take
    probabilities from a Dirichlet draw (a level's mass sums to at most its parents'), the k best paths go on."""
    frontier = np.zeros(1)
    scores = []
    for _ in range(depth):
        child = np.log(np.sort(rng.dirichlet(np.full(k, 0.05), len(frontier)), axis=1)[:, ::-1] + 1e-300)
        cum = (frontier[:, None] + child).ravel()
        scores.append(cum)
        frontier = np.sort(cum)[::-1][:k]
    return np.sort(np.concatenate(scores))[::-1]


def observe_plain(budget: TreeBudget, seconds: float) -> None:
    """A plain step of ``seconds``, as the generator reports it."""
    budget.observe(RoundResult(PLAIN_STEP, RoundTimes(0.0, drafted=0.0, verified=seconds, done=seconds)))


def observe_tree(budget: TreeBudget, plan: RoundPlan, times: RoundTimes, scores: np.ndarray, accepted: np.ndarray,
                 verify_s: float, emitted: int) -> None:
    """A drafted round: ``times`` as the draft left them, then a verification of ``verify_s`` seconds."""
    times.drafted = times.levels[-1] if times.levels else times.start
    times.verified = times.done = times.drafted + verify_s
    budget.observe(RoundResult(plan, times, emitted, scores, accepted=np.asarray(accepted)))


def wants_tree(budget: TreeBudget, fresh_tokens: int = 1) -> bool:
    return budget.plan(fresh_tokens).drafts


def slower_after_trees(costs: CostModel, first: float = 0.08, second: float = 0.04) -> CostModel:
    """``costs`` after plain steps of 10 ms, three times the first and second after a tree slower by ``first`` and
    ``second`` of a step."""
    for _ in range(9):
        costs.observe_plain(0.010)
    for _ in range(3):
        costs.observe_plain(0.010 * (1 + first), after_tree=1)
        costs.observe_plain(0.010 * (1 + second), after_tree=2)
        costs.observe_plain(0.010)
    return costs


def sealed_merged_budget(model_draft: bool = True) -> TreeBudget:
    """A head + lookup budget (the head too dear to draft; ``model_draft`` False: the lookup alone) whose lookup
    map learned, from chains that missed, that no chain pays."""
    budget = TreeBudget(steep(draft_root=0.009, draft_level=0.045), max_nodes=60, max_depth=6, free_lookup=True,
                        model_draft=model_draft)
    observe_plain(budget, 0.009)
    missed = np.linspace(-0.99, -0.0001, 200)
    budget.acceptance.observe(missed, np.full(200, LOOKUP, dtype=np.int8), np.zeros(200, dtype=bool))
    budget.begin_answer()
    assert budget.sealed() and not budget.sure_lookup(0.95)
    return budget


def observe_lookup_chain(budget: TreeBudget, plan: RoundPlan, scores: np.ndarray, accepted: np.ndarray) -> None:
    """A lookup round verifying a chain of lookup nodes in its calibrated time."""
    n = len(scores) + 1
    times = RoundTimes(0.0, levels=[0.0])
    times.drafted = 0.0
    times.verified = times.done = float(budget.costs.verify_s(n))
    emitted = int(np.cumprod(accepted).sum()) + 1
    budget.observe(RoundResult(plan, times, emitted, scores, np.full(n - 1, LOOKUP, dtype=np.int8),
                               np.asarray(accepted)))


def run_budget(costs: CostModel, world: World, rounds: int = 600, seed: int = 0, **kw) -> tuple[TreeBudget, Tally]:
    budget = TreeBudget(costs, max_nodes=60, max_depth=6, **kw)
    return budget, run(budget, world, rounds, np.random.default_rng(seed))


# ------------------------------------------------------------------ a long prompt's catch-up (the catch-up rule)
# SmolLM2 and its EAGLE-3 head, 1 thread, 3 busy loops on the 2 cores (benchmarks/results/
# bench-budget-default-head-auto-under-busy-loops-sum-n8.json): plain step 83 ms, draft root 11.5 ms, level 57 ms,
# and the head's catch-up over a 769-token prompt 2.4 s, i.e. 3.1 ms a token.
LOADED = dict(plain_s=0.083, root_s=0.0115, level_s=0.057, token_s=0.0031)


# GPU-like: verifying 60 nodes costs ~1.3 tokens, the head is cheap and ingests a prompt in a fraction of a step
GPU = dict(plain_s=0.015, shape=[1.0, 1.01, 1.02, 1.03, 1.05, 1.1, 1.2, 1.3], root_s=0.0008, level_s=0.0008,
           token_s=0.000003)


def true_costs(world: World, token_s: float | None = None) -> CostModel:
    """What a calibration on ``world`` measures (``token_s``: the per-token catch-up it found)."""
    return CostModel(CPU_SIZES, [world.plain_s * s for s in world.shape], world.root_s, world.level_s,
                     world.token_s if token_s is None else token_s)


# ------------------------------------------------------------------ kinds of round: model draft and lookups apart
# Qwen2.5-Coder-1.5B on this 2-core CPU, 2 threads (BENCHMARKS.md): verifying n tokens costs c(2) ~1.75, c(4) ~2.4,
# c(8) ~4, c(16) ~5.5 plain steps; asking the lookup costs a fraction of a millisecond against a ~60 ms step.
QWEN_CPU = dict(plain_s=0.060, shape=[1.0, 1.75, 2.1, 2.4, 4.0, 5.5, 9.0, 16.0], root_s=0.004, level_s=0.004,
                look_s=0.0003)


def answers(budget: TreeBudget, world: World, n_answers: int, rounds: int, seed: int = 0, **kw) -> Tally:
    """``n_answers`` answers of ``rounds`` rounds each, every one announced as the generator does."""
    tally = Tally()
    for a in range(n_answers):
        budget.begin_answer()
        run(budget, world, rounds, np.random.default_rng(seed + a), tally=tally, **kw)
    return tally


def set_tree_rate(budget: TreeBudget, rate: float | None, kind: int | None = None) -> None:
    """Make the tokens/s that rounds of ``kind`` (default: the budget's main kind) realise by the cost model
    ``rate`` at today's plain speed (None: no round of that kind modelled yet), as ``budget.tree_rate`` reads it."""
    kind = budget._main if kind is None else kind
    budget._gain[kind] = None if rate is None else rate / budget.costs.plain_rate
