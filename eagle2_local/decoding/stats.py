"""What a generation cost and how well its draft did: one generation's tally, and the sum of several.

The loop adds its rounds here (:meth:`GenerationStats.add_round`). Generations add up with ``+`` into the same
type (a chat's turns, a benchmark set, a server's requests), so every figure over them (τ, tokens per second,
host time per round and per node) is computed here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from itertools import zip_longest

import numpy as np

from ..tree.proposals import SOURCE_NAMES
from ..tree_policy import RoundResult, RoundTimes


@dataclass
class GenerationStats:
    """What one generation (or several, added up) cost and how well the draft did."""

    engine: str = "plain"
    prompt_tokens: int = 0
    prompt_tokens_reused: int = 0
    n_tokens: int = 0
    target_passes: int = 0  # decoding passes (the prompt's prefill excluded)
    pass_tokens: int = 0  # tokens those passes produced: accepted + the target's own, also any past a stop
    accepted_per_depth: list[int] = field(default_factory=list)
    # Drafted rounds by the size of their verified tree (nodes, root included): a histogram, not a list of
    # rounds, so that a server's totals over any number of generations stay the same size.
    tree_sizes: dict[int, int] = field(default_factory=dict)
    nodes_by_source: dict[str, int] = field(default_factory=dict)  # verified draft nodes per drafter (SOURCE_NAMES)
    accepted_by_source: dict[str, int] = field(default_factory=dict)  # accepted draft tokens per drafter
    plain_steps: int = 0  # rounds the tree policy (or a full context) turned into plain decoding steps
    budget: dict | None = None  # the auto budget's state after this generation (None: fixed tree)
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    total_s: float = 0.0
    # The rounds' wall time split into time inside llama.cpp and the host's own work (numpy, Python), on the
    # draft side (catch-up, levels, tree selection) and the verify side (verify, accept, commit): the host part
    # is what a GPU cannot speed up, so it bounds the speed-up there.
    rounds: int = 0
    rounds_s: float = 0.0
    llama_s: float = 0.0
    host_draft_s: float = 0.0
    host_verify_s: float = 0.0

    def add_round(self, r: RoundResult) -> None:
        """One round of the speculative loop: a tree (its passes, sizes, acceptance by depth and source) or a
        plain step."""
        self.target_passes += 1
        self.pass_tokens += r.n_emitted  # the accepted draft tokens and the target's own
        self.draft_s += r.times.draft_s
        self.verify_s += r.times.verify_s
        self.add_host(r.times)
        if not r.plan.drafts:
            self.plain_steps += 1
            return
        size = int(r.n_nodes)
        self.tree_sizes[size] = self.tree_sizes.get(size, 0) + 1
        _count_depths(self.accepted_per_depth, r.n_emitted - 1)
        _count_sources(self.nodes_by_source, r.node_sources)
        _count_sources(self.accepted_by_source, r.node_sources[r.accepted])

    def add_host(self, t: RoundTimes) -> None:
        """One round's (or plain decoding step's) wall time, llama.cpp time and host time on each side."""
        self.rounds += 1
        self.rounds_s += t.done - t.start
        self.llama_s += t.llama_draft_s + t.llama_verify_s
        self.host_draft_s += t.host_draft_s
        self.host_verify_s += t.host_verify_s

    def __add__(self, other: GenerationStats) -> GenerationStats:
        """Two generations as one (``self`` first): counts and times add, acceptance adds depth by depth, tree
        sizes and per-source counts add key by key, and the engine and the auto budget's state are ``other``'s
        (the state after both). ``GenerationStats()`` starts a sum: ``sum(parts, GenerationStats())``."""
        if not isinstance(other, GenerationStats):
            return NotImplemented
        out = GenerationStats(engine=other.engine, budget=other.budget)
        for f in fields(self):
            if f.name in ("engine", "budget"):
                continue
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, list):  # accepted_per_depth
                setattr(out, f.name, [a + b for a, b in zip_longest(mine, theirs, fillvalue=0)])
            elif isinstance(mine, dict):
                setattr(out, f.name, add_counts(dict(mine), theirs))
            else:
                setattr(out, f.name, mine + theirs)
        return out

    @property
    def host_s(self) -> float:
        return self.host_draft_s + self.host_verify_s

    @property
    def drafted_nodes(self) -> int:
        """Draft nodes verified (roots excluded), over all drafted rounds."""
        return sum((size - 1) * n for size, n in self.tree_sizes.items())

    @property
    def mean_tree_size(self) -> float:
        """Nodes verified per drafted round, roots included (0.0 without any)."""
        n = sum(self.tree_sizes.values())
        return sum(size * c for size, c in self.tree_sizes.items()) / n if n else 0.0

    @property
    def decode_s(self) -> float:
        return max(self.total_s - self.prefill_s, 1e-9)

    @property
    def other_s(self) -> float:
        """Decoding time spent neither drafting nor verifying (sampling, streaming, the policy)."""
        return max(self.decode_s - self.draft_s - self.verify_s, 0.0)

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of decoding (prefill excluded, the same for both loops)."""
        return self.n_tokens / self.decode_s if self.n_tokens else 0.0

    @property
    def tokens_per_s_e2e(self) -> float:
        """Generated tokens per second of the whole time, the prompt's evaluation included."""
        return self.n_tokens / self.total_s if self.total_s else 0.0

    @property
    def tau(self) -> float:
        """Tokens produced per target decoding pass, as EAGLE counts them: every pass produces its accepted
        draft tokens plus one of its own, so τ >= 1 (exactly 1 for plain decoding). Counting emitted tokens
        instead would credit the prefill's token to the passes and drop an end-of-generation token."""
        return self.pass_tokens / self.target_passes if self.target_passes else 1.0

    def host_figures(self) -> dict:
        """Host time (rounds' wall time minus time inside llama.cpp): in all, per round and per drafted node
        verified (None without any), on the draft and the verify side."""
        per_round = 1e3 / self.rounds if self.rounds else 0.0
        nodes = self.drafted_nodes
        return {"host_s": round(self.host_s, 6), "host_ms_per_round": round(self.host_s * per_round, 4),
                "host_draft_ms_per_round": round(self.host_draft_s * per_round, 4),
                "host_verify_ms_per_round": round(self.host_verify_s * per_round, 4),
                "host_us_per_node": round(self.host_s * 1e6 / nodes, 3) if nodes else None}

    def host_totals(self) -> dict:
        """The host time of many generations (a benchmark set, a server's): the rounds, their time inside
        llama.cpp and :meth:`host_figures`."""
        return {"rounds": self.rounds, "llama_s": round(self.llama_s, 4), **self.host_figures()}

    def host_dict(self) -> dict:
        """One generation's host-time sums and :meth:`host_figures`."""
        return {"rounds": self.rounds, "drafted_nodes": self.drafted_nodes, "rounds_s": round(self.rounds_s, 6),
                "llama_s": round(self.llama_s, 6), "host_draft_s": round(self.host_draft_s, 6),
                "host_verify_s": round(self.host_verify_s, 6), **self.host_figures()}

    def totals_dict(self) -> dict:
        """The figures that mean something summed over many generations (a server's ``/stats``): counts, τ, the
        draft tokens verified and accepted per drafter, and the rounds' host time."""
        return {"n_tokens": self.n_tokens, "target_passes": self.target_passes, "pass_tokens": self.pass_tokens,
                "tau": round(self.tau, 4), "plain_steps": self.plain_steps,
                "nodes_by_source": dict(self.nodes_by_source), "accepted_by_source": dict(self.accepted_by_source),
                **self.host_totals()}

    def as_dict(self) -> dict:
        return {
            "engine": self.engine, "prompt_tokens": self.prompt_tokens,
            "prompt_tokens_reused": self.prompt_tokens_reused, "n_tokens": self.n_tokens,
            "target_passes": self.target_passes, "pass_tokens": self.pass_tokens, "tau": round(self.tau, 4),
            "accepted_per_depth": list(self.accepted_per_depth),
            "mean_tree_size": round(self.mean_tree_size, 2),
            "tree_size_hist": {int(n): int(c) for n, c in sorted(self.tree_sizes.items())},
            "nodes_by_source": dict(self.nodes_by_source), "accepted_by_source": dict(self.accepted_by_source),
            "plain_steps": self.plain_steps, "budget": self.budget,
            "prefill_s": round(self.prefill_s, 4), "draft_s": round(self.draft_s, 4),
            "verify_s": round(self.verify_s, 4), "other_s": round(self.other_s, 4),
            "total_s": round(self.total_s, 4), "tokens_per_s": round(self.tokens_per_s, 3),
            **self.host_dict(),
        }


def add_counts(total: dict, counts: dict) -> dict:
    """Add ``counts`` into ``total`` key by key (per-source counts, tree sizes); returns ``total``."""
    for key, n in counts.items():
        total[key] = total.get(key, 0) + n
    return total


def _count_sources(counts: dict[str, int], sources: np.ndarray) -> None:
    """Add one to ``counts[name]`` per node, by the drafter that proposed it."""
    per_code = np.bincount(sources, minlength=len(SOURCE_NAMES))  # one pass; np.unique sorts
    add_counts(counts, {SOURCE_NAMES[code]: int(n) for code, n in enumerate(per_code.tolist()) if n})


def _count_depths(per_depth: list[int], n_accepted: int) -> None:
    """Acceptance histogram: per_depth[d-1] counts rounds in which a draft token at depth d was accepted."""
    while len(per_depth) < n_accepted:
        per_depth.append(0)
    for d in range(n_accepted):
        per_depth[d] += 1
