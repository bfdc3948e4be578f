"""An independent numpy (float64) computation of what an EAGLE-3 head means, for checking the llama.cpp engine.

Written from the head's definition (SafeAILab EAGLE-3 / llama.cpp's eagle3 graph), on the *checkpoint* tensors
(HF names, rotate-half RoPE, d2t offsets): it shares no code with convert/ or the engine, so it also checks the
converter's renaming, q/k permutation and d2t handling.
"""

from __future__ import annotations

import numpy as np


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def llama3_inv_freq(inv: np.ndarray, s: dict) -> np.ndarray:
    """Llama 3.1's rope_scaling applied to the rotation frequencies (transformers' definition)."""
    ctx, low, high, factor = (s["original_max_position_embeddings"], s["low_freq_factor"], s["high_freq_factor"],
                              s["factor"])
    wavelen = 2 * np.pi / inv
    out = np.where(wavelen > ctx / low, inv / factor, inv)
    smooth = (ctx / wavelen - low) / (high - low)
    medium = (wavelen >= ctx / high) & (wavelen <= ctx / low)
    return np.where(medium, (1 - smooth) * out / factor + smooth * out, out)


def rope(x: np.ndarray, pos: int, theta: float, scaling: dict | None = None) -> np.ndarray:
    """HF rotate-half RoPE on (heads, head_dim), with llama3 rope_scaling when given."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, d, 2) / d)
    if scaling is not None:
        inv = llama3_inv_freq(inv, scaling)
    ang = pos * inv
    cos, sin = np.concatenate([np.cos(ang)] * 2), np.concatenate([np.sin(ang)] * 2)
    rot = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], axis=-1)
    return x * cos + rot * sin


class Eagle3Reference:
    """Entries are appended one at a time; each names the earlier entries it may attend to."""

    def __init__(self, tensors: dict, config: dict, token_embd: np.ndarray) -> None:
        self.t = {k: np.asarray(v, dtype=np.float64) for k, v in tensors.items() if k not in ("d2t", "t2d")}
        self.cfg = config
        self.emb = np.asarray(token_embd, dtype=np.float64)
        self.eps = config["rms_norm_eps"]
        self.nh, self.nkv, self.hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
        d2t = np.asarray(tensors["d2t"], dtype=np.int64)
        self.draft_to_target = d2t + np.arange(len(d2t))
        self.keys: list[np.ndarray] = []
        self.values: list[np.ndarray] = []

    def encode(self, features: np.ndarray) -> np.ndarray:
        x = np.asarray(features, dtype=np.float64)
        if self.cfg.get("norm_before_fc"):
            x = rms_norm(x, self.t["input_norm.weight"], self.eps)
        return x @ self.t["fc.weight"].T

    def entry(self, token: int, g: np.ndarray, pos: int, visible: list[int]) -> tuple[np.ndarray, np.ndarray, int]:
        """Add entry (token, g) at ``pos`` attending to entries ``visible`` and itself.

        Returns (logits over the target vocabulary, -inf outside the draft vocabulary; pre-norm output; index)."""
        L = "midlayer."
        t = self.t
        a = np.concatenate([rms_norm(self.emb[token], t[L + "input_layernorm.weight"], self.eps),
                            rms_norm(g, t[L + "hidden_norm.weight"], self.eps)])
        q = (t[L + "self_attn.q_proj.weight"] @ a).reshape(self.nh, self.hd)
        k = (t[L + "self_attn.k_proj.weight"] @ a).reshape(self.nkv, self.hd)
        v = (t[L + "self_attn.v_proj.weight"] @ a).reshape(self.nkv, self.hd)
        theta, scaling = self.cfg["rope_theta"], self.cfg.get("rope_scaling")
        q, k = rope(q, pos, theta, scaling), rope(k, pos, theta, scaling)
        self.keys.append(k)
        self.values.append(v)
        idx = len(self.keys) - 1
        ks = np.stack([self.keys[i] for i in visible + [idx]])  # (n, nkv, hd)
        vs = np.stack([self.values[i] for i in visible + [idx]])
        group = self.nh // self.nkv
        heads = []
        for h in range(self.nh):
            scores = ks[:, h // group] @ q[h] / np.sqrt(self.hd)
            w = np.exp(scores - scores.max())
            heads.append((w / w.sum()) @ vs[:, h // group])
        attn = t[L + "self_attn.o_proj.weight"] @ np.concatenate(heads)
        h_ = attn + g
        n = rms_norm(h_, t[L + "post_attention_layernorm.weight"], self.eps)
        gate, up = t[L + "mlp.gate_proj.weight"] @ n, t[L + "mlp.up_proj.weight"] @ n
        out = h_ + t[L + "mlp.down_proj.weight"] @ (gate / (1 + np.exp(-gate)) * up)
        draft_logits = t["lm_head.weight"] @ rms_norm(out, t["norm.weight"], self.eps)
        logits = np.full(self.emb.shape[0], -np.inf)
        logits[self.draft_to_target] = draft_logits
        return logits, out, idx
