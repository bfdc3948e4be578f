"""Per-round tree sizing by expected tokens per second (``--budget auto``), and its online acceptance calibration.

EAGLE-2 keeps the ``total_tokens`` best draft nodes whatever they cost to verify. That is right on a GPU, where
60 nodes cost about one token, and wrong on a small CPU, where they cost ~25 (docs/design.md) and speculation ends up
slower than plain decoding. Here each round picks the number of nodes n that maximises

    expected emitted tokens / round time = (1 + sum of the kept nodes' acceptance probabilities)
                                           / (draft time + verify_s(n))

and stops growing levels once no deeper level could pay for itself. Times are steady-state times: a round's
draft time counts the calibrated cost of a one-token catch-up, not the catch-up of a backlog (the prompt, or
tokens decoded plainly), which is paid once whatever the tree and must not skew the choice of its size. The
acceptance probability of a node is read from its path confidence (cumulative draft log-probability, EAGLE-2's
ranking score) through a binned reliability map per drafter (model draft, lookup, both) that starts at
exp(score) and learns the observed acceptance rate per bin.

Rounds come in two kinds, judged apart: model rounds (the model draft runs, lookup branches merged in) and lookup
rounds (the free drafts alone: ``RoundPlan.free_only``; every drafted round of a lookup draft). Before each round
the lookup says how sure it is of the root's next token (its rate learned from this text for that kind and length of
match, which costs a few dictionary lookups); a lookup round runs exactly when a chain at that rate, valued through
the lookups' acceptance map, beats plain steps on the calibrated curve (and the model rounds where those win). So
lookups cost nothing where the text does not repeat, and an answer that copies drafts its sure spans from its first
rounds, whatever earlier answers did: a record of looks that found nothing cannot keep it out. That record lives in
the lookups' acceptance map, and where chains that missed have sealed it (not even a sure chain would pay through
it, so no round would ever correct it), evidence that would pay on the map's prior runs a probe, sized on that prior
and paid from the lookups' exploration account. Model rounds whose rounds stop beating plain decoding steps
(modelled and realised, by their :class:`RateGuard`) draft only while their :class:`Exploration` account allows: an
allowance per answer plus a share of the decoding, paid by their losses (a probe's catch-up over the backlog
included), so exploring costs a bounded share of every answer however short; a losing model draft does not stop sure
lookups, nor the reverse. The records last across answers. A round whose best tree is the root alone is decoded as
a plain step; a drafted round that verified only forced tokens (a grammar's, free and certain) judges no kind.

A draft that could not beat plain decoding even if every drafted token were accepted (a chain of L tokens emits
at most L + 1 per round) is never run at all: probing it would only pay its catch-up. And while trees are not
known to win, a draft whose first catch-up would ingest a long backlog (a new prompt) waits until that catch-up
is a small share of the plain decoding done since: a short answer to a long prompt on a slow machine stays plain
decoding.

Pure: the round's plan out, what it did (its clock readings included) in; unit-testable without llama.cpp. What a
round was planned on (its kind, its catch-up, whether it explores) travels in its plan and comes back in its
result: nothing about the round in flight is kept here between :meth:`TreeBudget.plan` and
:meth:`TreeBudget.observe`. The sizing maths is in sizing.py, the draft-or-plain schedule in schedule.py, the
realised-rate guard in guard.py, what a round teaches the budget in learning.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from ..tree.proposals import LOOKUP
from .base import PLAIN_STEP, RoundPlan, RoundTimes
from .costs import CostModel
from .guard import RateGuard
from .learning import LOOKUP_ROUND, MODEL_ROUND, LearnsFromRounds
from .schedule import Exploration, ProbeSchedule
from .sizing import LOOKUP_FINE_BINS, SourceAcceptance, best_size, deeper_can_pay

# evidence values kept at most (the lookup's rates move with every scored token, so a long answer of plain steps
# with no round to reset the cache would otherwise grow it by one entry a round)
EVIDENCE_KEPT = 256
LOOKUP_MIN_ROUNDS = 8  # lookup rounds the guard needs before it may find lookups losing


@dataclass
class TreeBudget(LearnsFromRounds):
    """The auto tree policy (a :class:`~eagle2_local.tree_policy.base.TreePolicy`): whether to draft, which kind
    of round, how deep, and how many nodes to verify, by expected tokens per second on the calibrated costs.

    ``free_lookup``: the draft has lookup branches that cost ~nothing (lookup rounds may run them alone);
    ``model_draft`` False: the draft *is* a lookup (every drafted round is a lookup round). ``guard`` judges the
    main kind (model rounds, or lookup rounds for a lookup draft), ``lookup_guard`` a merged draft's lookup rounds.
    ``calibrated_time``: what the budget learns from a round is priced on the costs, not the clock (its guards and
    exploration accounts judge :func:`~.learning.calibrated_round_s`); with frozen costs (``CostModel.frozen``) the
    decisions then depend on the answers and the few readings planning itself takes (benchmarks/budget_replay.py).
    """

    costs: CostModel
    max_nodes: int
    max_depth: int
    acceptance: SourceAcceptance | None = None  # default: see __post_init__
    schedule: ProbeSchedule = field(default_factory=ProbeSchedule)
    rate_alpha: float = 0.3
    free_lookup: bool = False
    model_draft: bool = True
    calibration: dict = field(default_factory=dict)  # how the costs were obtained (shown in stats)
    guard: RateGuard = field(default_factory=RateGuard)
    lookup_guard: RateGuard = field(default_factory=RateGuard)
    context_of: Callable[[], int] | None = None  # the target's KV length now: the costs are read at that context
    calibrated_time: bool = False  # rounds and plain steps take what the costs predict, not what the clock read

    def __post_init__(self) -> None:
        if not self.model_draft:
            self.free_lookup = True
        if self.acceptance is None:
            # a merged draft's lookup nodes are mostly lookup-only children of model trees, missing at every depth:
            # one wide bin learns that fast enough to keep lookup rounds off prose, where fine bins, each learning
            # alone, let them run and lose (summaries 0.89x on SmolLM2, NOTES.md#the-tree-budget); a lookup alone
            # values its chains depth by depth
            self.acceptance = SourceAcceptance(lookup_fine=None if self.model_draft else LOOKUP_FINE_BINS)
        self._main = MODEL_ROUND if self.model_draft else LOOKUP_ROUND
        # lookups are judged on more rounds than the model draft: most of theirs are root-only looks, and a
        # copying answer's first chains may all miss at the edit point
        lookups = self.guard_of(LOOKUP_ROUND)
        lookups.min_rounds = max(lookups.min_rounds, LOOKUP_MIN_ROUNDS)
        self._gain: list[float | None] = [None, None]  # EMA of modelled rounds' tokens/s over the plain rate
        self.accounts: list[Exploration] = [self.schedule.account(), self.schedule.account()]
        self.rounds = 0
        self._can_pay = [False, False]  # per kind: could its rounds beat plain steps at all (_kind_can_pay)
        self._can_pay_state: tuple | None = None  # what _can_pay was computed on (the cost model and its shape)
        self._evidence: dict[tuple, float] = {}  # evidence_gain per (rate, switch, prior), for _evidence_state
        self._evidence_state: tuple | None = None
        self.lookup_rounds = 0  # lookup rounds of a draft with a model part (its model draft sitting out)
        self.evidence_rounds = 0  # lookup rounds run on the lookup's sure evidence (sure_lookup)
        self.sealed_probes = 0  # lookup rounds that probed a sealed acceptance map (probe_sealed_lookup)
        self.root_only_rounds = 0  # drafted rounds whose best tree was the root alone (decoded plainly)
        self._after_tree = 0  # the next plain step's place after a run of trees (1: the last round was a tree)
        self._run_plans: dict[int, RoundPlan] = {}  # the plan of a plain run, per length

    # ------------------------------------------------------------ state
    @property
    def tree_rate(self) -> float | None:
        """Tokens/s the main kind's rounds realise by the cost model, at today's plain speed (None: none yet)."""
        gain = self._gain[self._main]
        return None if gain is None else gain * self.costs.plain_rate

    @property
    def plain_probes(self) -> int:
        return self.schedule.plain_probes

    @property
    def catch_up_postponed(self) -> int:
        return self.schedule.catch_up_postponed

    def guard_of(self, kind: int) -> RateGuard:
        return self.guard if kind == self._main else self.lookup_guard

    def losing(self, kind: int) -> bool:
        """Do rounds of this kind lose to plain steps now? Only when both measures say so: the modelled rounds
        (tokens over the cost curve's time, drafting included) and the realised ones (its guard tripped, or its
        rounds so far slower than plain steps). Each alone is fooled: the model by a curve still learning, the
        realised rates by a burst of load in one window. Rounds that cannot pay on the costs learned since they ran
        (every drafted token accepted) lose whatever the model said of them then."""
        gain = self._gain[kind]
        if gain is None:
            return False
        if not self._kind_can_pay(kind):  # the costs learned since: no round of it could pay, whatever it realised
            return True
        if gain >= 1.0:
            return False
        if self.guard_of(kind).tripped:
            return True
        # a model round costs its draft whatever comes of it: what its rounds realised so far is enough; lookups
        # wait for the guard's verdict over several rounds, so one unlucky chain does not stop a copying answer
        return kind == MODEL_ROUND and self.guard_gain(kind) < 1.0

    def begin_answer(self) -> None:
        """A new answer: each kind's exploration account gets this answer's allowance, and the lookups'
        acceptance map keeps its rates at no more than its prior's weight (what one text's chains did says
        little of the next text's). The kinds' records stay: re-judging lookups in every answer made every prose
        answer pay their exploration again. A new answer that copies is found by its own evidence instead
        (:meth:`sure_lookup`)."""
        for account in self.accounts:
            account.begin_answer()
        self._after_tree = 0  # a prompt's evaluation came last, not a tree
        self.schedule.begin_answer()
        self.acceptance.begin_answer()
        self._evidence_state = None  # the map's pooled rates may move with its weights

    def evidence_gain(self, rate: float, switch_steps: float = 0.0, prior: bool = False) -> float:
        """Tokens/s over plain steps' of the best lookup round that a match with the lookup's learned ``rate``
        per token promises on the calibrated curve (0.0 when no chain pays): a chain whose node at depth k has
        path confidence k * log(rate), valued through the lookups' acceptance map as the round's own nodes will
        be, so a round taken on this evidence drafts more than its root. A long exact match of a copied span is
        sure before any round has run, and the lookup learned that rate from this text, per kind and length of
        match. ``switch_steps``: what a tree costs the plain steps after it (:meth:`_switch_steps`), kept to
        0.01 of a step; ``prior``: the chain valued at its path confidence instead (:meth:`_chain_gain`)."""
        if rate <= 0.0 or 1.0 / (1.0 - min(rate, 0.999)) <= self.costs.shape_at(2):
            return 0.0  # even an endless chain at this rate would not pay for verifying one node
        # asked every round, from the few rates the lookup has learned: kept until the acceptance maps or the
        # cost shape move (a round of prose would otherwise spend ~0.1 ms here on the same answer)
        state = (id(self.acceptance), self.acceptance.n_observed, id(self.costs), self.costs.shape_version,
                 self.max_depth, self.max_nodes)
        if state != self._evidence_state or len(self._evidence) >= EVIDENCE_KEPT:
            self._evidence_state, self._evidence = state, {}
        key = (rate, round(switch_steps, 2), prior)
        gain = self._evidence.get(key)
        if gain is None:
            gain = self._evidence[key] = self._chain_gain(*key)
        return gain

    def _chain_gain(self, rate: float, switch_steps: float = 0.0, prior: bool = False) -> float:
        """:meth:`evidence_gain` computed: the best round on a chain whose every token is ``rate`` sure, its
        expected tokens over its verify cost in plain steps (the shape alone: no plain rate, so a kept value
        stays exact while plain steps move the rate). ``prior``: each node valued at its path confidence instead
        of through the map (what the map starts from)."""
        m = min(self.max_depth, (self.probe_nodes(switch_steps) if prior else self.max_nodes) - 1)
        scores = np.log(rate) * np.arange(1, m + 1)
        chain = (np.exp(scores) if prior else self.acceptance.maps[LOOKUP].prob(scores)).tolist()
        best = expected = 1.0  # the root alone
        for n, p in enumerate(chain, start=2):  # n nodes: the root and the chain's first n - 1
            expected += p
            best = max(best, expected / (self.costs.shape_at(n) + switch_steps))
        return best

    def sure_lookup(self, rate: float) -> bool:
        """Does the lookup's evidence for this round (its learned ``rate`` for the root's next token) make a
        lookup round the best round now, whatever lookups realised before? It must beat plain steps, and the
        model rounds' modelled gain where those win: a sure copied span is drafted alone, for free, in the first
        rounds of an answer that copies after answers that did not."""
        if not (self.free_lookup and self._kind_can_pay(LOOKUP_ROUND)):
            return False
        gain = self.evidence_gain(rate, self._switch_steps())
        if gain <= 1.0:
            return False
        return self._lookup_beats_model(gain)

    def _lookup_beats_model(self, gain: float) -> bool:
        """Would a lookup round promising ``gain`` over plain steps beat the model rounds (where those win)?"""
        model = self._gain[MODEL_ROUND]
        return not self.model_draft or model is None or self.losing(MODEL_ROUND) or gain > model

    def sealed(self) -> bool:
        """Has the lookups' acceptance map sealed them off: would not even a chain of 0.999-sure tokens pay
        through it, with what a tree costs the plain steps after it? Then no lookup round runs on evidence, so none
        corrects the map or that cost: a few prose answers whose chains missed (a merged draft's model trees add
        lookup children that miss at every depth), or a switch measured at a slow moment, would keep lookups out of
        every later answer of the process, a code edit's included."""
        return self.evidence_gain(0.999, self._switch_steps()) <= 1.0

    def probe_nodes(self, switch_steps: float = 0.0) -> int:
        """The most nodes a probe of a sealed lookup map verifies: the largest n whose cost, with what a tree costs
        the plain steps after it, is at most two plain steps (at least 2). A probe bets on a map that says lookups
        lose, so a miss may cost no more than its first node's hit wins; on a steep curve or a long context a
        prior-sized chain missed at its first node for several steps."""
        n = 2
        while n < self.max_nodes and self.costs.shape_at(n + 1) + switch_steps <= 2.0:
            n += 1
        return n

    def probe_sealed_lookup(self, rate: float) -> bool:
        """Where the map is :meth:`sealed`, does this round's evidence (the lookup's learned ``rate``) make a
        chain pay as EAGLE-2 values a node (its path confidence, the map's prior), and may the lookups' exploration
        account pay for finding out? Such a round is sized on that prior and paid from the account, so a sealed map
        costs prose a bounded share and a later answer that copies unseals it with its first chain."""
        if not (self.free_lookup and self._kind_can_pay(LOOKUP_ROUND) and self.accounts[LOOKUP_ROUND].open):
            return False
        if not self.sealed():
            return False
        gain = self.evidence_gain(rate, self._switch_steps(), prior=True)
        return gain > 1.0 and self._lookup_beats_model(gain)

    # ------------------------------------------------------------ the plan
    def _kind_can_pay(self, kind: int) -> bool:
        """Could rounds of this kind beat plain steps at all (every drafted token accepted)?"""
        # the plain step is the unit: recomputed only when the shape moves (a tree's costs, the context, a recheck)
        state = (id(self.costs), self.costs.shape_version, self.max_depth)
        if state != self._can_pay_state:
            rate = self.costs.plain_rate
            self._can_pay = [self.model_draft and self.ceiling_rate() >= rate,
                             self.free_lookup and self.ceiling_rate(lookup=True) >= rate]
            self._can_pay_state = state
        return self._can_pay[kind]

    def plan(self, fresh_tokens: int = 1, lookup_rate: float = 0.0) -> RoundPlan:
        """This round's plan: a lookup round where the lookup's evidence is sure, else a model round where the
        model draft may draft now, else a plain step.

        ``lookup_rate``: the lookup's evidence for the root's next token. A lookup round runs only when it is
        sure (:meth:`sure_lookup`), whatever lookups realised before: a lookup round without such evidence would
        verify its root alone or a chain that does not pay, a look bought for nothing, and a record of such
        looks must not keep an answer that copies from drafting. ``fresh_tokens``: how much text the draft would
        first have to catch up on. While that backlog is long (a new prompt, many plain steps) and no model
        round has proved it wins, the model draft waits for :meth:`ProbeSchedule.catch_up_too_dear`."""
        self.rounds += 1
        if self.context_of is not None:
            self.costs.at_context(self.context_of())  # the shape follows the context (shape_version moves)
        self.schedule.note_backlog(fresh_tokens)
        if self.sure_lookup(lookup_rate):
            if self.schedule.plain_probe_due(self.costs):
                return PLAIN_STEP
            self.evidence_rounds += 1
            return self.tree_plan(fresh_tokens, LOOKUP_ROUND)
        if lookup_rate > 0.0 and self.probe_sealed_lookup(lookup_rate):
            self.sealed_probes += 1
            return self.tree_plan(fresh_tokens, LOOKUP_ROUND, exploring=True)
        if not self._kind_can_pay(MODEL_ROUND):
            return self._plain_run()
        losing = self.losing(MODEL_ROUND)
        if self.schedule.draft_now(fresh_tokens, self.costs, losing, self._gain[MODEL_ROUND] is not None, False,
                                   self.max_depth + 1, self.accounts[MODEL_ROUND]):
            if self.schedule.plain_probe_due(self.costs):
                return PLAIN_STEP
            return self.tree_plan(fresh_tokens, MODEL_ROUND, exploring=losing)
        return self._plain_run()

    def _plain_run(self) -> RoundPlan:
        """A plain step where no round would draft now, with the plain steps after it that the loop may take
        before asking again (:meth:`ProbeSchedule.plain_run`)."""
        steps = self.schedule.plain_run(self.costs.verify_s(1))
        if steps == 1:
            return PLAIN_STEP
        plan = self._run_plans.get(steps)
        if plan is None:
            plan = self._run_plans[steps] = replace(PLAIN_STEP, steps=steps)
        return plan

    def tree_plan(self, fresh_tokens: int = 1, kind: int | None = None, exploring: bool = False) -> RoundPlan:
        """The plan of a drafted round of ``kind`` (default: the main kind) whose catch-up ingests
        ``fresh_tokens`` (what :meth:`plan` returns when it drafts; called alone, a round forced whatever the
        schedule says). ``exploring``: drafted while that kind loses, so its loss is paid from its account; a
        lookup round that explores is a probe of a sealed map (:meth:`probe_sealed_lookup`), its nodes valued at
        their path confidence, not through the map.

        Its callables value nodes for a round of that kind, drafted so far in the calibrated root cost plus the
        levels measured in this round's own times."""
        kind = self._main if kind is None else kind
        lookup = kind == LOOKUP_ROUND
        prior = lookup and exploring  # a probe of a sealed lookup map values its nodes as the map's prior does
        switch = self._switch_steps()
        switch_s = switch * self.costs.verify_s(1)
        self.schedule.round_started()
        self.lookup_rounds += lookup and self.model_draft
        cap = self.probe_nodes(switch) if prior else None  # a probe bets little (probe_nodes)

        def go_deeper(cand_scores: np.ndarray, frontier_scores: np.ndarray, levels_done: int, times: RoundTimes,
                      sources: np.ndarray | None = None, frontier_sources: np.ndarray | None = None) -> bool:
            return self._deeper(cand_scores, frontier_scores, levels_done, self._draft_so_far(times, kind), kind,
                                sources, frontier_sources, switch_s, prior, cap)

        def size(cand_scores: np.ndarray, times: RoundTimes, sources: np.ndarray | None = None) -> int:
            return self._size(cand_scores, sources, self._draft_so_far(times, kind), kind, switch_s, prior, cap)

        return RoundPlan(drafts=True, max_nodes=self.max_nodes if cap is None else cap,
                         max_depth=self.max_depth if cap is None else min(self.max_depth, cap - 1), free_only=lookup,
                         fresh_tokens=1 if lookup else fresh_tokens, exploring=exploring, switch_steps=switch,
                         go_deeper=go_deeper, size=size)

    def _switch_steps(self) -> float:
        """What a tree drafted now costs the plain steps after it (:attr:`CostModel.switch_steps`): nothing when
        the last round was a tree, as the run it continues pays that once, when it ends."""
        return 0.0 if self._after_tree == 1 else self.costs.switch_steps

    def free_plan(self) -> RoundPlan:
        """A round of free drafts where :meth:`plan` said plain (tokens a grammar forces, lookups): levels and
        size chosen as for a lookup round (no draft time), each node valued by its own drafter's acceptance map
        on today's verify costs (while growing, when sources are unknown, the lookups' map: a forced node's
        score 0 falls in its own bin)."""
        return RoundPlan(drafts=True, max_nodes=self.max_nodes, max_depth=self.max_depth, free_only=True,
                         go_deeper=lambda cands, frontier, levels, times, sources=None, frontier_sources=None:
                         self._deeper(cands, frontier, levels, 0.0, LOOKUP_ROUND, sources, frontier_sources),
                         size=lambda cands, times, sources=None: self._size(cands, sources, 0.0, LOOKUP_ROUND),
                         unasked=True)

    def _root_s(self, kind: int) -> float:
        """The steady draft time of a ``kind`` round's root: none when only lookups draft."""
        return 0.0 if kind == LOOKUP_ROUND else self.costs.draft_root_now

    def ceiling_rate(self, lookup: bool = False) -> float:
        """Tokens/s of the best conceivable round (``lookup``: a lookup round's, drafted for free): a chain of L
        drafted tokens, all accepted (L + 1 emitted)."""
        levels = np.arange(1, self.max_depth + 1)
        draft = np.zeros(len(levels)) if lookup else np.array([self.costs.draft_s(int(n)) for n in levels])
        times = draft + self.costs.verify_s(levels + 1)
        return float(np.max((levels + 1) / times))

    def _draft_so_far(self, times: RoundTimes, kind: int) -> float:
        """Steady-state draft time of a ``kind`` round: the calibrated root cost plus the levels measured so far."""
        return self._root_s(kind) + times.deeper_s

    # ------------------------------------------------------------ while drafting (the plan's callables)
    def _probs(self, scores: np.ndarray, sources: np.ndarray | None, kind: int, prior: bool = False) -> np.ndarray:
        """Acceptance probabilities of nodes (``sources`` None: all from ``kind``'s own drafter; ``prior``: their
        path confidences, what every map starts from)."""
        scores = np.asarray(scores)
        if prior:
            return np.exp(np.minimum(scores, 0.0))
        if sources is None or len(sources) != len(scores):
            sources = np.full(len(scores), kind, dtype=np.int8)
        return self.acceptance.prob(scores, sources)

    def _deeper(self, cand_scores: np.ndarray, frontier_scores: np.ndarray, levels_done: int, draft_s: float,
                kind: int, sources: np.ndarray | None = None, frontier_sources: np.ndarray | None = None,
                switch_s: float = 0.0, prior: bool = False, max_nodes: int | None = None) -> bool:
        """Could another level of a ``kind`` round, drafted so far in ``draft_s``, pay for itself? A question:
        asking changes nothing. ``sources``: the candidates' drafters (None: all the kind's own), so each is valued
        by its own map as the round's size will be; ``max_nodes``: the round's cap (default: the budget's)."""
        depth = self.max_depth if max_nodes is None else min(self.max_depth, max_nodes - 1)
        max_nodes = self.max_nodes if max_nodes is None else max_nodes
        if levels_done >= depth:
            return False
        p = np.sort(self._probs(cand_scores, sources, kind, prior))[::-1]
        frontier = self._probs(frontier_scores, frontier_sources, kind, prior)
        if not len(frontier):
            return False
        return deeper_can_pay(p, float(frontier.sum()), draft_s, depth - levels_done, self.costs,
                              max_nodes, level_s=0.0 if kind == LOOKUP_ROUND else None,
                              frontier_best=float(frontier.max()), switch_s=switch_s)

    def _size(self, cand_scores: np.ndarray, sources: np.ndarray | None, draft_s: float, kind: int,
              switch_s: float = 0.0, prior: bool = False, max_nodes: int | None = None) -> int:
        """The best node count (root included) of a ``kind`` round drafted in ``draft_s``, the candidates taken in
        the tree's order (best score first), each valued by its own drafter's acceptance map; at most ``max_nodes``
        (default: the budget's)."""
        scores = np.asarray(cand_scores)
        order = np.lexsort((np.arange(len(scores)), -scores))
        p = self._probs(scores[order], None if sources is None else np.asarray(sources)[order], kind, prior)
        return best_size(p, draft_s, self.costs, self.max_nodes if max_nodes is None else max_nodes, switch_s)[0]
