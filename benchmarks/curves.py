"""Recorded verify-cost curves (benchmarks/curves.json) as the runtime's cost models.

A policy is judged on a machine by the machine's verify curve: what a tree of n nodes costs in plain steps. The
curves of the machines the project was measured on are kept as data, so a decision rule can be replayed on all
of them on any one machine (benchmarks/budget_replay.py ``--curve``). A curve becomes the runtime's own
:class:`~eagle2_local.tree_policy.costs.CostModel` (sizes and seconds as a calibration would give them), so c(n)
between measured sizes is what the budget itself would read: linear in n between measured points, the last
segment's slope past the largest, within [1, n].
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from eagle2_local.tree_policy.costs import CostModel

CURVES_FILE = Path(__file__).with_name("curves.json")


@dataclass(frozen=True)
class Curve:
    """One machine's verify curve for one model (see curves.json for the fields)."""

    name: str
    machine: str
    model_file: str
    threads: int
    context: int
    plain_ms: float
    points: dict[int, float]  # c(n) for the measured n > 1
    draft: dict[str, float] | None  # drafting costs in plain steps (root, level, token), or None: not recorded
    source: str

    def cost_model(self, drafting: CostModel | None = None) -> CostModel:
        """The curve as a calibration: verify seconds at the plain step's recorded speed, drafting from the
        curve's own record, else in the proportions ``drafting`` (this machine's calibration) has to its plain
        step, else free."""
        plain_s = self.plain_ms / 1e3
        sizes = [1, *sorted(self.points)]
        verify = [plain_s * (1.0 if n == 1 else self.points[n]) for n in sizes]
        rel = self.draft if self.draft is not None else _draft_rel(drafting)
        token = rel.get("token")
        return CostModel(sizes, verify, rel["root"] * plain_s, rel["level"] * plain_s,
                         None if token is None else token * plain_s)

    def c(self, n: int | np.ndarray) -> np.ndarray | float:
        """Verifying n nodes, in plain steps, as the cost model reads the curve."""
        return self.cost_model().shape(n)


def _draft_rel(costs: CostModel | None) -> dict[str, float]:
    """A calibration's drafting costs over its plain step (none given: drafting free)."""
    if costs is None:
        return {"root": 0.0, "level": 0.0}
    plain = costs.verify[0]
    rel = {"root": costs.draft_root_s / plain, "level": costs.draft_level_s / plain}
    if costs.draft_token_s is not None:
        rel["token"] = costs.draft_token_s / plain
    return rel


def load_curves(path: Path = CURVES_FILE) -> dict[str, Curve]:
    """Every curve in the file, by name."""
    out = {}
    for rec in json.loads(Path(path).read_text())["curves"]:
        points = {int(n): float(c) for n, c in rec["c"].items()}
        if not points or min(points) < 2 or any(c < 1.0 for c in points.values()):
            raise ValueError(f"curve {rec['name']}: c(n) needs sizes >= 2 at >= 1 plain step")
        out[rec["name"]] = Curve(rec["name"], rec["machine"], rec["model_file"], int(rec["threads"]),
                                 int(rec["context"]), float(rec["plain_ms"]), points, rec.get("draft"),
                                 rec["source"])
    return out


def curves_for(model_file: str, path: Path = CURVES_FILE) -> list[Curve]:
    """The curves recorded for a model file (by its file name), in file order."""
    return [c for c in load_curves(path).values() if c.model_file == Path(model_file).name]
