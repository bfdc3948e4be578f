"""What a generation cost and how well its draft did: one generation's tally, and the sum of several.

The loop adds its rounds here (:meth:`GenerationStats.add_round`); the benchmark and the server add generations up
with the same type, so every figure (τ, host time per round) is computed in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .tree import SOURCE_NAMES
from ..tree_policy import RoundResult, RoundTimes


@dataclass
class GenerationStats:
    """What one generation cost and how well the draft did."""

    engine: str = "plain"
    prompt_tokens: int = 0
    prompt_tokens_reused: int = 0
    n_tokens: int = 0
    target_passes: int = 0  # decoding passes (the prompt's prefill excluded)
    pass_tokens: int = 0  # tokens those passes produced: accepted + the target's own, also any past a stop
    accepted_per_depth: list[int] = field(default_factory=list)
    tree_sizes: list[int] = field(default_factory=list)  # nodes verified per drafted round
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
        self.tree_sizes.append(r.n_nodes)
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

    @property
    def host_s(self) -> float:
        return self.host_draft_s + self.host_verify_s

    @property
    def drafted_nodes(self) -> int:
        """Draft nodes verified (roots excluded), over all drafted rounds."""
        return sum(self.tree_sizes) - len(self.tree_sizes)

    def host_dict(self) -> dict:
        """The host-time sums and figures: per round (ms) and per drafted node verified (µs)."""
        sums = {"rounds": self.rounds, "drafted_nodes": self.drafted_nodes, "rounds_s": round(self.rounds_s, 6),
                "llama_s": round(self.llama_s, 6), "host_draft_s": round(self.host_draft_s, 6),
                "host_verify_s": round(self.host_verify_s, 6)}
        return {**sums, **host_summary([sums])}

    @property
    def decode_s(self) -> float:
        return max(self.total_s - self.prefill_s, 1e-9)

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of decoding (prefill excluded, the same for both loops)."""
        return self.n_tokens / self.decode_s if self.n_tokens else 0.0

    @property
    def tau(self) -> float:
        """Tokens produced per target decoding pass, as EAGLE counts them: every pass produces its accepted
        draft tokens plus one of its own, so τ >= 1 (exactly 1 for plain decoding). Counting emitted tokens
        instead would credit the prefill's token to the passes and drop an end-of-generation token."""
        return self.pass_tokens / self.target_passes if self.target_passes else 1.0

    def as_dict(self) -> dict:
        return {
            "engine": self.engine, "prompt_tokens": self.prompt_tokens,
            "prompt_tokens_reused": self.prompt_tokens_reused, "n_tokens": self.n_tokens,
            "target_passes": self.target_passes, "pass_tokens": self.pass_tokens, "tau": round(self.tau, 4),
            "accepted_per_depth": list(self.accepted_per_depth),
            "mean_tree_size": round(float(np.mean(self.tree_sizes)), 2) if self.tree_sizes else 0.0,
            "tree_size_hist": {int(n): int(c) for n, c in zip(*np.unique(self.tree_sizes, return_counts=True))},
            "nodes_by_source": dict(self.nodes_by_source), "accepted_by_source": dict(self.accepted_by_source),
            "plain_steps": self.plain_steps, "budget": self.budget,
            "prefill_s": round(self.prefill_s, 4), "draft_s": round(self.draft_s, 4),
            "verify_s": round(self.verify_s, 4),
            "other_s": round(max(self.decode_s - self.draft_s - self.verify_s, 0.0), 4),
            "total_s": round(self.total_s, 4), "tokens_per_s": round(self.tokens_per_s, 3),
            **self.host_dict(),
        }


def host_summary(stats: list[dict]) -> dict:
    """Host time (rounds' wall time minus time inside llama.cpp) over the sums of one or more generations' stats
    (a benchmark set, a server's generations): in all, per round and per drafted node verified (None without
    any), on the draft and the verify side."""
    rounds = sum(s.get("rounds", 0) for s in stats)
    draft, verify = (sum(s.get(k, 0.0) for s in stats) for k in ("host_draft_s", "host_verify_s"))
    nodes = sum(s.get("drafted_nodes", 0) for s in stats)
    per_round = 1e3 / rounds if rounds else 0.0
    return {"host_s": round(draft + verify, 6), "host_ms_per_round": round((draft + verify) * per_round, 4),
            "host_draft_ms_per_round": round(draft * per_round, 4),
            "host_verify_ms_per_round": round(verify * per_round, 4),
            "host_us_per_node": round((draft + verify) * 1e6 / nodes, 3) if nodes else None}


def add_counts(total: dict[str, int], counts: dict[str, int]) -> dict[str, int]:
    """Add ``counts`` into ``total`` key by key (per-source counts of rounds or generations); returns ``total``."""
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
