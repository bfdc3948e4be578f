"""How big each round's draft tree is: the plan/observe interface the generation loop speaks (base.py), EAGLE-2's
fixed tree, and the auto budget (budget.py) with its parts: the cost model (costs.py), the sizing maths
(sizing.py), the draft-or-plain schedule (schedule.py) and the realised-rate guard (guard.py). All pure."""

from .base import PLAIN_STEP, FixedTree, RoundPlan, RoundResult, RoundTimes, TreePolicy
from .budget import TreeBudget
from .costs import CostModel
from .guard import RateGuard
from .schedule import Exploration, ProbeSchedule
from .sizing import AcceptanceMap, SourceAcceptance, best_size, deeper_can_pay

__all__ = ["PLAIN_STEP", "AcceptanceMap", "CostModel", "Exploration", "FixedTree", "ProbeSchedule", "RateGuard",
           "RoundPlan", "RoundResult", "RoundTimes", "SourceAcceptance", "TreeBudget", "TreePolicy", "best_size",
           "deeper_can_pay"]
