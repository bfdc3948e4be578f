"""The EAGLE-3 draft head as a torch module, computing exactly what llama.cpp's ``eagle3`` graph computes.

llama.cpp (``src/models/eagle3.cpp``) runs: encoder ``g = fc(rmsnorm(x)·input_norm)`` over the concatenated
residual inputs ``x`` of three target layers; decoder, for a (token, g) pair at position P:
``a = concat(rmsnorm(emb(token))·attn_norm, rmsnorm(g)·attn_norm_2)``, attention with q/k/v of ``a`` (RoPE at P,
causal over the head's own KV cache), ``h = attn + g`` (raw g), ``out = h + MLP(rmsnorm(h)·ffn_norm)``;
``out`` is the next step's ``g``; logits ``lm_head(rmsnorm(out)·norm)`` over the draft vocabulary, mapped to
target ids by ``d2t``. Parameter names follow the HF EAGLE-3 checkpoint layout, so ``state_dict()`` is the
export format. The target's token embedding is borrowed, frozen (the runtime reads the target's own).

:meth:`Eagle3Head.unroll` is the training-time test (TTT): step j feeds the head its own step j-1 output and
attends to real-feature entries at rows <= P plus its own chain, exactly like a tree node at depth j at run time.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class HeadConfig:
    """Shapes of a head. ``target_hidden_size``·3 is the width of the target features."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    target_hidden_size: int
    vocab_size: int
    draft_vocab_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    norm_before_fc: bool = True

    def as_dict(self) -> dict:
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.q_proj = nn.Linear(2 * c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)


class MLP(nn.Module):
    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    """The one decoder layer (names as in HF EAGLE-3 checkpoints: ``midlayer.*``)."""

    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """HF ``rotate_half`` RoPE of x (B, heads, T, D) at positions ``pos`` (T,)."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d))
    ang = pos.to(torch.float32)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def draft_to_target(d2t: torch.Tensor) -> torch.Tensor:
    """Target token id of each draft-vocabulary entry: entry i stands for target id ``i + d2t[i]``."""
    return torch.arange(len(d2t), device=d2t.device) + d2t


class Eagle3Head(nn.Module):
    """fc + one decoder layer + reduced-vocabulary LM head, over a frozen borrowed token embedding."""

    def __init__(self, c: HeadConfig, embedding: torch.Tensor, d2t: torch.Tensor) -> None:
        super().__init__()
        if embedding.shape != (c.vocab_size, c.hidden_size):
            raise ValueError(f"embedding is {tuple(embedding.shape)}, expected ({c.vocab_size}, {c.hidden_size})")
        if d2t.shape != (c.draft_vocab_size,):
            raise ValueError(f"d2t has {d2t.shape[0]} entries, expected {c.draft_vocab_size}")
        self.config = c
        if c.norm_before_fc:
            self.input_norm = RMSNorm(3 * c.target_hidden_size, c.rms_norm_eps)
        self.fc = nn.Linear(3 * c.target_hidden_size, c.hidden_size, bias=False)
        self.midlayer = MidLayer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.register_buffer("embed", embedding.float(), persistent=False)
        self.register_buffer("d2t", d2t.long())  # offsets: target id = i + d2t[i]
        self.register_buffer("t2d", torch.zeros(c.vocab_size, dtype=torch.bool))
        self.register_buffer("target_to_draft", torch.full((c.vocab_size,), -1, dtype=torch.long), persistent=False)
        self._index_vocabulary()

    @property
    def draft_ids(self) -> torch.Tensor:
        """Target token id of each draft-vocabulary entry."""
        return draft_to_target(self.d2t)

    def _index_vocabulary(self) -> None:
        """Derive ``t2d`` and the label index ``target_to_draft`` from ``d2t``, the one source of truth."""
        ids = self.draft_ids
        with torch.no_grad():
            self.t2d.zero_()
            self.t2d[ids] = True
            self.target_to_draft.fill_(-1)
            self.target_to_draft[ids] = torch.arange(len(ids), device=ids.device)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Load, then re-derive the vocabulary index: a state with another ``d2t`` (a resumed checkpoint) must
        not leave labels mapped through the vocabulary the head was built with."""
        result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        self._index_vocabulary()
        return result

    def encode(self, feats: torch.Tensor) -> torch.Tensor:
        """g from the target features (B, T, 3·Ht)."""
        x = self.input_norm(feats) if self.config.norm_before_fc else feats
        return self.fc(x)

    def _qkv(self, tokens: torch.Tensor, g: torch.Tensor, pos: torch.Tensor):
        c, m = self.config, self.midlayer
        a = torch.cat([m.input_layernorm(self.embed[tokens]), m.hidden_norm(g)], dim=-1)
        B, T, _ = a.shape
        q = m.self_attn.q_proj(a).view(B, T, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = m.self_attn.k_proj(a).view(B, T, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = m.self_attn.v_proj(a).view(B, T, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        rep = c.num_attention_heads // c.num_key_value_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        return rope(q, pos, c.rope_theta), rope(k, pos, c.rope_theta), v

    def _finish(self, attn: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(prenorm output, draft logits) from the attention output (B, heads, T, D) and the residual g."""
        m = self.midlayer
        B, H, T, D = attn.shape
        h = m.self_attn.o_proj(attn.transpose(1, 2).reshape(B, T, H * D)) + g
        out = h + m.mlp(m.post_attention_layernorm(h))
        return out, self.lm_head(self.norm(out))

    def unroll(self, feats: torch.Tensor, tokens: torch.Tensor, n_steps: int) -> list[torch.Tensor]:
        """Draft logits (B, T, Vd) of steps 0..n_steps-1; step j at row P predicts token P+2+j.

        Step j at row P is fed token P+1+j and its own step j-1 output (step 0: g from the real features),
        at RoPE position P+j, and attends to step-0 entries at rows <= P plus its own chain's steps 1..j.
        Rows whose inputs run past the sequence get token 0: the caller masks their losses."""
        B, T = tokens.shape
        g = self.encode(feats)
        scale = 1.0 / math.sqrt(self.config.head_dim)
        causal = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril()
        rows = torch.arange(T, device=tokens.device)
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        logits = []
        for j in range(n_steps):
            tok = torch.zeros_like(tokens)
            tok[:, : max(T - 1 - j, 0)] = tokens[:, 1 + j:]
            q, k, v = self._qkv(tok, g, rows + j)
            keys.append(k)
            values.append(v)
            s0 = (q @ keys[0].transpose(-1, -2)) * scale
            s0 = s0.masked_fill(~causal, float("-inf"))
            diag = [(q * kk).sum(-1, keepdim=True) * scale for kk in keys[1:]]
            p = torch.softmax(torch.cat([s0] + diag, dim=-1), dim=-1)
            attn = p[..., :T] @ values[0]
            for i, vv in enumerate(values[1:]):
                attn = attn + p[..., T + i: T + i + 1] * vv
            g, step_logits = self._finish(attn, g)
            logits.append(step_logits)
        return logits
