"""Where a round's host time goes: each round function's own host time (thread CPU time minus llama.cpp time,
minus what the functions it calls already count), per tree round, for one ``host_time.py`` run.

    python benchmarks/host_split.py --threads 1 --total-tokens 60 --max-tokens 128 [host_time.py options]

Every listed function is wrapped; a wrapper reads two clocks and the llama.cpp accumulator per call (~2 us on
this machine's thread clock), so the figures add up to more than ``host_time.py``'s, most for the functions
called most often: read them as shares, and take ``host_time.py``'s figure as the total. "sampler callbacks"
is the in-graph top-k's Python inside llama.cpp's graph building (counted as host time there too).
"""

from __future__ import annotations

import atexit
import collections
import functools
import runpy
import sys
import time
from pathlib import Path

time.perf_counter = time.thread_time  # before eagle2_local binds it: the same clock as host_time --cpu-clock

from eagle2_local.decoding import backlog, target
from eagle2_local.drafts import base, draft_model, eagle3_llama, lookup, merged  # noqa: E402
from eagle2_local.generation import generator
from eagle2_local.llamacpp import backend_topk, llama, runtime  # noqa: E402
from eagle2_local.tree import proposals

WRAPPED = {  # owner -> functions whose own host time is listed
    generator.Generator: ["_tree_round"],
    merged.MergedDraft: ["catch_up", "expand", "commit"],
    eagle3_llama.Eagle3Engine: ["catch_up", "expand", "_encode", "_process_entries", "_rows", "_prenorm", "commit"],
    draft_model.DraftModelEngine: ["catch_up", "expand", "_rows", "commit"],
    lookup.LookupDraft: ["catch_up_rows", "expand_rows", "_continue", "proposals", "next_rate"],
    lookup.NgramIndex: ["extend", "continuations"],
    base.TreeSequences: ["assign", "forget"],
    llama.LlamaContext: ["decode", "seq_rm", "seq_cp", "seq_cp_many", "seq_rm_many", "seq_keep",
                         "logits", "layer_inputs", "save_seq", "load_seq"],
    backend_topk.BackendTopK: ["read", "activate"],
    target.Target: ["verify", "commit"],
    backlog.FeatureBacklog: ["take", "restart", "extend"],
    proposals.Proposals: ["best", "row_mass"],
    merged: ["weigh_into", "merge_row"],
    generator: ["accept", "select_tree", "grow_candidates"],
}

own: collections.defaultdict[str, float] = collections.defaultdict(float)
calls: collections.Counter[str] = collections.Counter()
_stack: list[float] = []  # host time of the callees of each open call


def _wrap(owner, name: str) -> None:
    fn = getattr(owner, name)
    label = f"{getattr(owner, '__name__', owner)}.{name}".replace("eagle2_local.", "")

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        t0, l0 = time.thread_time(), runtime.llama_seconds()
        _stack.append(0.0)
        try:
            return fn(*args, **kwargs)
        finally:
            host = (time.thread_time() - t0) - (runtime.llama_seconds() - l0)
            inner = _stack.pop()
            own[label] += host - inner
            calls[label] += 1
            if _stack:
                _stack[-1] += host

    setattr(owner, name, timed)


def main() -> None:
    for owner, names in WRAPPED.items():
        for name in names:
            if hasattr(owner, name):
                _wrap(owner, name)
    callbacks = [0.0]
    counted = backend_topk.host_inside_llama

    def callback_time(seconds: float) -> None:
        callbacks[0] += seconds
        counted(seconds)

    backend_topk.host_inside_llama = callback_time

    def report() -> None:
        n = max(calls["Generator._tree_round"], 1)  # tree rounds, the warm-up's included
        print(f"per tree round ({n} rounds, warm-up included), own host ms and calls:")
        print(f"  {'sampler callbacks':40s} {callbacks[0] / n * 1e3:7.3f}")
        for label, seconds in sorted(own.items(), key=lambda kv: -kv[1]):
            print(f"  {label:40s} {seconds / n * 1e3:7.3f}  {calls[label] / n:6.1f}")

    atexit.register(report)
    script = Path(__file__).with_name("host_time.py")
    sys.argv = [str(script)] + sys.argv[1:]
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
