"""Helpers several test modules share: generators and lossless checks, sampling statistics, running the CLI,
target trees, synthetic EAGLE-1/2 heads. Test modules import these from here, never from one another, so that a
test file stays a list of tests (and renaming or deleting one breaks nothing else)."""

from __future__ import annotations

import json
import subprocess
import sys

import llama_cpp
import numpy as np

from convert.eagle1 import convert_head
from eagle2_local.decoding.acceptance import Acceptance
from eagle2_local.decoding.stats import GenerationStats
from eagle2_local.decoding.target import Target
from eagle2_local.drafts import DraftModelEngine
from eagle2_local.errors import ContextFullError
from eagle2_local.generation.generator import Generator
from eagle2_local.llamacpp.llama import LlamaModel
from eagle2_local.llamacpp.settings import ContextSettings
from eagle2_local.tree.draft_tree import DraftTree, TreeParams
from eagle2_local.tree.sampling import SamplingParams, sample_from
from tests.support.eagle_heads import head_config, head_tensors, write_head_dir


# ------------------------------------------------------------------ structured answers
def assert_follows_grammar(model: LlamaModel, choice: dict, grammar, check=None) -> None:
    """The model's rule, not one machine's text: an answer that finished (``choice``'s finish_reason "stop") is
    valid JSON (``check`` validates the value); one cut at max_tokens is still a prefix the grammar accepts, token
    by token (machines' greedy texts differ at near-ties, and so do their lengths)."""
    text = choice["message"]["content"] if "message" in choice else choice["text"]
    if choice["finish_reason"] == "stop":
        value = json.loads(text)
        if check:
            check(value)
        return
    assert choice["finish_reason"] == "length", choice
    state = grammar.state(model)
    try:
        for token in model.tokenize(text, add_special=False, parse_special=False):
            assert state.allows(token), f"{text!r} leaves the grammar"
            state.accept(token)
    finally:
        state.close()


# ------------------------------------------------------------------ generators and lossless checks
ONE_THREAD = ContextSettings(n_ctx=2048, n_batch=256, n_seq_max=64, n_threads=1)
GREEDY = SamplingParams(temperature=0.0)


def run(gen: Generator, prompt: list[int], n: int, sampling=GREEDY, **kw) -> tuple[list[int], str, str]:
    tokens, text, reason = [], "", None
    for ch in gen.generate(prompt, n, sampling, **kw):
        tokens += ch.tokens
        text += ch.text
        reason = ch.finish_reason or reason
    return tokens, text, reason


def make(model: LlamaModel, draft: LlamaModel | None, params=TreeParams(16, 5, 4), settings=ONE_THREAD):
    engine = DraftModelEngine(draft, settings, params.top_k, params.depth) if draft is not None else None
    return Generator(Target(model, settings), engine, params)


def chat_prompt(model: LlamaModel, text: str) -> list[int]:
    return model.tokenize(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def random_prompts(model: LlamaModel, n: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[1] + list(rng.integers(5, model.n_vocab, int(rng.integers(2, 40)))) for _ in range(n)]


def assert_lossless(plain: Generator, spec: Generator, prompt: list[int], max_tokens: int, label) -> None:
    ref, _, _ = run(plain, prompt, max_tokens)
    out, _, _ = run(spec, prompt, max_tokens)
    assert out == ref, f"prompt {label}: diverged at {first_divergence(out, ref)}"


def grown_rows(engine, text: list[int], features, params: TreeParams) -> tuple[dict, dict]:
    """Grow a tree with ``engine`` after ``text`` and keep every node's proposal row and path (candidate id ->
    dense row, candidate id -> its tokens below the root): what a test compares with a reference chain per path."""
    from eagle2_local.tree.draft_tree import grow_candidates

    rows: dict[int, np.ndarray] = {}
    paths: dict[int, list[int]] = {-1: []}

    def expand(cand_ids, tokens, parent_ids, level):
        out = engine.expand(cand_ids, tokens, parent_ids, level)
        for j, (c, t, parent) in enumerate(zip(cand_ids, tokens, parent_ids)):
            paths[c] = paths[parent] + [t]
            rows[c] = out.logits[j].copy()
        return out
    grow_candidates(engine.catch_up(np.asarray(text), features, 0), expand, params)
    return rows, paths


def recorded_roots(gen: Generator, draft, max_tokens: int) -> tuple[list, GenerationStats]:
    """Answer three prompts with ``gen`` (new prompts: rollbacks, a backlog), recording the text and the root row of
    every ``catch_up`` of ``draft`` (the engine inside ``gen``'s, which may wrap it); closes the engine and the
    target. Returns those (text, row) pairs and the answers' added statistics."""
    seen = []
    original = draft.catch_up

    def recording(tokens, features, features_from=0):
        out = original(tokens, features, features_from)
        seen.append((np.asarray(tokens).tolist(), out.logits.copy()))
        return out
    draft.catch_up = recording
    stats = GenerationStats()
    try:
        for prompt in ("hello world", "one two three", "hello world, one"):
            run(gen, gen.target.model.tokenize(prompt), max_tokens)
            stats += gen.last_stats
    finally:
        gen.engine.close()
        gen.target.close()
    return seen, stats


def forced_budget(max_nodes: int, depth: int):
    """A budget on a fixed, moderately steep cost curve (no online timing updates, a guard that never trips), so
    its choices depend on the draft's confidence and observed acceptance: trees of many sizes, plain steps. A
    catch-up costs ~nothing per token (a draft model ingests a prompt in one batch), so a draft that has not read
    a short prompt yet waits one plain step, not the tens a costly catch-up would."""
    from eagle2_local.tree_policy import CostModel, ProbeSchedule, RateGuard, TreeBudget

    sizes = [1, 2, 4, 8, 16, 32]
    costs = CostModel(sizes, [0.010 * (1 + 0.3 * (n - 1)) for n in sizes], 0.001, 0.002, draft_token_s=1e-5,
                      frozen=True)
    return TreeBudget(costs, max_nodes=max_nodes, max_depth=depth, schedule=ProbeSchedule(explore_allowance=2.0),
                      guard=RateGuard(min_rounds=2**62))


# ------------------------------------------------------------------ sampling distributions
N_RUNS = 1500


def chi2_pvalue(a: dict[int, int], b: dict[int, int]) -> float:
    """Two-sample chi-square on token counts; tokens rarer than 10 in total are pooled."""
    keys = sorted(set(a) | set(b))
    big = [k for k in keys if a.get(k, 0) + b.get(k, 0) >= 10]
    rows = [[a.get(k, 0) for k in big], [b.get(k, 0) for k in big]]
    rest = [sum(a.get(k, 0) for k in keys if k not in big), sum(b.get(k, 0) for k in keys if k not in big)]
    if sum(rest) > 0:
        rows[0].append(rest[0])
        rows[1].append(rest[1])
    from scipy.stats import chi2_contingency  # scipy only for the tests that use it

    return float(chi2_contingency(np.array(rows))[1])



def assert_tree_rows_follow_paths(engine, target: Target, model: LlamaModel, reference, same_row) -> None:
    """Top-3 at each level, three levels, over a short text: every node's row is ``reference.chain`` along the
    node's own path (``same_row(ours, theirs, label)`` judges each at the engine's tolerance), the three best nodes
    of each level are expanded, and committing the root leaves the text read. Closes the engine and the target."""
    try:
        text = [1] + model.tokenize("water long little", add_special=False)
        feats = target.prefill(text[:-1]).features
        rows, paths = grown_rows(engine, text, feats, TreeParams(30, 4, 3))
        deep = [c for c in rows if len(paths[c]) >= 2]
        assert len(deep) == 6  # the three best nodes of each level are expanded
        for c in rows:
            same_row(rows[c], reference.chain(text, paths[c])[-1], f"node {c} path {paths[c]}")
        engine.commit(np.asarray([0]))
        assert engine.n_read == len(text)
    finally:
        engine.close()
        target.close()


def assert_keeps_the_distribution(plain: Generator, spec: Generator, prompt: list[int], runs: int) -> None:
    """T=1: the tokens at positions 1 and 2 of ``spec`` (a draft's generator) are distributed as ``plain``'s
    (chi-square over ``runs`` seeds each), and drafts were accepted and rejected (τ above 1.3). Closes the draft
    engine and both targets."""
    sampling = SamplingParams(temperature=1.0)

    def counts(gen: Generator) -> tuple[dict, GenerationStats]:
        out, stats = {1: {}, 2: {}}, GenerationStats()
        for seed in range(runs):
            toks, _, _ = run(gen, prompt, 4, sampling, seed=seed, speculative=gen.engine is not None)
            stats += gen.last_stats
            for p in out:
                tok = toks[p] if p < len(toks) else -1
                out[p][tok] = out[p].get(tok, 0) + 1
        return out, stats

    try:
        (a, _), (b, stats) = counts(plain), counts(spec)
    finally:
        spec.engine.close()
        spec.target.close()
        plain.target.close()
    for p in (1, 2):
        assert chi2_pvalue(a[p], b[p]) > 0.01, f"position {p}: {a[p]} vs {b[p]}"
    assert stats.tau > 1.3, stats.as_dict()  # drafts were accepted (and rejected: T=1 on a spread distribution)


def _biased_walk(tree, logits, params, history, rng, accept_prob, grammar=None):
    """Tree rejection sampling with a wrong acceptance probability: ``accept_prob(x, p, context, node)`` instead
    of p(x); rejections and the bonus follow p (masked by ``grammar`` when given, which the walk advances)."""
    node, path = 0, [0]
    hist = np.asarray(history, dtype=np.int64)
    while True:
        context = np.concatenate([hist, tree.tokens[path].astype(np.int64)])
        p = params.probs(logits[node] if grammar is None else grammar.constrain(logits[node]), context)
        first, chosen = p, -1
        for child in tree.children(node):
            x = int(tree.tokens[child])
            if rng.random() < accept_prob(x, first, context, node):
                chosen = int(child)
                break
            p = p.copy()
            p[x] = 0.0
            if p.sum() <= 0:
                break
            p /= p.sum()
        token = sample_from(p, rng) if chosen < 0 else int(tree.tokens[chosen])
        if grammar is not None:
            grammar.accept(token)
        if chosen < 0:
            return Acceptance(np.asarray(path), token)
        node = chosen
        path.append(node)


def over_accepting(tree, logits, params, history, rng):
    """A plausible bug: accept a drafted child with probability 2*p(x) instead of p(x)."""
    return _biased_walk(tree, logits, params, history, rng, lambda x, p, context, node: min(1.0, 2.0 * p[x]))


def mask_ignoring(tree, logits, params, history, rng, grammar):
    """A plausible bug under a grammar: accept a drafted child with its probability under the *unmasked* target
    (too low wherever the grammar removes mass), while rejections and the bonus use the masked one."""
    return _biased_walk(tree, logits, params, history, rng,
                        lambda x, p, context, node: params.probs(logits[node], context)[x], grammar)


# ------------------------------------------------------------------ the command line
def run_cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True, input=stdin,
                          timeout=300)


def assert_one_line_error(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    assert needle in lines[0], lines[0]


# ------------------------------------------------------------------ target contexts and trees
# Measured on this CPU build (see docs/design.md §1 and NOTES.md#lossless): quantized models are batch-invariant
# for batches of up to 63 tokens with ONE thread. With 2+ threads, single-token decodes over >= 512 KV cells take
# flash-attention's split-KV path; batches of >= 64 queries take its tiled path; both change float order.
SETTINGS = ContextSettings(n_ctx=1024, n_batch=128, n_seq_max=80, n_threads=1)


def sequential_logits(model, prefix, tokens, settings=SETTINGS):
    """Logits after each of ``tokens``, decoded one at a time after ``prefix`` on a fresh context."""
    t = Target(model, settings)
    t.prefill(prefix)
    out = [t.decode_one(int(tok)).logits[0] for tok in tokens]
    t.close()
    return np.array(out)


def path_to(tree: DraftTree, node: int) -> np.ndarray:
    """Node indices from the root down to ``node`` inclusive."""
    path = []
    while node >= 0:
        path.append(node)
        node = int(tree.parents[node])
    return np.asarray(path[::-1], dtype=np.int64)


def random_tree(rng, n_vocab, n, max_depth):
    parents = [-1]
    depth = [0]
    for i in range(1, n):
        choices = [j for j in range(i) if depth[j] < max_depth]
        p = int(rng.choice(choices))
        parents.append(p)
        depth.append(depth[p] + 1)
    return DraftTree.from_parents(rng.integers(5, n_vocab, n), parents)


def free_cells(target: Target) -> int:
    """Count free KV cells by filling a scratch sequence until llama.cpp finds no slot (it returns 1, no abort)."""
    scratch = target.ctx.n_seq_max - 2
    n = 0
    step = target.ctx.n_batch
    while step >= 1:
        try:
            toks = np.full(step, 7, dtype=np.int32)
            pos = np.arange(n, n + step, dtype=np.int32)
            target.ctx.decode(toks, pos, np.zeros(step, dtype=np.int8), seq=scratch)
            n += step
        except ContextFullError:
            step //= 2
    target.ctx.seq_rm(scratch)
    return n


class Restores:
    """Counts a target's commits that moved accepted rows: the only ones that load saved K/V rows back (through
    ``ctx.load_seq``), so the tests can check that path ran without the target keeping a count for them."""

    def __init__(self, target: Target) -> None:
        self.n = 0
        load_seq = target.ctx.load_seq

        def counted(data: bytes, seq: int) -> None:
            self.n += 1
            load_seq(data, seq)

        target.ctx.load_seq = counted


def check_thousand_rounds_leak_no_cells(model) -> tuple[Target, Restores]:
    """1,000 random verify/commit rounds with rollbacks; the free cells always equal n_ctx - n_past."""
    settings = ContextSettings(n_ctx=512, n_batch=64, n_seq_max=40, n_threads=1)
    rng = np.random.default_rng(3)
    t = Target(model, settings)
    restores = Restores(t)
    t.prefill([1, 5, 6])
    for i in range(1000):
        tree = random_tree(rng, model.n_vocab, int(rng.integers(1, 30)), 4)
        t.verify(tree)
        t.commit(path_to(tree, int(rng.choice(len(tree))))[:3])
        if t.n_past > 400:
            t.rollback(3)
        if i % 250 == 0:
            assert free_cells(t) == t.n_ctx - t.n_past
    assert t.ctx.seq_pos_max(0) == t.n_past - 1
    assert llama_cpp.llama_memory_seq_pos_min(t.ctx.mem, 0) == 0
    assert free_cells(t) == t.n_ctx - t.n_past
    return t, restores


# ------------------------------------------------------------------ EAGLE-1/2 heads
def synthetic_head(tmp_path, name: str, variant: str = "vicuna", **shape) -> str:
    """A random head converted by the converter (borrowing the target's embedding), as a GGUF path."""
    cfg = head_config(variant, **shape)
    folder = write_head_dir(tmp_path / name, cfg, head_tensors(cfg, seed=4, with_embedding=False))
    return str(convert_head(folder, tmp_path / f"{name}.gguf", outtype="f16"))
