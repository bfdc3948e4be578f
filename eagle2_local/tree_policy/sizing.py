"""The pure sizing maths of the auto budget: draft confidence to acceptance probability, and the tree size and
depth that maximise expected tokens per second on a cost model. Numbers in, numbers out."""

from __future__ import annotations

import numpy as np

from ..tree.proposals import LOOKUP, SOURCE_NAMES
from .costs import CostModel

LOOKUP_FINE_BINS = 0.05  # nats per bin of the lookup's acceptance map above -1 (NOTES.md#lookup-drafts)
FINE_PRIOR_SHARE = 0.5  # a fine bin's prior weight, as a share of a wide bin's


class AcceptanceMap:
    """Path confidence (cumulative log-prob) -> probability that the node lies on the accepted path.

    Bins of ``width`` nats from ``low`` to 0 (``fine``: bins of ``fine`` nats above ``fine_above``); each bin
    holds pseudo-counts seeded with ``prior_weight`` observations at exp(bin centre), so the map starts as
    EAGLE-2's own assumption and moves to the measured rate as rounds come in. Counts are capped (scaled down
    together) so the map keeps following a drifting conversation instead of freezing after the first thousand
    rounds. Estimates are made monotone in the score: the tree builder ranks by score, so a better score must
    never map to a lower probability.
    """

    def __init__(self, low: float = -8.0, width: float = 0.5, prior_weight: float = 4.0,
                 max_count: float = 400.0, fine: float | None = None, fine_above: float = -1.0) -> None:
        if fine is None:
            self.edges = np.arange(low, 0.0 + 1e-9, width)  # bin i covers [edges[i-1], edges[i]); bin 0 is < low
        else:
            self.edges = np.concatenate([np.arange(low, fine_above - 1e-9, width),
                                         np.linspace(fine_above, 0.0, round(-fine_above / fine) + 1)])
        centres = np.concatenate([[low - width / 2], (self.edges[:-1] + self.edges[1:]) / 2, [0.0]])
        # a fine bin holds half a wide bin's prior: one chain that missed must not condemn the depths it reached
        # (trees that deep would not run again to correct it), and a few rounds on a text that does not copy
        # must outweigh the rate it taught the lookup (NOTES.md#lookup-drafts)
        fine_bin = np.diff(self.edges, prepend=low - width, append=width) < width
        self.prior_counts = prior_weight * np.where(fine_bin, FINE_PRIOR_SHARE, 1.0)
        self.counts = self.prior_counts.copy()
        self.hits = self.counts * np.exp(np.minimum(centres, 0.0))
        self.max_count = max_count
        self.n_observed = 0
        self._rates: np.ndarray | None = None  # rates() until the next observation

    def _bin(self, scores: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.edges, np.asarray(scores, dtype=np.float64), side="right")

    def rates(self) -> np.ndarray:
        """Per-bin acceptance estimate, monotone non-decreasing in the score: where a bin's rate exceeds a better
        bin's, the two are pooled by their counts (isotonic regression), so a bin holding only its prior cannot
        lift the measured bins above it, as a running maximum would."""
        if self._rates is None:
            self._rates = np.clip(isotonic(self.hits / self.counts, self.counts), 0.0, 1.0)
        return self._rates

    def prob(self, scores: np.ndarray) -> np.ndarray:
        return self.rates()[self._bin(scores)]

    def observe(self, scores: np.ndarray, accepted: np.ndarray) -> None:
        """One verified round: each drafted node's score and whether it ended on the accepted path."""
        bins = self._bin(scores)
        np.add.at(self.counts, bins, 1.0)
        np.add.at(self.hits, bins, np.asarray(accepted, dtype=np.float64))
        if (self.counts > self.max_count).any():
            self._scale_down_to(self.max_count)
        self.n_observed += len(bins)
        self._rates = None

    def weigh_as_prior(self) -> None:
        """Keep each bin's learned rate but let it weigh no more than its prior did: the next observations move
        the map as fast as they moved the new map (for evidence that belongs to one text, not to the drafter)."""
        self._scale_down_to(self.prior_counts)
        self._rates = None

    def _scale_down_to(self, limit: float | np.ndarray) -> None:
        """Scale each bin's counts and hits together down to at most ``limit`` (its rate kept)."""
        scale = np.minimum(limit / self.counts, 1.0)
        self.counts *= scale
        self.hits *= scale


def isotonic(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The non-decreasing sequence closest to ``values`` in weighted squared error (pool adjacent violators)."""
    means: list[float] = []
    sizes: list[float] = []
    runs: list[int] = []
    for v, w in zip(values.tolist(), weights.tolist()):
        means.append(v)
        sizes.append(w)
        runs.append(1)
        while len(means) > 1 and means[-2] > means[-1]:
            m2, w2, r2 = means.pop(), sizes.pop(), runs.pop()
            means[-1] = (means[-1] * sizes[-1] + m2 * w2) / (sizes[-1] + w2)
            sizes[-1] += w2
            runs[-1] += r2
    return np.repeat(means, runs)


class SourceAcceptance:
    """One :class:`AcceptanceMap` per drafter (``SOURCE_NAMES``: the model draft, the lookup, both, forced
    tokens), so evidence about one never moves the other: a model draft that misses must not make sure lookups
    look unsure, and the reverse. Each starts at path confidence, as EAGLE-2 assumes; a lookup's path
    confidence is already its own learned rate per match length and place (drafts/lookup.py)."""

    def __init__(self, n_sources: int = len(SOURCE_NAMES), lookup_prior_weight: float = 16.0,
                 lookup_fine: float | None = LOOKUP_FINE_BINS, **map_kw) -> None:
        # a lookup's path confidence is already learned from the text (its hit rates per kind of match), so its
        # map trusts it more: a few chains that miss at an edit point must not talk the budget out of copying.
        # Its chains score between 0 and -1 nats (rates of 0.9-0.99 a token over ten or more tokens), where
        # half-nat bins would value a chain's first and its tenth node alike: its map has fine bins there
        # (``lookup_fine``; TreeBudget gives them to a lookup alone, not to a merged draft's lookup nodes).
        self._map_kw = map_kw
        self._own = {LOOKUP: {"prior_weight": lookup_prior_weight, "fine": lookup_fine}}
        self.maps = [self._new_map(source) for source in range(n_sources)]

    def _new_map(self, source: int) -> AcceptanceMap:
        return AcceptanceMap(**{**self._map_kw, **self._own.get(source, {})})

    def prob(self, scores: np.ndarray, sources: np.ndarray | None = None) -> np.ndarray:
        """Acceptance probability of each node (``sources`` None: all from the model draft, source 0)."""
        if sources is None:
            return self.maps[0].prob(scores)
        sources = np.asarray(sources)
        out = np.empty(len(sources))
        for code in np.unique(sources).tolist():
            mask = sources == code
            out[mask] = self.maps[code].prob(np.asarray(scores)[mask])
        return out

    def observe(self, scores: np.ndarray, sources: np.ndarray | None, accepted: np.ndarray) -> None:
        if sources is None or len(sources) != len(scores):
            self.maps[0].observe(scores, accepted)
            return
        sources, scores, accepted = np.asarray(sources), np.asarray(scores), np.asarray(accepted)
        for code in np.unique(sources).tolist():
            mask = sources == code
            self.maps[code].observe(scores[mask], accepted[mask])

    def begin_answer(self) -> None:
        """A new answer: the lookup's map keeps its rates at its prior's weight
        (:meth:`AcceptanceMap.weigh_as_prior`). How often a lookup's chains hold is a property of the text (a code edit copies for hundreds of tokens, a
        summary paraphrases after a few), while the model draft's acceptance is the draft's own and is kept."""
        self.maps[LOOKUP].weigh_as_prior()

    @property
    def n_observed(self) -> int:
        return sum(m.n_observed for m in self.maps)


def best_size(p_sorted: np.ndarray, draft_s: float, costs: CostModel, max_nodes: int,
              switch_s: float = 0.0) -> tuple[int, float]:
    """The node count (root included) with the highest expected tokens per second, and that rate.

    ``p_sorted``: acceptance probabilities of the ranked candidates, best first. n = 1 (root only, i.e. the
    round's draft wasted) is always a choice; it is decoded as a plain step, so only a tree (n >= 2) pays
    ``switch_s``, the time a tree that starts a run costs the plain steps after it (:attr:`CostModel.switch_steps`).
    """
    m = min(len(p_sorted), max_nodes - 1)
    expected = 1.0 + np.concatenate([[0.0], np.cumsum(p_sorted[:m])])
    n = np.arange(1, m + 2)
    rate = expected / (draft_s + costs.verify_s(n) + np.where(n > 1, switch_s, 0.0))
    i = int(np.argmax(rate))
    return int(n[i]), float(rate[i])


def deeper_can_pay(p_sorted: np.ndarray, frontier_mass: float, draft_s: float, levels_left: int,
                   costs: CostModel, max_nodes: int, level_s: float | None = None,
                   frontier_best: float | None = None, switch_s: float = 0.0) -> bool:
    """Could one or more further levels beat the best tree available now?

    New nodes descend from the frontier: a node's path probability is at most its frontier ancestor's
    (``frontier_best`` at most; default ``frontier_mass``) and a level's sum at most the frontier's, so k new
    nodes over j more levels add at most ``min(k * frontier_best, j * frontier_mass)`` expected tokens. That
    optimistic gain, over the best n current nodes plus the k new ones verified, at the cost of j more draft
    levels, is compared with the best rate now: a bushy frontier of unlikely nodes (lookups' many weak
    continuations) has mass, but each of its nodes costs a verify slot for little.
    ``level_s``: a level's draft time (default: the cost model's; 0 for lookup branches, where more levels
    cost nothing, so only the deepest bound need be checked). ``switch_s``: as :func:`best_size` takes it.
    """
    level_s = costs.draft_level_now if level_s is None else level_s
    best = frontier_mass if frontier_best is None else min(frontier_best, frontier_mass)
    if best <= 0.0:
        return False
    _, now = best_size(p_sorted, draft_s, costs, max_nodes, switch_s)
    m = min(len(p_sorted), max_nodes - 1)
    expected = 1.0 + np.concatenate([[0.0], np.cumsum(p_sorted[:m])])  # the best n current nodes, n = 1..m+1
    total = np.arange(1, max_nodes + 1)  # nodes verified: n current + k new
    new = total[None, :] - np.arange(1, len(expected) + 1)[:, None]  # k, per (n, total); < 0: impossible
    new_best = np.where(new >= 0, new * best, -np.inf)
    verify = costs.verify_s(total) + np.where(total > 1, switch_s, 0.0)
    for j in range(levels_left if level_s == 0.0 else 1, levels_left + 1):
        value = (expected[:, None] + np.minimum(new_best, j * frontier_mass)).max(axis=0)
        if float((value / (draft_s + j * level_s + verify)).max()) > now:
            return True
    return False
