"""The generation loops: plain decoding (the baseline) and EAGLE-2 draft → verify → accept → commit.

Both loops share the target, the sampling warpers and the :class:`TokenEmitter`, and both reuse the KV cache
of the previous call for the longest common token prefix (multi-turn chat without re-prefilling the history).
"""

from __future__ import annotations

import logging
import time
import typing
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from ..decoding.acceptance import accept
from ..decoding.backlog import FeatureBacklog
from ..decoding.grammar import Grammar, GrammarState, choose
from ..decoding.stats import GenerationStats
from ..decoding.stopping import TokenEmitter
from ..decoding.target import PROMPT_CHUNK, Target, TargetSnapshot
from ..drafts.base import DraftEngine
from ..drafts.constrained import grammar_draft
from ..drafts.forced import ForcedDraft, VocabForest
from ..errors import ContextFullError, Eagle2Error, EmptyPromptError, TreeError
from ..llamacpp.runtime import llama_seconds
from ..tree.draft_tree import TreeParams, grow_candidates, main_chain, select_tree
from ..tree.sampling import SamplingParams
from ..tree_policy import PLAIN_STEP, FixedTree, RoundPlan, RoundResult, RoundTimes, TreePolicy
from .listeners import DraftTimer, RoundListener

log = logging.getLogger(__name__)


@dataclass
class Chunk:
    """One streamed piece: new text, the token ids it came from, and the finish reason on the last chunk."""

    text: str
    tokens: list[int]
    finish_reason: str | None = None


@dataclass(frozen=True)
class PromptSnapshot:
    """A prompt evaluated once from an empty cache: its tokens, the target's KV cells and the features of every
    prompt token (None when the target computes none)."""

    tokens: tuple[int, ...]
    target: TargetSnapshot
    features: np.ndarray | None


class Generator:
    """Runs generations on one target, optionally with a draft engine; keeps the KV cache between calls."""

    def __init__(self, target: Target, engine: DraftEngine | None = None,
                 tree_params: TreeParams | None = None, stop_tokens: frozenset[int] | None = None,
                 policy: TreePolicy | None = None, timer: DraftTimer | None = None,
                 clock: Callable[[], float] = time.perf_counter, listener: RoundListener | None = None) -> None:
        """``policy``: plans each round's tree (default: EAGLE-2's fixed ``tree_params.total_tokens`` nodes a
        round); ``timer``: told the draft's times of every drafted round; ``clock``: the one clock every timing
        (statistics, policy, timer) is read from; ``listener``: hears every round, tree and token batch."""
        self.target = target
        self.engine = engine
        self.timer = timer
        self.listener = listener
        self.clock = clock
        self.tree_params = tree_params or TreeParams()
        self.policy: TreePolicy = policy if policy is not None else FixedTree(self.tree_params.total_tokens)
        self.stop_tokens = stop_tokens if stop_tokens is not None else target.model.eog_tokens
        self.tokens: list[int] = []  # exactly the tokens held in the target's committed KV sequence
        self.transcript: list[int] = []  # the last call's prompt and the tokens it emitted
        self.last_stats = GenerationStats()
        self.backlog = FeatureBacklog()  # target features (embeddings on) the engine has not been handed yet
        self._forced: ForcedDraft | None = None  # made on the first speculative call under a grammar
        if engine is not None:
            self._check_tree_fits()

    def _check_tree_fits(self) -> None:
        p = self.tree_params
        if p.total_tokens > self.target.max_tree_nodes:
            raise TreeError(f"total_tokens {p.total_tokens} exceeds the batch size "
                            f"{self.target.max_tree_nodes}; raise n_batch or shrink the tree")
        if self.policy.max_nodes > p.total_tokens:
            raise TreeError(f"the tree policy allows {self.policy.max_nodes} nodes but the tree is capped "
                            f"at {p.total_tokens}")

    def reset(self) -> None:
        """Forget the conversation (empties the KV caches)."""
        self.target.reset()
        if self.engine is not None:
            self.engine.reset()
        self.tokens = []
        self.transcript = []
        self.backlog = FeatureBacklog()

    def prompt_snapshot(self, prompt: list[int], exact: bool = True) -> PromptSnapshot:
        """Evaluate ``prompt`` from an empty cache, as a fresh call would (``exact``: in the aligned schedule of
        ``cache_prompt=False``), and keep its KV cells and features for :meth:`restore`. Benchmarks that run one
        prompt many times evaluate it once this way (``bench --prefill-once``)."""
        self.reset()
        ver = self.target.prefill(prompt, aligned=exact)
        snap = PromptSnapshot(tokens=tuple(prompt), target=self.target.snapshot(), features=ver.features)
        self.reset()
        return snap

    def restore(self, snap: PromptSnapshot) -> None:
        """Hold ``snap``'s prompt as if it had just been evaluated by a call that emitted nothing: the draft
        engine starts empty (it catches up over the prompt's features in the next call, as after a fresh
        prefill), and the next call for that prompt re-evaluates only its last aligned chunk."""
        self.reset()
        self.target.restore(snap.target)
        self.tokens = list(snap.tokens)
        self.transcript = list(snap.tokens)
        self.backlog.restart(snap.features, 0)

    # ------------------------------------------------------------------ public
    def generate(self, prompt: list[int], max_tokens: int, sampling: SamplingParams, *, stop: tuple[str, ...] = (),
                 seed: int | None = None, speculative: bool | None = None,
                 cache_prompt: bool = False, grammar: Grammar | None = None,
                 cancelled: Callable[[], bool] | None = None) -> Iterator[Chunk]:
        """Stream chunks for ``prompt``; ``speculative`` defaults to "when an engine is attached, or under a
        grammar".

        ``cancelled``: asked between the prompt's batches; once it says yes the prompt's evaluation stops and
        the first ``next()`` raises :class:`PrefillCancelled`, the KV cache left holding only the text it held
        reusable before (so the next call answers as it would have without this one). Between rounds, the
        caller stops by closing the stream.

        ``grammar``: the answer follows it (llama.cpp's grammar engine masks the target's logits before the
        warpers). Speculative rounds then carry a grammar state per tree node, drop the draft's forbidden
        children, accept against the constrained target, and draft the tokens the grammar forces for free
        (drafts/forced.py): a model without a draft runs speculatively on forced tokens alone.

        ``cache_prompt`` False (reproducible): the KV cache of earlier calls is reused only where it is exact
        and the rest of the prompt is evaluated in the aligned schedule, so the answer does not depend on what
        was asked before. True (llama-server's speed option): the whole common prefix is reused and the rest
        evaluated in full batches; a T=0 answer may then differ at near-ties from one without that history."""
        has_draft = self.engine is not None or grammar is not None
        use_draft = has_draft if speculative is None else speculative
        if use_draft and not has_draft:
            raise Eagle2Error("speculative decoding needs a draft (a head, a draft model or lookup) or a grammar")
        state = grammar.state(self.target.model) if grammar is not None else None
        draft = self._draft_for(state) if use_draft else None
        rng = np.random.default_rng(seed)
        emitter = TokenEmitter(self.target.model, max_tokens, tuple(stop), self.stop_tokens)
        call = object()  # identifies this call: a newer one owns the KV cache from its start
        self._active = call
        stats = GenerationStats(engine=draft.name if draft is not None else "plain", prompt_tokens=len(prompt))
        self.last_stats = stats
        t0 = self.clock()
        logits = self._prefill(prompt, stats, exact=not cache_prompt, cancelled=cancelled)
        self._prompt = list(prompt)
        stats.prefill_s = self.clock() - t0
        chunks = (self._speculative(logits, emitter, sampling, rng, stats, draft, state) if use_draft
                  else self._plain(logits, emitter, sampling, rng, stats, state))
        try:
            for chunk in chunks:
                yield chunk
                if self._active is not call:
                    raise Eagle2Error("a newer generation started on this model; an older stream cannot go on")
        finally:
            chunks.close()  # first: a plain run closed inside hands its steps to the policy and the statistics
            if self._active is call:  # an abandoned older stream must not touch the newer call's cache
                self._settle(emitter)
            stats.n_tokens = len(emitter.tokens)
            stats.total_s = self.clock() - t0
            if use_draft:
                stats.budget = self.policy.summary()
            if state is not None:
                if draft is not None:
                    draft.close()  # the generation's grammar draft (the engine it wraps stays open)
                state.close()

    def _draft_for(self, state: GrammarState | None) -> DraftEngine:
        """The draft of one generation: the engine, or under a grammar the engine (or none) drafting under it,
        joined by the forced tokens."""
        if state is None:
            return self.engine
        return grammar_draft(self.engine, state, self.tree_params.top_k, self.forced_draft())

    def forced_draft(self) -> ForcedDraft:
        """The forced-token drafter for this target's vocabulary: its prefix forest is built once (~0.1 s), and
        what the target chose among small allowed sets is kept across generations."""
        if self._forced is None:
            self._forced = ForcedDraft(VocabForest(self.target.model), max_branches=self.tree_params.top_k)
        return self._forced

    def _prefill(self, prompt: list[int], stats: GenerationStats, exact: bool,
                 cancelled: Callable[[], bool] | None = None) -> np.ndarray:
        if len(prompt) == 0:
            raise EmptyPromptError("the prompt is empty: there is no token to evaluate")
        if len(prompt) >= self.target.n_ctx:
            raise ContextFullError(f"the prompt has {len(prompt)} tokens but the context holds {self.target.n_ctx}; "
                                   "shorten it or raise n_ctx")
        same_text = min(_common_prefix(self.tokens, prompt), len(prompt) - 1)  # evaluate at least one token
        keep = self._exact_keep(same_text) if exact else same_text
        if self.engine is not None:
            self.engine.rollback(same_text)  # the draft keeps all of the same text; the target may redo some
            if self.engine.needs_features:
                keep = self.backlog.reusable(keep, self.engine.n_features)
                if exact:  # the draft holds what precedes the (earlier) aligned start: one pass settles it
                    keep = self._exact_keep(keep)
        keep = self.target.rollback(keep)  # less where a recurrent state cannot be cut there
        self.tokens = list(prompt[:keep])
        stats.prompt_tokens_reused = keep
        try:
            ver = self.target.prefill(prompt[keep:], aligned=exact, cancelled=cancelled)
        except BaseException:  # cancelled, failed or interrupted: back to the kept text (tokens, target and draft
            # agree, the backlog covers it)
            keep = self.target.rollback(keep)
            self.tokens = list(prompt[:keep])
            if self.engine is not None:
                self.engine.rollback(keep)
            raise
        self.tokens = list(prompt)
        self.backlog.trim(keep, ver.features)
        return ver.logits[0]

    def _exact_keep(self, keep: int) -> int:
        """The longest reuse of ``keep`` cached tokens that leaves the answer as a fresh evaluation would give it:
        within the exact cells, and (unless every batch shape computes alike) ending where an aligned chunk starts,
        so the rest is evaluated in the same batches as from scratch."""
        keep = min(keep, self.target.n_exact)
        return keep if self.target.batch_invariant else keep - keep % PROMPT_CHUNK

    def _settle(self, emitter: TokenEmitter) -> None:
        """Trim the KV cache to the prompt plus the emitted tokens (drafted tokens past a stop are dropped)."""
        self.target.abort_tree()  # only does something if interrupted between verify and commit
        full = self._prompt + emitter.tokens
        self.transcript = full
        keep = self.target.rollback(min(self.target.n_past, len(full)))
        if self.engine is not None:
            self.engine.rollback(keep)
        self.tokens = full[:keep]

    # ------------------------------------------------------------------ plain
    def _plain(self, logits: np.ndarray, emitter: TokenEmitter, sampling: SamplingParams,
               rng: np.random.Generator, stats: GenerationStats,
               grammar: GrammarState | None = None) -> Iterator[Chunk]:
        history = list(self.tokens)
        token = choose(sampling, grammar, logits, sampling.recent(history), rng)
        while True:
            if grammar is not None:
                grammar.accept(token)
            history.append(token)
            yield _emit(emitter, [token], self.listener)
            if emitter.done:
                return
            if self.target.n_past + 1 > self.target.n_ctx:  # no cell left for this token
                yield Chunk(emitter.finish("length"), [], "length")
                return
            stats.target_passes += 1
            stats.pass_tokens += 1
            step = RoundTimes(start=self.clock(), llama_start=llama_seconds())
            step.drafted, step.llama_drafted = step.start, step.llama_start  # a plain step drafts nothing
            ver = self.target.decode_one(token)
            logits = ver.logits[0]
            step.verified = self.clock()
            stats.verify_s += step.verify_s
            self.tokens.append(token)
            if self.engine is not None:
                self.backlog.extend(ver.features)  # kept for a feature-fed draft engine's next speculative call
            token = choose(sampling, grammar, logits, sampling.recent(history), rng)
            step.done, step.llama_done = self.clock(), llama_seconds()
            stats.add_host(step)

    # ------------------------------------------------------------------ speculative
    def _speculative(self, logits: np.ndarray, emitter: TokenEmitter, sampling: SamplingParams,
                     rng: np.random.Generator, stats: GenerationStats, draft: DraftEngine,
                     grammar: GrammarState | None = None) -> Iterator[Chunk]:
        """Rounds until done: ask the policy for the round's plan, run it (a plain step or draft → verify →
        accept → commit), tell the policy, the statistics and the draft timer what it did, emit its tokens; a plain
        step's plan may add a plain run (:meth:`_plain_run`).
        ``draft``: the generation's (:meth:`_draft_for`); ``grammar``: the committed text's state (the root's
        included), advanced by every round."""
        if self.engine is None:  # forced tokens alone: checked here, as a draft engine is when attached
            self._check_tree_fits()
        draft.begin_answer(len(self._prompt))
        self.policy.begin_answer()
        root = choose(sampling, grammar, logits, sampling.recent(self.tokens), rng)
        if grammar is not None:
            grammar.accept(root)
        yield _emit(emitter, [root], self.listener)
        while not emitter.done:
            # Free KV cells. A tree needs one per node, and a path of depth d emits d + 1 tokens, so near the
            # end of the context the tree shrinks to stop exactly where plain decoding stops.
            room = self.target.n_ctx - self.target.n_past
            if room < 1:
                yield Chunk(emitter.finish("length"), [], "length")
                return
            # A path also emits no more than the answer still takes: deeper nodes would be verified for nothing.
            left = emitter.max_tokens - len(emitter.tokens)
            # A plain step (the draft not run) when only the root fits or the policy finds that no tree beats
            # plain decoding now; the engine catches up on those tokens (and their features) next round.
            asked = self.clock()
            read = draft.n_read  # None: forced tokens alone, which read nothing
            fresh = 1 if read is None else len(self.tokens) + 1 - read  # text the draft has not read, root included
            # the lookup's evidence for the root's next token: a sure copied span may be drafted at once
            can_draft = room > 1 and left > 1
            lookup_rate = draft.next_rate(self.tokens + [root]) if can_draft else 0.0
            plan = self.policy.plan(fresh, lookup_rate) if can_draft else PLAIN_STEP
            # A plain step where the draft's free proposals pay anyway (the tokens a grammar forces) becomes a round
            # of the free drafts (forced tokens, lookups): they cost no draft, and forced ones are accepted with
            # certainty. The policy sizes it by what verifying costs and learns only its acceptance from it.
            free_round = not plan.drafts and can_draft and draft.has_free_round()
            if free_round:
                plan = self.policy.free_plan()
            if plan.drafts:
                result, accepted, bonus = self._tree_round(plan, draft, root, room, left, sampling, rng, grammar)
            else:
                result, accepted, bonus = self._plain_step(root, sampling, rng, grammar)
                if can_draft:
                    draft.target_chose(bonus)  # the target's pick where has_free_round just looked
            result.times.asked = asked
            self.policy.observe(result)
            stats.add_round(result)
            if self.listener is not None:
                self.listener.round(result)
            if self.timer is not None and plan.drafts and not free_round:
                self.timer.catch_up(result.times.catch_up_s)
                for level, seconds in enumerate(result.times.level_s, start=1):
                    self.timer.level(level, seconds)
            self.tokens.extend([root] + accepted)
            yield _emit(emitter, accepted + [bonus], self.listener)
            root = bonus
            if plan.steps > 1 and grammar is None and not emitter.done:
                root = yield from self._plain_run(root, plan.steps - 1, emitter, sampling, rng, stats)

    def _plain_run(self, root: int, steps: int, emitter: TokenEmitter, sampling: SamplingParams,
                   rng: np.random.Generator, stats: GenerationStats) -> typing.Generator[Chunk, None, int]:
        """Up to ``steps`` plain steps decided with the one before them (a plain run, ``RoundPlan.steps``): the
        plain loop's calls alone, no evidence and no plan between them; the policy and the statistics hear of each
        step when the run ends, in order. Returns the next root. Ends early at the end of the answer or the
        context."""
        results = []
        try:
            for _ in range(steps):
                if self.target.n_past + 1 > self.target.n_ctx:  # the rounds' loop finishes the answer
                    break
                result, _, bonus = self._plain_step(root, sampling, rng)
                results.append(result)
                self.tokens.append(root)
                yield _emit(emitter, [bonus], self.listener)
                root = bonus
                if emitter.done:
                    break
        finally:  # also when the stream is closed inside the run
            for result in results:
                self.policy.observe(result)
                stats.add_round(result)
                if self.listener is not None:
                    self.listener.round(result)
        return root

    def _tree_round(self, plan: RoundPlan, draft: DraftEngine, root: int, room: int, left: int,
                    sampling: SamplingParams, rng: np.random.Generator,
                    grammar: GrammarState | None = None) -> tuple[RoundResult, list[int], int]:
        """Draft a tree within the plan's limits, verify it in one pass, accept, commit. Returns what the round
        did, the accepted draft tokens and the target's own next token; the committed nodes' features wait in
        the backlog for the next round. ``room``: free KV cells (one per node); ``left``: tokens the answer
        still takes (a path of depth d emits d + 1).

        A plan may run only the draft's free part (lookup branches, when the model draft cannot pay): the model
        then sits the round out like a plain step, and catches up on it later. A draft that is all free part
        (forced tokens alone) runs every round that way."""
        free_only = draft.free_part is draft or plan.free_only and draft.free_part is not None
        engine = draft.free_part if free_only else draft
        times = RoundTimes(start=self.clock(), llama_start=llama_seconds())
        # draft: catch up on the new text (the root last), grow levels while the plan says they pay, re-rank
        features = (None, 0) if free_only else self.backlog.take()
        text = np.asarray(self.tokens + [root])  # one conversion of the whole text a round: the draft's and accept's
        p = self.tree_params
        params = TreeParams(min(p.total_tokens, plan.max_nodes, room),
                            min(p.depth, plan.max_depth, room - 1, left - 1), p.top_k)
        deeper = (None if plan.go_deeper is RoundPlan.go_deeper  # the default grows every level: no scores needed
                  else lambda scores, frontier, levels, sources, frontier_sources:
                  plan.go_deeper(scores, frontier, levels, times, sources, frontier_sources))

        def level_done(levels: int) -> None:
            times.levels.append(self.clock())

        cands = grow_candidates(engine.catch_up(text, *features), engine.expand, params, should_expand=deeper,
                                level_done=level_done, final_tokens=self.stop_tokens)
        if self.listener is not None:
            self.listener.tree(root, cands)
        n_nodes = min(plan.nodes(cands.scores, times, cands.sources), params.total_tokens)
        tree = select_tree(root, cands.tokens, cands.scores, cands.parents, n_nodes, cands.sources)
        if self.target.chain_only:  # one recurrent state: the best path alone (decoding/target.py)
            tree = main_chain(tree, self.target.max_tree_nodes)
        times.drafted, times.llama_drafted = self.clock(), llama_seconds()
        # verify every node in one target pass; the root alone is a plain step (cheaper than a one-node tree)
        one_pass = len(tree) > 1
        ver = self.target.verify(tree, copy=False, features=False) if one_pass else self.target.decode_one(root)
        times.verified = self.clock()
        # accept (greedy, or exact rejection sampling) and keep the accepted path in target and draft
        acc = (accept(tree, ver.logits, sampling, text[:-1], rng) if grammar is None
               else accept(tree, ver.logits, sampling, text[:-1], rng, grammar))
        if one_pass:
            rows = self.target.verified_features(acc.path)  # the accepted path's rows alone
            self.target.commit(acc.path)
        else:
            rows = ver.features[acc.path] if ver.features is not None else None
        engine.commit(tree.cand_ids[acc.path[1:]])
        if free_only:  # the model draft has read nothing new: these rows join its backlog
            self.backlog.extend(rows)
        else:  # the engine has now read the root; the features of root + accepted nodes are its next input
            self.backlog.restart(rows, at=len(self.tokens))
        times.done, times.llama_done = self.clock(), llama_seconds()
        accepted = np.zeros(len(tree) - 1, dtype=bool)  # per drafted node (the root is node 0, never in it)
        accepted[acc.path[1:] - 1] = True
        result = RoundResult(plan, times, n_emitted=len(acc.path), node_scores=tree.scores[1:],
                             node_sources=tree.sources[1:], accepted=accepted)
        return result, [int(x) for x in tree.tokens[acc.path[1:]]], acc.bonus

    def _plain_step(self, root: int, sampling: SamplingParams, rng: np.random.Generator,
                    grammar: GrammarState | None = None) -> tuple[RoundResult, list[int], int]:
        """One step of plain decoding inside the speculative loop (the same calls as the plain loop); the
        draft is not run, so the step's features join the backlog."""
        start, busy = self.clock(), llama_seconds()
        times = RoundTimes(start=start, drafted=start, llama_start=busy, llama_drafted=busy)
        ver = self.target.decode_one(root)
        times.verified = self.clock()
        self.backlog.extend(ver.features)
        bonus = choose(sampling, grammar, ver.logits[0], sampling.recent(self.tokens, root), rng)
        if grammar is not None:
            grammar.accept(bonus)
        times.done, times.llama_done = self.clock(), llama_seconds()
        return RoundResult(PLAIN_STEP, times), [], bonus


def _emit(emitter: TokenEmitter, tokens: list[int], listener: RoundListener | None) -> Chunk:
    """Push tokens until the emitter stops; the chunk lists only the tokens that became output."""
    if listener is not None:
        listener.tokens(tokens)
    n_before = len(emitter.tokens)
    text = "".join(emitter.push(tok) for tok in tokens if not emitter.done)
    return Chunk(text, emitter.tokens[n_before:], emitter.finish_reason)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n
