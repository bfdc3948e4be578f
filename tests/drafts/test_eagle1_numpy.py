"""The numpy EAGLE-1/2 engine against an independent torch implementation of the head, and its state handling."""

from __future__ import annotations

import numpy as np
import pytest

from convert.eagle1 import convert_head
from eagle2_local.drafts import Eagle1NumpyEngine
from eagle2_local.errors import TreeError
from eagle2_local.formats.eagle1_format import read_head
from tests.support.eagle_heads import VARIANTS, head_config, head_tensors, write_head_dir

VOCAB, HIDDEN = 300, 64
# a tree of depth 4 below the root: (parent candidate ids per level); ids are numbered level by level
TREE = [[-1, -1, -1], [0, 0, 2], [3, 4, 4], [6, 8]]


def make_head(tmp_path, variant: str, with_embedding: bool = True):
    cfg = head_config(variant, hidden=HIDDEN, vocab=VOCAB)
    tensors = head_tensors(cfg, seed=11, with_embedding=with_embedding)
    head = read_head(convert_head(write_head_dir(tmp_path / variant, cfg, tensors), tmp_path / f"{variant}.gguf",
                                  outtype="f32"))
    return cfg, tensors, head


def target_side(seed: int = 5):
    rng = np.random.default_rng(seed)
    emb = rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32)
    lm = (rng.standard_normal((VOCAB, HIDDEN)) * HIDDEN ** -0.5).astype(np.float32)
    return emb, lm


def torch_head(cfg: dict, tensors: dict, emb: np.ndarray, lm: np.ndarray):
    """EAGLE-1 head in plain torch (float64), written from the paper's description, with an explicit mask."""
    import torch
    F = torch.nn.functional
    W = {k: torch.from_numpy(v).double() for k, v in tensors.items()}
    E = W["embed_tokens.weight"] if "embed_tokens.weight" in W else torch.from_numpy(emb).double()
    LM = torch.from_numpy(lm).double()
    h, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = h // nh
    a = "layers.0.self_attn."

    def rotate_half(t):
        return torch.cat([-t[..., hd // 2:], t[..., :hd // 2]], dim=-1)

    def run(tokens, feats, pos, mask):
        x = F.linear(torch.cat([E[torch.as_tensor(tokens)], torch.as_tensor(feats).double()], -1),
                     W["fc.weight"], W.get("fc.bias"))
        n = x.shape[0]
        q = F.linear(x, W[a + "q_proj.weight"], W.get(a + "q_proj.bias")).view(n, nh, hd).transpose(0, 1)
        k = F.linear(x, W[a + "k_proj.weight"], W.get(a + "k_proj.bias")).view(n, nkv, hd).transpose(0, 1)
        v = F.linear(x, W[a + "v_proj.weight"], W.get(a + "v_proj.bias")).view(n, nkv, hd).transpose(0, 1)
        inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        ang = torch.as_tensor(pos, dtype=torch.float64)[:, None] * inv[None]
        cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.as_tensor(mask)).transpose(0, 1).reshape(n, h)
        hid = x + F.linear(o, W[a + "o_proj.weight"])
        m = "layers.0.mlp."
        hn = hid * torch.rsqrt(hid.pow(2).mean(-1, keepdim=True) + cfg["rms_norm_eps"]) * \
            W["layers.0.post_attention_layernorm.weight"]
        y = hid + F.linear(F.silu(F.linear(hn, W[m + "gate_proj.weight"])) * F.linear(hn, W[m + "up_proj.weight"]),
                           W[m + "down_proj.weight"])
        return y, y @ LM.T

    return run


def reference_tree(run, tokens, feats, tree_tokens):
    """Reference logits: root, then each level, recomputing all rows with the tree's ancestor mask."""
    n = len(tokens) - 1
    parents = [p for level in TREE for p in level]
    levels = [lvl for lvl, level in enumerate(TREE, start=1) for _ in level]
    rows_tok, rows_pos = list(tokens[1:]), list(range(n))
    y, logits = run(rows_tok, feats[:n], rows_pos, np.tril(np.ones((n, n), dtype=bool)))
    root_y, out = y[-1], [logits[-1].numpy()]
    node_y = {}
    for lvl in range(1, len(TREE) + 1):
        ids = [i for i, l in enumerate(levels) if l <= lvl]
        m = n + len(ids)
        mask = np.zeros((m, m), dtype=bool)
        mask[:n, :n] = np.tril(np.ones((n, n), dtype=bool))
        node_feats = []
        for r, i in enumerate(ids):
            mask[n + r, :n] = True
            j = i
            while j >= 0:
                mask[n + r, n + ids.index(j)] = True
                j = parents[j]
            node_feats.append((root_y if parents[i] < 0 else node_y[parents[i]]).numpy())
        y, logits = run(rows_tok + [tree_tokens[i] for i in ids], np.concatenate([feats[:n], np.stack(node_feats)]),
                        rows_pos + [n - 1 + levels[i] for i in ids], mask)
        for r, i in enumerate(ids):
            node_y[i] = y[n + r]
        out.append(logits[n:][[r for r, i in enumerate(ids) if levels[i] == lvl]].numpy())
    return out


def engine_tree(engine, tokens, feats, tree_tokens, split: int):
    """The generator's call pattern: catch up in two rounds (an empty tree committed in between), then expand."""
    engine.catch_up(tokens[:split + 1], feats[:split], 0)
    engine.expand(np.array([100]), np.array([7]), np.array([-1]), 1)
    engine.commit(np.array([100]))
    out = [engine.catch_up(tokens, feats[split:len(tokens) - 1], split).logits]
    cid = 0
    for lvl, level in enumerate(TREE, start=1):
        ids = np.arange(cid, cid + len(level))
        out.append(engine.expand(ids, np.asarray(tree_tokens)[ids], np.asarray(level), lvl).logits)
        cid += len(level)
    return out


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("own_embedding", [True, False])
def test_engine_matches_torch_reference_with_tree(tmp_path, variant, own_embedding):
    cfg, tensors, head = make_head(tmp_path, variant, with_embedding=own_embedding)
    emb, lm = target_side()
    run = torch_head(cfg, tensors, emb, lm)
    rng = np.random.default_rng(2)
    tokens = rng.integers(0, VOCAB, 14)
    feats = rng.standard_normal((14, HIDDEN)).astype(np.float32)
    tree_tokens = rng.integers(0, VOCAB, sum(len(level) for level in TREE))
    want = reference_tree(run, tokens, feats, tree_tokens)
    got = engine_tree(Eagle1NumpyEngine(head, emb, lm), tokens, feats, tree_tokens, split=6)
    assert len(got) == len(TREE) + 1
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5)
    assert np.abs(want[-1]).max() > 0.5  # logits are not trivially small


def test_rollback_and_incremental_catch_up_equal_one_pass(tmp_path):
    _, _, head = make_head(tmp_path, "llama3")
    emb, lm = target_side()
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, VOCAB, 30)
    feats = rng.standard_normal((30, HIDDEN)).astype(np.float32)
    one = Eagle1NumpyEngine(head, emb, lm).catch_up(tokens, feats[:29], 0).logits
    eng = Eagle1NumpyEngine(head, emb, lm)
    eng.catch_up(tokens[:20], feats[:19], 0)
    eng.rollback(12)  # a later prompt that shares 12 tokens: features before 12 are kept
    other = tokens.copy()
    other[12:] = (other[12:] + 1) % VOCAB
    eng.catch_up(other[:25], feats[12:24], 12)
    eng.rollback(12)
    inc = eng.catch_up(tokens, feats[12:29], 12).logits
    np.testing.assert_allclose(inc, one, rtol=0, atol=1e-5)
    assert eng.n_pairs == 29
    eng.reset()
    np.testing.assert_allclose(eng.catch_up(tokens, feats[:29], 0).logits, one, rtol=0, atol=1e-5)


def test_candidate_vocabulary_and_bad_calls(tmp_path):
    _, _, head = make_head(tmp_path, "vicuna")
    emb, lm = target_side()
    tokens = np.arange(10)
    feats = np.ones((9, HIDDEN), dtype=np.float32)
    full = Eagle1NumpyEngine(head, emb, lm).catch_up(tokens, feats, 0).logits
    cand = np.array([3, 50, 299])
    part = Eagle1NumpyEngine(head, emb, lm, candidate_ids=cand).catch_up(tokens, feats, 0).logits
    np.testing.assert_allclose(part[cand], full[cand], rtol=1e-6)
    assert np.isneginf(np.delete(part, cand)).all()
    eng = Eagle1NumpyEngine(head, emb, lm)
    with pytest.raises(TreeError, match="embeddings=True"):
        eng.catch_up(tokens, None, 0)
    with pytest.raises(TreeError, match="positions in between are missing"):
        eng.catch_up(tokens, feats[5:], 5)
    with pytest.raises(TreeError, match="needs 9"):
        eng.catch_up(tokens, feats[:4], 0)
    with pytest.raises(TreeError, match="expand before catch_up"):
        eng.expand(np.array([0]), np.array([1]), np.array([-1]), 1)
