"""The auto budget's state set directly, where the package sets it only from rounds: a test starts from "this
kind of round wins" or "loses" without playing the rounds that would lead there."""

from __future__ import annotations

from eagle2_local.tree_policy import TreeBudget


def set_tree_rate(budget: TreeBudget, rate: float | None, kind: int | None = None) -> None:
    """Make the tokens/s that rounds of ``kind`` (default: the budget's main kind) realise by the cost model
    ``rate`` at today's plain speed (None: no round of that kind modelled yet), as ``budget.tree_rate`` reads it."""
    kind = budget._main if kind is None else kind
    budget._gain[kind] = None if rate is None else rate / budget.costs.plain_rate
