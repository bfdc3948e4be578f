"""Random-weight GGUF models of several llama.cpp architectures, with a real SentencePiece-style vocabulary.

    python benchmarks/synthetic_model.py ARCH OUT.gguf [--mtp] [--shape tiny|qwen3.5-0.8b] [--seed N]
                                         [--block-scale X] [--logit-scale X] [--qtype f32|f16|q8_0]

ARCH is one of:

* ``llama``: plain attention (the control; its weights are those of tests/support/synthetic_model.py's
  ``write_model`` for the same seed).
* ``qwen35``: Qwen3.5, a hybrid of gated delta-net (linear attention, recurrent) layers and gated full-attention
  layers. ``--mtp`` appends its multi-token-prediction (NextN) block: one more full-attention block stored after
  the trunk (``block_count`` counts it, ``qwen35.nextn_predict_layers`` = 1), which llama.cpp loads only with the
  model parameter ``load_mtp`` and runs only in an MTP context (``llama_model_n_layer_nextn`` reports it). Its
  weights come last in the random stream: the trunk and LM head are the same with or without ``--mtp``.
* ``mamba2``: Mamba-2, every layer recurrent (an SSM), no attention at all.
* ``lfm2``: LFM2, a hybrid of gated short-convolution (recurrent) layers and attention layers.
* ``gemma4``: Gemma 4, sliding-window attention layers with full-attention layers between them (no recurrent
  layer; its KV cache is the interleaved SWA one).
* ``gemma4-assistant``: a Gemma 4 drafter ("assistant") for the tiny ``gemma4`` above, not a model of its own
  (``DRAFT_ARCHS``: llama.cpp runs it only in a context whose ``ctx_other`` is the target's). It reads the target's
  token embeddings and post-norm hidden state (``embedding_length_out`` = the target's n_embd), attends with queries
  alone over the K/V of the target's last sliding-window and last full layer (so its head count of K/V, head sizes,
  RoPE and window are the target's), and ties its LM head to its own ``token_embd``. Two layers, one of each kind.

Shapes: ``tiny`` (the default: n_embd 64, 2-4 layers, hybrids with both kinds of layer, a few hundred KB, written
in milliseconds; float32 weights) and, for ``qwen35`` only, ``qwen3.5-0.8b``: the real Qwen3.5-0.8B text model's
dimensions (see ``QWEN35_0_8B``) with random Q8_0 weights, the LM head tied to the token embedding as in the real
model, and the vocabulary filled up to its 248,320 tokens, for measuring what a forward pass costs (0.81 GB, 0.83 GB
with ``--mtp``; about 25 s to write).

Every model has the vocabulary of ``vocab()`` (the SentencePiece 'llama' tokenizer with byte fallback, ChatML
control tokens) and the ChatML chat template, so llama.cpp tokenizes, templates and decodes it as any model.
Weights are deterministic from ``--seed`` (the vocabulary never changes with it). The next-token distribution is
kept peaked (``logit_scale``) so greedy decoding has few exact ties, and the recurrent layers' parameters are drawn
as their reference implementations initialize them (A = -exp(A_log) with A in [1, 16], a softplus time step of
0.001-0.1 through the dt bias, unit norms, conv kernels of unit output variance), so the state stays finite over
long generations.

Importable: ``write_arch_model(path, arch, ...)`` (tests call it), ``vocab()``, ``WORDS``, ``CHATML``,
``CHATML_WITH_BOS``, ``EXPECTED_KIND`` (what llama.cpp should say of each architecture: recurrent, hybrid), and
``DRAFT_ARCHS`` (the drafters, which ``ARCHS`` leaves out: they decode only beside their target).

Tensor and key names come from the installed ``gguf`` package (0.19.0 when written): every tensor is checked against
its ``MODEL_TENSORS`` table for the architecture, except Qwen3.5's NextN tensors, which that release does not list
for qwen35 yet (llama.cpp's llama-arch.cpp names them as gguf does for the other NextN models), and
gemma4-assistant's, which that release does not know: its tensors are checked against gemma4's list, and its two
projections are named as llama-arch.cpp names them (``nextn.pre_projection``, ``nextn.post_projection``).
"""

from __future__ import annotations

import argparse
import math
import string
import time
from pathlib import Path

import gguf
import numpy as np

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Llama-3 / Gemma style: the template itself writes BOS, so the tokenizer must not add another one.
CHATML_WITH_BOS = "{{ bos_token }}" + CHATML

WORDS = ["the", "a", "and", "to", "of", "in", "is", "it", "you", "that", "for", "on", "with", "as", "was", "he",
         "be", "at", "by", "this", "have", "from", "or", "one", "had", "not", "but", "what", "all", "were", "when",
         "we", "there", "can", "an", "your", "which", "their", "said", "if", "do", "will", "each", "about", "how",
         "up", "out", "them", "then", "she", "many", "some", "so", "these", "would", "other", "into", "has", "more",
         "her", "two", "like", "him", "see", "time", "could", "no", "make", "than", "first", "been", "its", "who",
         "now", "people", "my", "made", "over", "did", "down", "only", "way", "find", "use", "may", "water", "long",
         "little", "very", "after", "words", "called", "just", "where", "most", "know", "code", "def", "return"]


def vocab(rename: dict[int, str] | None = None) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types of a SentencePiece ('llama') vocabulary with byte fallback.

    ``rename`` replaces the text of some token ids (to build an incompatible vocabulary in tests)."""
    T = gguf.TokenType
    tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    types = [T.UNKNOWN, T.CONTROL, T.CONTROL, T.CONTROL, T.CONTROL]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(T.BYTE)
    pieces = ["\u2581"] + list(string.ascii_letters + string.digits + string.punctuation)
    pieces += ["\u2581" + c for c in string.ascii_letters]
    pieces += ["\u2581" + w for w in WORDS] + WORDS
    seen = set(tokens)
    for p in pieces:
        if p not in seen:
            seen.add(p)
            tokens.append(p)
            types.append(T.NORMAL)
    # SentencePiece BPE merges by score: longer pieces win
    for tok_id, text in (rename or {}).items():
        tokens[tok_id] = text
    scores = [0.0 if t != T.NORMAL else float(len(tok)) - i * 1e-4 for i, (tok, t) in enumerate(zip(tokens, types))]
    return tokens, scores, [int(t) for t in types]


ARCHS = ("llama", "qwen35", "mamba2", "lfm2", "gemma4")
# Drafters paired with a target of ARCHS: llama.cpp cannot decode them alone
DRAFT_ARCHS = ("gemma4-assistant",)
# The gguf tensor list a drafter's names are checked against, where the installed gguf does not know its
# architecture (gguf 0.19.0 has no gemma4-assistant; llama.cpp's llama-arch.cpp names its tensors as gemma4's)
_TENSOR_ARCH = {"gemma4-assistant": "gemma4"}
SHAPES = ("tiny", "qwen3.5-0.8b")

# (llama_model_is_recurrent, llama_model_is_hybrid) as llama.cpp reports them for each architecture
EXPECTED_KIND = {"llama": (False, False), "qwen35": (False, True), "mamba2": (True, False), "lfm2": (False, True),
                 "gemma4": (False, False)}

# Qwen3.5-0.8B's text model, from the text_config of Qwen/Qwen3.5-0.8B's config.json: hidden_size 1024,
# num_hidden_layers 24 (full_attention_interval 4: 6 x [3 linear_attention, 1 full_attention]), intermediate_size
# 3584, num_attention_heads 8, num_key_value_heads 2, head_dim 256, partial_rotary_factor 0.25 (RoPE over 64 dims),
# mrope_section [11, 11, 10], rope_theta 1e7, linear_num_key_heads 16, linear_num_value_heads 16,
# linear_key_head_dim = linear_value_head_dim = 128, linear_conv_kernel_dim 4, rms_norm_eps 1e-6, vocab_size 248,320,
# tie_word_embeddings true, mtp_num_hidden_layers 1 (no dedicated MTP embeddings), max_position_embeddings 262,144.
# The keys are the ones llama.cpp's converter writes for it (conversion/qwen.py), and its qwen35 loader types a
# 24-layer, n_embd 1024 model as 0.8B.
QWEN35_0_8B = dict(n_embd=1024, n_layer=24, n_ff=3584, n_head=8, n_head_kv=2, head_dim=256, rope_dims=64,
                   rope_sections=[11, 11, 10, 0], rope_theta=10_000_000.0, full_attention_interval=4,
                   ssm_d_conv=4, ssm_d_state=128, ssm_n_group=16, ssm_n_v_heads=16, n_vocab=248_320,
                   n_ctx=262_144, tied=True, rms_eps=1e-6)

_TINY = {
    "llama": dict(n_embd=64, n_layer=2, n_ff=128, n_head=4, n_head_kv=2, n_ctx=2048, rope_theta=10000.0,
                  rms_eps=1e-5),
    # layers R A R A (full_attention_interval 2); 4 V heads over 2 QK heads exercises the head repeat; the conv
    # runs over 2*64 + 128 = 256 channels (CUDA's ssm_conv wants a multiple of 128), head dims 32
    "qwen35": dict(n_embd=64, n_layer=4, n_ff=128, n_head=4, n_head_kv=2, head_dim=32, rope_dims=8,
                   rope_sections=[2, 1, 1, 0], rope_theta=10_000_000.0, full_attention_interval=2, ssm_d_conv=4,
                   ssm_d_state=32, ssm_n_group=2, ssm_n_v_heads=4, n_ctx=2048, tied=False, rms_eps=1e-6),
    # d_state 128 and head dim 32 (= d_inner 128 / 4 heads) fit CUDA's Mamba-2 scan; 384 conv channels
    "mamba2": dict(n_embd=64, n_layer=2, ssm_d_inner=128, ssm_d_state=128, ssm_n_group=1, ssm_n_heads=4,
                   ssm_d_conv=4, n_ctx=2048, rms_eps=1e-5),
    # layers C A C A: head_count_kv 0 marks a short-conv layer
    "lfm2": dict(n_embd=64, n_layer=4, n_ff=128, n_head=4, n_head_kv=2, attn_layers=[1, 3], l_cache=3,
                 n_ctx=2048, rope_theta=1_000_000.0, rms_eps=1e-5),
    # layers S F S F (S: sliding window of 32, head dim 16; F: full attention, head dim 32, proportional RoPE)
    "gemma4": dict(n_embd=64, n_layer=4, n_ff=128, n_head=4, n_head_kv=2, head_dim=32, head_dim_swa=16,
                   swa_pattern=[True, False, True, False], sliding_window=32, n_ctx=2048, rope_theta=1_000_000.0,
                   rope_theta_swa=10_000.0, partial_rotary_full=0.25, softcap=30.0, rms_eps=1e-6),
    # pairs with "gemma4": its vocabulary, n_embd_backbone = gemma4's n_embd, K/V heads, head sizes, RoPE and window
    # of gemma4's last S and F layers; layers S F. n_embd != n_embd_backbone (llama.cpp insists), and wide enough to
    # carry a backbone row (tests build an assistant that agrees with its target)
    "gemma4-assistant": dict(n_embd=128, n_layer=2, n_ff=128, n_head=4, n_head_kv=2, head_dim=32, head_dim_swa=16,
                             swa_pattern=[True, False], sliding_window=32, n_ctx=2048, rope_theta=1_000_000.0,
                             rope_theta_swa=10_000.0, partial_rotary_full=0.25, rms_eps=1e-6, n_embd_backbone=64),
}


class _Writer:
    """One GGUF being written: its writer, its random generator and how its 2-D weights are stored."""

    def __init__(self, path: Path, arch: str, *, seed: int, qtype: str, big: bool) -> None:
        self.arch = arch
        listed_as = _TENSOR_ARCH.get(arch, arch)
        arch_id = next((a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == listed_as), None)
        if arch_id is None:
            raise ValueError(f"the installed gguf {getattr(gguf, '__version__', '')} has no architecture {arch!r}")
        self.known = set(gguf.MODEL_TENSORS[arch_id])
        self.rng = np.random.default_rng(seed)
        self.qtype = qtype
        self.big = big  # draw float32 normals (fast) instead of float64 ones (write_model's stream)
        self.w = gguf.GGUFWriter(str(path), arch)

    def name(self, tensor: str, bid: int | None = None, suffix: str = ".weight", *, listed: bool = True) -> str:
        """The GGUF name of ``gguf.MODEL_TENSOR.<tensor>`` of block ``bid``, checked against the architecture's
        tensor list unless ``listed`` is False (a tensor llama.cpp reads that gguf does not list for it yet)."""
        t = gguf.MODEL_TENSOR[tensor]
        if listed and t not in self.known:
            raise ValueError(f"gguf lists no {tensor} tensor for {self.arch}")
        return gguf.TENSOR_NAMES[t].format(bid=bid) + suffix

    def normal(self, shape: tuple[int, ...], std: float) -> np.ndarray:
        if self.big:
            return self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
        return (self.rng.standard_normal(shape) * std).astype(np.float32)

    def add(self, name: str, data: np.ndarray, *, quantize: bool = False) -> None:
        """Store ``data`` (numpy shape (rows, cols) is ggml's {cols, rows}); a matmul weight (``quantize``) in the
        chosen type, anything else (norms, biases, A, D, conv kernels: elementwise operands) in float32."""
        data = np.ascontiguousarray(data, dtype=np.float32)
        if quantize and data.ndim == 2 and self.qtype == "q8_0" and data.shape[-1] % 32 == 0:
            q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            self.w.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        elif quantize and data.ndim == 2 and self.qtype == "f16":
            self.w.add_tensor(name, data.astype(np.float16))
        else:
            self.w.add_tensor(name, data)

    def mat(self, name: str, shape: tuple[int, ...], std: float, *, quantize: bool = True) -> None:
        self.add(name, self.normal(shape, std), quantize=quantize)

    def ones(self, name: str, n: int | tuple[int, ...]) -> None:
        """A norm's (or Mamba's D's) weight: 1 + 0.1 N(0, 1)."""
        if self.big:
            self.add(name, 1.0 + self.normal(n if isinstance(n, tuple) else (n,), 0.1))
        else:
            self.add(name, (1.0 + 0.1 * self.rng.standard_normal(n)).astype(np.float32))

    def finish(self) -> None:
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_tensors_to_file()
        self.w.close()


def _header(wr: _Writer, p: dict, *, n_layer_all: int, seed: int, tokens: list[str], scores: list[float],
            types: list[int], chat_template: str) -> None:
    w = wr.w
    w.add_name(f"eagle2-local synthetic {wr.arch} model (seed {seed})")
    w.add_context_length(p["n_ctx"])
    w.add_embedding_length(p["n_embd"])
    w.add_block_count(n_layer_all)
    w.add_layer_norm_rms_eps(p["rms_eps"])
    w.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                     "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[wr.qtype])
    add_tokenizer(w, tokens, scores, types, chat_template)


def add_tokenizer(w: gguf.GGUFWriter, tokens: list[str], scores: list[float], types: list[int],
                  chat_template: str) -> None:
    """The vocabulary of ``vocab()`` as a SentencePiece ('llama') tokenizer, its special tokens and chat template:
    every synthetic model's (tests/support/synthetic_model.py's write_model too)."""
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(chat_template)


def _ffn(wr: _Writer, i: int, n_embd: int, n_ff: int, block_scale: float) -> None:
    wr.mat(wr.name("FFN_GATE", i), (n_ff, n_embd), n_embd ** -0.5)
    wr.mat(wr.name("FFN_UP", i), (n_ff, n_embd), n_embd ** -0.5)
    wr.mat(wr.name("FFN_DOWN", i), (n_embd, n_ff), block_scale * n_ff ** -0.5)


def _head(wr: _Writer, p: dict, n_vocab: int, logit_scale: float, *, output_norm: str = "OUTPUT_NORM") -> None:
    """Final norm and (untied) LM head; the head's std is ``logit_scale`` at n_embd 64 and shrinks as
    1/sqrt(n_embd) with width, so the logits spread alike at every shape."""
    wr.ones(wr.name(output_norm), p["n_embd"])
    if not p.get("tied"):
        wr.mat(wr.name("OUTPUT"), (n_vocab, p["n_embd"]), logit_scale * (64 / p["n_embd"]) ** 0.5)


def _llama(wr: _Writer, p: dict, n_vocab: int, *, block_scale: float, logit_scale: float) -> None:
    """The layout and random stream of tests/support/synthetic_model.py's write_model."""
    w, n_embd, n_head, n_head_kv, n_ff = wr.w, p["n_embd"], p["n_head"], p["n_head_kv"], p["n_ff"]
    head_dim = n_embd // n_head
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(p["rope_theta"])
    wr.mat(wr.name("TOKEN_EMBD"), (n_vocab, n_embd), 1.0)
    for i in range(p["n_layer"]):
        wr.ones(wr.name("ATTN_NORM", i), n_embd)
        wr.mat(wr.name("ATTN_Q", i), (n_embd, n_embd), n_embd ** -0.5)
        wr.mat(wr.name("ATTN_K", i), (n_head_kv * head_dim, n_embd), n_embd ** -0.5)
        wr.mat(wr.name("ATTN_V", i), (n_head_kv * head_dim, n_embd), n_embd ** -0.5)
        wr.mat(wr.name("ATTN_OUT", i), (n_embd, n_embd), block_scale * n_embd ** -0.5)
        wr.ones(wr.name("FFN_NORM", i), n_embd)
        _ffn(wr, i, n_embd, n_ff, block_scale)
    _head(wr, p, n_vocab, logit_scale)


def _dt_bias(wr: _Writer, n: int) -> np.ndarray:
    """softplus^-1 of a time step drawn log-uniformly in [0.001, 0.1] (Mamba's and the delta net's init)."""
    dt = np.exp(wr.rng.uniform(math.log(1e-3), math.log(1e-1), n))
    return (dt + np.log(-np.expm1(-dt))).astype(np.float32)


def _a(wr: _Writer, n: int) -> np.ndarray:
    """A = -exp(A_log) with exp(A_log) uniform in [1, 16], as the converters store it."""
    return (-wr.rng.uniform(1.0, 16.0, n)).astype(np.float32)


def _qwen35_attention(wr: _Writer, p: dict, i: int, block_scale: float) -> None:
    n_embd, hd = p["n_embd"], p["head_dim"]
    wr.ones(wr.name("ATTN_NORM", i), n_embd)
    # the query projection also yields the output gate: 2 * n_head * head_dim rows
    wr.mat(wr.name("ATTN_Q", i), (2 * p["n_head"] * hd, n_embd), n_embd ** -0.5)
    wr.mat(wr.name("ATTN_K", i), (p["n_head_kv"] * hd, n_embd), n_embd ** -0.5)
    wr.mat(wr.name("ATTN_V", i), (p["n_head_kv"] * hd, n_embd), n_embd ** -0.5)
    wr.ones(wr.name("ATTN_Q_NORM", i), hd)
    wr.ones(wr.name("ATTN_K_NORM", i), hd)
    wr.mat(wr.name("ATTN_OUT", i), (n_embd, p["n_head"] * hd), block_scale * (p["n_head"] * hd) ** -0.5)
    wr.ones(wr.name("ATTN_POST_NORM", i), n_embd)
    _ffn(wr, i, n_embd, p["n_ff"], block_scale)


def _qwen35(wr: _Writer, p: dict, n_vocab: int, *, mtp: bool, block_scale: float, logit_scale: float) -> None:
    w, n_embd, n_layer = wr.w, p["n_embd"], p["n_layer"]
    d_state, n_group, n_v = p["ssm_d_state"], p["ssm_n_group"], p["ssm_n_v_heads"]
    key_dim, value_dim = d_state * n_group, d_state * n_v  # head_k_dim == head_v_dim == ssm.state_size
    conv_dim = 2 * key_dim + value_dim
    if mtp:
        w.add_nextn_predict_layers(1)
    w.add_feed_forward_length(p["n_ff"])
    w.add_head_count(p["n_head"])
    w.add_head_count_kv(p["n_head_kv"])
    w.add_key_length(p["head_dim"])
    w.add_value_length(p["head_dim"])
    w.add_rope_dimension_count(p["rope_dims"])
    w.add_rope_dimension_sections(p["rope_sections"])
    w.add_rope_freq_base(p["rope_theta"])
    w.add_ssm_conv_kernel(p["ssm_d_conv"])
    w.add_ssm_state_size(d_state)
    w.add_ssm_group_count(n_group)
    w.add_ssm_time_step_rank(n_v)
    w.add_ssm_inner_size(value_dim)
    interval = p["full_attention_interval"]
    # llama.cpp marks layer i (< n_layer) recurrent when (i + 1) % interval != 0, and the MTP block never (the
    # converter also writes the list as attention.recurrent_layers, a key gguf 0.19.0 does not know yet)
    w.add_full_attention_interval(interval)
    recurrent = [(i + 1) % interval != 0 for i in range(n_layer)]

    wr.mat(wr.name("TOKEN_EMBD"), (n_vocab, n_embd),
           logit_scale * (64 / n_embd) ** 0.5 if p["tied"] else 1.0)
    for i in range(n_layer):
        if not recurrent[i]:
            _qwen35_attention(wr, p, i, block_scale)
            continue
        wr.ones(wr.name("ATTN_NORM", i), n_embd)
        wr.mat(wr.name("ATTN_QKV", i), (conv_dim, n_embd), n_embd ** -0.5)  # q, k, v (conv inputs)
        wr.mat(wr.name("ATTN_GATE", i), (value_dim, n_embd), n_embd ** -0.5)  # z, the output gate
        wr.mat(wr.name("SSM_CONV1D", i), (conv_dim, p["ssm_d_conv"]), p["ssm_d_conv"] ** -0.5, quantize=False)
        wr.add(wr.name("SSM_DT", i, ".bias"), _dt_bias(wr, n_v))
        wr.add(wr.name("SSM_A", i, ""), _a(wr, n_v))
        wr.mat(wr.name("SSM_BETA", i), (n_v, n_embd), n_embd ** -0.5)
        # alpha adds to the dt bias: kept small so the decay stays near what the bias sets
        wr.mat(wr.name("SSM_ALPHA", i), (n_v, n_embd), 0.1 * n_embd ** -0.5)
        wr.ones(wr.name("SSM_NORM", i), d_state)
        wr.mat(wr.name("SSM_OUT", i), (n_embd, value_dim), block_scale * value_dim ** -0.5)
        wr.ones(wr.name("ATTN_POST_NORM", i), n_embd)
        _ffn(wr, i, n_embd, p["n_ff"], block_scale)
    _head(wr, p, n_vocab, logit_scale)
    if mtp:  # last in the random stream: with or without it, the trunk and head weights are the same
        # Qwen3.5's mtp.*: fc -> nextn.eh_proj over [enorm(embedding), hnorm(hidden)], one gated-attention block,
        # then mtp.norm -> nextn.shared_head_norm; no own embedding or LM head (the trunk's are shared)
        # (gguf 0.19.0 lists no NEXTN_* tensor for qwen35; llama-arch.cpp names them blk.%d.nextn.* as gguf does
        # for GLM-4.5's, so gguf's names are used unchecked)
        i = n_layer
        _qwen35_attention(wr, p, i, 1.0)
        wr.mat(wr.name("NEXTN_EH_PROJ", i, listed=False), (n_embd, 2 * n_embd), (2 * n_embd) ** -0.5)
        wr.ones(wr.name("NEXTN_ENORM", i, listed=False), n_embd)
        wr.ones(wr.name("NEXTN_HNORM", i, listed=False), n_embd)
        wr.ones(wr.name("NEXTN_SHARED_HEAD_NORM", i, listed=False), n_embd)


def _mamba2(wr: _Writer, p: dict, n_vocab: int, *, block_scale: float, logit_scale: float) -> None:
    w, n_embd = wr.w, p["n_embd"]
    d_inner, d_state, n_group, n_head, d_conv = (p["ssm_d_inner"], p["ssm_d_state"], p["ssm_n_group"],
                                                 p["ssm_n_heads"], p["ssm_d_conv"])
    conv_dim = d_inner + 2 * n_group * d_state
    w.add_feed_forward_length(0)  # as convert_hf_to_gguf writes them: unused
    w.add_head_count(0)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(n_head)
    w.add_ssm_group_count(n_group)
    wr.mat(wr.name("TOKEN_EMBD"), (n_vocab, n_embd), 1.0)
    for i in range(p["n_layer"]):
        wr.ones(wr.name("ATTN_NORM", i), n_embd)
        # in_proj: z (d_inner), xBC (conv_dim), dt (n_head)
        wr.mat(wr.name("SSM_IN", i), (d_inner + conv_dim + n_head, n_embd), n_embd ** -0.5)
        wr.mat(wr.name("SSM_CONV1D", i), (conv_dim, d_conv), d_conv ** -0.5, quantize=False)
        wr.add(wr.name("SSM_CONV1D", i, ".bias"), wr.normal((conv_dim,), 0.1))
        wr.add(wr.name("SSM_DT", i, ".bias"), _dt_bias(wr, n_head))
        wr.add(wr.name("SSM_A", i, ""), _a(wr, n_head).reshape(n_head, 1))
        wr.ones(wr.name("SSM_D", i, ""), (n_head, 1))
        wr.ones(wr.name("SSM_NORM", i), (n_group, d_inner // n_group))
        wr.mat(wr.name("SSM_OUT", i), (n_embd, d_inner), block_scale * d_inner ** -0.5)
    _head(wr, p, n_vocab, logit_scale)


def _lfm2(wr: _Writer, p: dict, n_vocab: int, *, block_scale: float, logit_scale: float) -> None:
    w, n_embd, n_head, n_ff, l_cache = wr.w, p["n_embd"], p["n_head"], p["n_ff"], p["l_cache"]
    hd = n_embd // n_head
    kv = [p["n_head_kv"] if i in p["attn_layers"] else 0 for i in range(p["n_layer"])]
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(p["rope_theta"])
    w.add_shortconv_l_cache(l_cache)
    wr.mat(wr.name("TOKEN_EMBD"), (n_vocab, n_embd), 1.0)
    for i in range(p["n_layer"]):
        wr.ones(wr.name("ATTN_NORM", i), n_embd)  # operator_norm
        if kv[i]:
            wr.mat(wr.name("ATTN_Q", i), (n_embd, n_embd), n_embd ** -0.5)
            wr.mat(wr.name("ATTN_K", i), (kv[i] * hd, n_embd), n_embd ** -0.5)
            wr.mat(wr.name("ATTN_V", i), (kv[i] * hd, n_embd), n_embd ** -0.5)
            wr.ones(wr.name("ATTN_Q_NORM", i), hd)
            wr.ones(wr.name("ATTN_K_NORM", i), hd)
            wr.mat(wr.name("ATTN_OUT", i), (n_embd, n_embd), block_scale * n_embd ** -0.5)
        else:
            # in_proj: B, C, x gates; depthwise causal conv of length l_cache over B*x; out = C * conv
            wr.mat(wr.name("SHORTCONV_INPROJ", i), (3 * n_embd, n_embd), n_embd ** -0.5)
            wr.mat(wr.name("SHORTCONV_CONV", i), (n_embd, l_cache), l_cache ** -0.5, quantize=False)
            wr.mat(wr.name("SHORTCONV_OUTPROJ", i), (n_embd, n_embd), block_scale * n_embd ** -0.5)
        wr.ones(wr.name("FFN_NORM", i), n_embd)
        _ffn(wr, i, n_embd, n_ff, block_scale)
    # llama.cpp reads LFM2's final norm as token_embd_norm (LLM_TENSOR_OUTPUT_NORM_LFM2)
    _head(wr, p, n_vocab, logit_scale, output_norm="TOKEN_EMBD_NORM")


def _gemma4_keys(w: gguf.GGUFWriter, p: dict) -> None:
    """Gemma 4's attention and window keys, which its assistant shares ("proportional" RoPE on full layers:
    rope_freqs switches the unrotated pairs off)."""
    w.add_feed_forward_length(p["n_ff"])
    w.add_head_count(p["n_head"])
    w.add_head_count_kv(p["n_head_kv"])
    w.add_key_length(p["head_dim"])
    w.add_value_length(p["head_dim"])
    w.add_key_length_swa(p["head_dim_swa"])
    w.add_value_length_swa(p["head_dim_swa"])
    w.add_rope_dimension_count(p["head_dim"])
    w.add_rope_dimension_count_swa(p["head_dim_swa"])
    w.add_rope_freq_base(p["rope_theta"])
    w.add_rope_freq_base_swa(p["rope_theta_swa"])
    w.add_sliding_window(p["sliding_window"])
    w.add_sliding_window_pattern(p["swa_pattern"])


def _gemma4_rope_freqs(wr: _Writer, p: dict) -> None:
    hd_full = p["head_dim"]
    n_rot = int(hd_full * p["partial_rotary_full"] / 2)
    wr.add(wr.name("ROPE_FREQS"), np.array([1.0] * n_rot + [1e30] * (hd_full // 2 - n_rot), dtype=np.float32))


def _gemma4_block_tail(wr: _Writer, i: int, n_embd: int, n_ff: int, block_scale: float) -> None:
    """A Gemma 4 block after its attention output (the target's and the assistant's): Gemma norms the blocks'
    outputs, so block_scale scales those norms, not the projections."""
    wr.add(wr.name("ATTN_POST_NORM", i), block_scale * (1.0 + wr.normal((n_embd,), 0.1)))
    wr.ones(wr.name("FFN_PRE_NORM", i), n_embd)  # gguf's name for Gemma's ffn_norm
    wr.mat(wr.name("FFN_GATE", i), (n_ff, n_embd), n_embd ** -0.5)
    wr.mat(wr.name("FFN_UP", i), (n_ff, n_embd), n_embd ** -0.5)
    wr.mat(wr.name("FFN_DOWN", i), (n_embd, n_ff), n_ff ** -0.5)
    wr.add(wr.name("FFN_POST_NORM", i), block_scale * (1.0 + wr.normal((n_embd,), 0.1)))
    wr.add(wr.name("LAYER_OUT_SCALE", i), np.ones(1, dtype=np.float32))


def _gemma4(wr: _Writer, p: dict, n_vocab: int, *, block_scale: float, logit_scale: float) -> None:
    w, n_embd, n_head, n_kv, n_ff = wr.w, p["n_embd"], p["n_head"], p["n_head_kv"], p["n_ff"]
    hd_full, hd_swa = p["head_dim"], p["head_dim_swa"]
    _gemma4_keys(w, p)
    w.add_shared_kv_layers(0)
    w.add_embedding_length_per_layer_input(0)  # no per-layer embeddings
    w.add_final_logit_softcapping(p["softcap"])
    wr.mat(wr.name("TOKEN_EMBD"), (n_vocab, n_embd), 1.0)  # scaled by sqrt(n_embd) on input
    _gemma4_rope_freqs(wr, p)
    for i, swa in enumerate(p["swa_pattern"]):
        hd = hd_swa if swa else hd_full
        wr.ones(wr.name("ATTN_NORM", i), n_embd)
        wr.mat(wr.name("ATTN_Q", i), (n_head * hd, n_embd), n_embd ** -0.5)
        wr.mat(wr.name("ATTN_K", i), (n_kv * hd, n_embd), n_embd ** -0.5)
        wr.mat(wr.name("ATTN_V", i), (n_kv * hd, n_embd), n_embd ** -0.5)
        wr.ones(wr.name("ATTN_Q_NORM", i), hd)
        wr.ones(wr.name("ATTN_K_NORM", i), hd)
        wr.mat(wr.name("ATTN_OUT", i), (n_embd, n_head * hd), (n_head * hd) ** -0.5)
        _gemma4_block_tail(wr, i, n_embd, n_ff, block_scale)
    _head(wr, p, n_vocab, logit_scale)


def _gemma4_assistant(wr: _Writer, p: dict, n_vocab: int, *, block_scale: float, logit_scale: float) -> None:
    """The tensors and keys of llama.cpp's gemma4-assistant loader (src/models/gemma4-assistant.cpp): every layer is a
    NextN layer (``nextn_predict_layers`` = ``block_count``), ``pre_projection`` maps [target embedding, target h]
    to n_embd, ``post_projection`` maps the final norm's output back to the target's width (the h of the next step)."""
    w, n_embd, n_head, n_ff = wr.w, p["n_embd"], p["n_head"], p["n_ff"]
    hd_full, hd_swa, n_bb = p["head_dim"], p["head_dim_swa"], p["n_embd_backbone"]
    w.add_embedding_length_out(n_bb)
    w.add_nextn_predict_layers(p["n_layer"])
    _gemma4_keys(w, p)
    # the LM head, tied: logits std ~ logit_scale at n_embd 64, as _head's
    wr.mat(wr.name("TOKEN_EMBD"), (n_vocab, n_embd), logit_scale * (64 / n_embd) ** 0.5)
    # llama-arch.cpp's LLM_TENSOR_NEXTN_PROJ_PRE / _POST (no block number), which gguf 0.19.0 does not name
    wr.mat("nextn.pre_projection.weight", (n_embd, 2 * n_bb), (2 * n_bb) ** -0.5)
    _gemma4_rope_freqs(wr, p)
    for i, swa in enumerate(p["swa_pattern"]):
        hd = hd_swa if swa else hd_full
        wr.ones(wr.name("ATTN_NORM", i), n_embd)
        wr.mat(wr.name("ATTN_Q", i), (n_head * hd, n_embd), n_embd ** -0.5)
        wr.ones(wr.name("ATTN_Q_NORM", i), hd)
        wr.mat(wr.name("ATTN_OUT", i), (n_embd, n_head * hd), (n_head * hd) ** -0.5)
        _gemma4_block_tail(wr, i, n_embd, n_ff, block_scale)
    wr.ones(wr.name("OUTPUT_NORM"), n_embd)
    wr.mat("nextn.post_projection.weight", (n_bb, n_embd), n_embd ** -0.5)


def shape_params(arch: str, shape: str = "tiny") -> dict:
    """The hyperparameters ``write_arch_model`` uses for ``arch`` at ``shape`` (a copy)."""
    if arch not in ARCHS + DRAFT_ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; one of {', '.join(ARCHS + DRAFT_ARCHS)}")
    if shape == "tiny":
        return dict(_TINY[arch])
    if shape == "qwen3.5-0.8b" and arch == "qwen35":
        return dict(QWEN35_0_8B)
    raise ValueError(f"no shape {shape!r} for {arch}: {arch} has 'tiny'" + (", 'qwen3.5-0.8b'" if arch == "qwen35"
                                                                            else ""))


def write_arch_model(path: str | Path, arch: str, *, mtp: bool = False, shape: str = "tiny", seed: int = 0,
                     block_scale: float = 1.0, logit_scale: float = 0.6, qtype: str | None = None,
                     chat_template: str = CHATML) -> Path:
    """Write a random-weight ``arch`` model of ``shape`` to ``path`` and return the path.

    ``block_scale`` < 1 shrinks what each block adds to the residual stream, so the next token depends mostly on
    the current one (a predictable, bigram-like target). ``logit_scale`` is the LM head's weight std at n_embd 64
    (scaled by sqrt(64 / n_embd) at other widths): 0.6 keeps greedy decoding clear of exact ties. ``qtype``: how
    2-D weights are stored, 'f32', 'f16' or 'q8_0' (default: f32 for tiny, q8_0 for a real shape). ``mtp`` (qwen35
    only) adds the NextN/MTP block."""
    path = Path(path)
    p = shape_params(arch, shape)
    if mtp and arch != "qwen35":
        raise ValueError(f"--mtp: only qwen35 has an MTP block here, not {arch}")
    big = shape != "tiny"
    qtype = qtype or ("q8_0" if big else "f32")
    if qtype not in ("f32", "f16", "q8_0"):
        raise ValueError(f"qtype {qtype!r}: one of f32, f16, q8_0")
    tokens, scores, types = vocab()
    if p.get("n_vocab", len(tokens)) > len(tokens):
        # a real shape's vocabulary size: filler tokens, plain text so that sampling one shows in the output, which
        # the tokenizer never produces (SentencePiece merges two tokens into one: the only token that is a prefix of
        # "<|filler_k|>" is "<", and the rest of it is no token)
        n_pad = p["n_vocab"] - len(tokens)
        tokens += [f"<|filler_{k}|>" for k in range(n_pad)]
        scores += [0.0] * n_pad
        types += [int(gguf.TokenType.NORMAL)] * n_pad
    wr = _Writer(path, arch, seed=seed, qtype=qtype, big=big)
    _header(wr, p, n_layer_all=p["n_layer"] + int(mtp), seed=seed, tokens=tokens, scores=scores, types=types,
            chat_template=chat_template)
    build = {"llama": _llama, "qwen35": _qwen35, "mamba2": _mamba2, "lfm2": _lfm2, "gemma4": _gemma4,
             "gemma4-assistant": _gemma4_assistant}[arch]
    kwargs = {"mtp": mtp} if arch == "qwen35" else {}
    build(wr, p, len(tokens), block_scale=block_scale, logit_scale=logit_scale, **kwargs)
    wr.finish()
    return path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("arch", choices=ARCHS + DRAFT_ARCHS)
    ap.add_argument("out", help="the GGUF file to write")
    ap.add_argument("--mtp", action="store_true", help="qwen35: add the MTP (NextN) block")
    ap.add_argument("--shape", choices=SHAPES, default="tiny")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--block-scale", type=float, default=1.0)
    ap.add_argument("--logit-scale", type=float, default=0.6)
    ap.add_argument("--qtype", choices=("f32", "f16", "q8_0"), default=None,
                    help="storage of 2-D weights (default: f32 for tiny, q8_0 for a real shape)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        out = write_arch_model(args.out, args.arch, mtp=args.mtp, shape=args.shape, seed=args.seed,
                               block_scale=args.block_scale, logit_scale=args.logit_scale, qtype=args.qtype)
    except ValueError as exc:
        ap.error(str(exc))
    print(f"{out}: {args.arch} {args.shape}{' +mtp' if args.mtp else ''}, {out.stat().st_size:,} bytes, "
          f"{time.perf_counter() - t0:.2f} s")


if __name__ == "__main__":
    main()
