"""Write a tiny llama-architecture GGUF with deterministic random weights and a real SentencePiece-style vocab.

Small enough (a few hundred KB) to be written per test session in milliseconds, real enough that llama.cpp loads,
tokenizes and decodes it exactly as it would any llama model.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

# the vocabulary and templates live beside the multi-architecture writer (benchmarks/ cannot import tests/)
from benchmarks.synthetic_model import CHATML, CHATML_WITH_BOS, WORDS, add_tokenizer, vocab

__all__ = ["CHATML", "CHATML_WITH_BOS", "WORDS", "vocab", "write_model"]


def write_model(path: str | Path, *, seed: int = 0, n_layer: int = 2, n_embd: int = 64, n_head: int = 4,
                n_head_kv: int = 2, n_ff: int = 128, n_ctx: int = 2048, arch: str = "llama",
                logit_scale: float = 0.6, qtype: str = "f32", rename: dict[int, str] | None = None,
                block_scale: float = 1.0, chat_template: str = CHATML) -> Path:
    """Write the model and return its path. ``seed`` changes the weights, never the vocabulary.

    ``block_scale`` < 1 shrinks the blocks' weights: the next token then depends mostly on the current one
    (a predictable, bigram-like target, as real text is more predictable than a random model's)."""
    path = Path(path)
    tokens, scores, types = vocab(rename)
    n_vocab = len(tokens)
    rng = np.random.default_rng(seed)
    head_dim = n_embd // n_head
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"eagle2-local synthetic test model (seed {seed})")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype == "f32" else gguf.LlamaFileType.MOSTLY_Q8_0)
    add_tokenizer(w, tokens, scores, types, chat_template)

    def t(name: str, shape: tuple[int, ...], std: float) -> None:
        data = (rng.standard_normal(shape) * std).astype(np.float32)
        if qtype == "q8_0" and len(shape) == 2 and shape[-1] % 32 == 0 and name != "token_embd.weight":
            qdata = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, qdata, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, data)

    def ones(name: str, n: int) -> None:
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    t("token_embd.weight", (n_vocab, n_embd), 1.0)
    for i in range(n_layer):
        ones(f"blk.{i}.attn_norm.weight", n_embd)
        t(f"blk.{i}.attn_q.weight", (n_embd, n_embd), n_embd ** -0.5)
        t(f"blk.{i}.attn_k.weight", (n_head_kv * head_dim, n_embd), n_embd ** -0.5)
        t(f"blk.{i}.attn_v.weight", (n_head_kv * head_dim, n_embd), n_embd ** -0.5)
        t(f"blk.{i}.attn_output.weight", (n_embd, n_embd), block_scale * n_embd ** -0.5)
        ones(f"blk.{i}.ffn_norm.weight", n_embd)
        t(f"blk.{i}.ffn_gate.weight", (n_ff, n_embd), n_embd ** -0.5)
        t(f"blk.{i}.ffn_up.weight", (n_ff, n_embd), n_embd ** -0.5)
        t(f"blk.{i}.ffn_down.weight", (n_embd, n_ff), block_scale * n_ff ** -0.5)
    ones("output_norm.weight", n_embd)
    t("output.weight", (n_vocab, n_embd), logit_scale)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
