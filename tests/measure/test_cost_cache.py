"""The cost cache (measure/cost_cache.py): calibrations kept on disk under their key, and refreshable."""

from __future__ import annotations

from eagle2_local.measure.cost_cache import CostKey, cached_or_measured, load_costs, save_costs
from eagle2_local.tree_policy import CostModel
from tests.support.budget_helpers import flat, steep


def test_cost_cache_is_keyed_and_refreshable(tmp_path):
    key = CostKey(model="m.gguf:1:2", draft="d.gguf:3:4", build="0.3.36 CPU", threads=2, n_gpu_layers=0,
                  tree_top_k=10)
    calls = []

    def measure() -> CostModel:
        calls.append(1)
        return steep()

    costs, info = cached_or_measured(key, measure, directory=tmp_path)
    assert info["source"] == "fresh" and len(calls) == 1
    again, info = cached_or_measured(key, measure, directory=tmp_path)
    assert info["source"] == "cached" and len(calls) == 1 and again.to_dict() == costs.to_dict()
    _, info = cached_or_measured(key, measure, refresh=True, directory=tmp_path)
    assert info["source"] == "fresh" and len(calls) == 2
    _, info = cached_or_measured(key, measure, directory=tmp_path, check=lambda c: (True, {"tree_over_plain": 7.9}))
    assert info["source"] == "cached-verified" and info["check"] == {"tree_over_plain": 7.9} and len(calls) == 2
    disagree = (False, {"reason": "16 nodes cost 2.0 plain steps, the cache says 7.9"})
    _, info = cached_or_measured(key, measure, directory=tmp_path, check=lambda c: disagree)
    assert info["source"] == "re-measured" and info["check"] == disagree[1] and len(calls) == 3

    def disturbed() -> CostModel:
        cm = flat()
        cm.quality = {"problems": ["60 nodes spread 300%"]}
        return cm

    kept, info = cached_or_measured(key, disturbed, directory=tmp_path, check=lambda c: disagree)
    assert info["source"] == "cached, kept (re-measure disturbed)" and kept.to_dict() == steep().to_dict()
    assert load_costs(key, tmp_path).to_dict() == steep().to_dict()  # the disturbed one was not written
    other = CostKey(model="m.gguf:1:2", draft="d.gguf:3:4", build="0.3.36 CPU", threads=1, n_gpu_layers=0,
                    tree_top_k=10)
    assert other.file_name() != key.file_name() and load_costs(other, tmp_path) is None
    (tmp_path / key.file_name()).write_text("{not json")
    assert load_costs(key, tmp_path) is None  # a corrupt cache means recalibrating, not crashing
    assert save_costs(key, steep(), tmp_path / "f" / "g") is not None
