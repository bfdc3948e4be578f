"""A thin, checked layer over llama-cpp-python's low-level C API.

It owns three things and nothing else: loading a model (with our own validation first, because llama.cpp
aborts or fails obscurely on bad files), creating a context with the settings tree verification needs, and
decoding batches whose per-token positions / sequence-id sets come from numpy arrays (:mod:`.batch` fills them;
:mod:`.runtime` sets llama.cpp up, keeps its log and times the calls). Target, draft engines and plain decoding
all go through it, so they use the same llama.cpp code path.
"""

from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path
from typing import Sequence

import llama_cpp
import numpy as np

from ..errors import ContextFullError, DecodeError, Eagle2Error, ModelError, TreeError, UnsupportedModelError
from ..formats.models import GGUFInfo, read_gguf_info
from . import llama_ext, rpc
from .batch import Batch, batch_entries
from .runtime import charge_llama, ensure_backend, error_mark, errors_since, last_llama_errors
from .settings import FLASH_ATTN, ContextSettings

MAX_SEQ = int(llama_cpp.llama_max_parallel_sequences())  # sequences one context can address (256 in the pinned build)


# ---------------------------------------------------------------- model
class LlamaModel:
    """A loaded GGUF model plus its vocabulary helpers (tokenize, detokenize, special tokens)."""

    def __init__(self, path: str | os.PathLike, n_gpu_layers: int | None = None, verbose: bool = False,
                 info: GGUFInfo | None = None, rpc_servers: Sequence[str] = (), load_mtp: bool = False) -> None:
        """``rpc_servers``: ``HOST:PORT`` endpoints of llama.cpp RPC servers that get the offloaded layers
        (``n_gpu_layers``; default all of them with servers, none without). ``load_mtp``: also load the model's
        MTP (NextN) layers, which only an MTP draft runs (llama.cpp skips their weights otherwise)."""
        ensure_backend(verbose)
        self.path = Path(path)
        self.info = info or read_gguf_info(self.path)
        self.rpc_servers = rpc.parse_servers(list(rpc_servers)) if rpc_servers else ()
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = (-1 if self.rpc_servers else 0) if n_gpu_layers is None else n_gpu_layers
        params.load_mtp = load_mtp
        self.load_mtp = load_mtp
        self.n_gpu_layers = int(params.n_gpu_layers)
        devices = None
        if self.rpc_servers:  # llama.cpp's default device selection would leave every layer on the CPU
            devices = rpc.device_list(rpc.devices(self.rpc_servers))
            params.devices = ctypes.addressof(devices)
        last_llama_errors()
        self._model = llama_cpp.llama_model_load_from_file(str(self.path).encode("utf-8"), params)
        del devices  # llama.cpp copied the list
        if not self._model:
            why = last_llama_errors() or "llama.cpp could not load it"
            raise ModelError(f"cannot load {self.path.name}: {why}")
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self._pieces: dict[int, bytes] = {}  # token -> its piece (special tokens as text), see piece()
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.n_embd = int(llama_cpp.llama_model_n_embd(self._model))
        self.n_ctx_train = int(llama_cpp.llama_model_n_ctx_train(self._model))
        self.n_layer = int(llama_cpp.llama_model_n_layer(self._model))  # the trunk's: MTP layers not counted
        self.n_layer_nextn = int(llama_cpp.llama_model_n_layer_nextn(self._model))  # MTP layers in the file
        self.n_embd_out = int(llama_cpp.llama_model_n_embd_out(self._model))  # width of the nextn embeddings
        self.bos = int(llama_cpp.llama_vocab_bos(self._vocab))
        self.eos = int(llama_cpp.llama_vocab_eos(self._vocab))
        self.eot = int(llama_cpp.llama_vocab_eot(self._vocab))
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))
        self.eog_tokens = frozenset(t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self._vocab, t)) \
            if self.n_vocab <= 300_000 else frozenset({self.eos})
        # What llama.cpp says of the architecture's memory: a recurrent state (Mamba, RWKV) or attention layers
        # beside recurrent ones (hybrids: Qwen3.5, LFM2, Nemotron-H, ...). Such a state cannot hold a tree's
        # branches side by side; docs/design.md "Recurrent and hybrid models".
        self.recurrent = bool(llama_cpp.llama_model_is_recurrent(self._model))
        self.hybrid = bool(llama_cpp.llama_model_is_hybrid(self._model))
        self._closed = False

    def check_generative(self) -> None:
        """Refuse, in one line, a target that llama.cpp cannot decode token by token: an encoder-decoder, an
        encoder alone or a diffusion model (an embedding model is found when its context has no memory). Draft
        heads are not asked: an EAGLE-3 head is an encoder to llama.cpp."""
        why = None
        if llama_cpp.llama_model_has_encoder(self._model) or not llama_cpp.llama_model_has_decoder(self._model):
            why = "has an encoder (eagle2-local drives decoder-only models)"
        elif llama_cpp.llama_model_is_diffusion(self._model):
            why = "is a diffusion model (it does not generate token by token)"
        if why is not None:
            raise UnsupportedModelError(f"{self.path.name}: architecture '{self.architecture}' {why}; "
                                        "llama.cpp cannot generate with it here")

    @property
    def memory_kind(self) -> str:
        """``"attention"``, ``"recurrent"`` or ``"hybrid"``, as llama.cpp classifies the architecture."""
        return "hybrid" if self.hybrid else "recurrent" if self.recurrent else "attention"

    @property
    def ptr(self):
        return self._model

    @property
    def vocab(self):
        """llama.cpp's vocabulary handle (grammar samplers are built over it)."""
        return self._vocab

    @property
    def architecture(self) -> str:
        return self.info.architecture

    def tokenize(self, text: str | bytes, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of ``text`` (with BOS when the model wants it and ``add_special``)."""
        data = text.encode("utf-8") if isinstance(text, str) else text
        n_max = len(data) + 16
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (llama_cpp.llama_token * n_max)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        return list(buf[:n])

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        """Raw bytes of one token (may be part of a multi-byte UTF-8 character)."""
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._vocab, int(token), buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, int(token), buf, -n, 0, special)
        return buf.raw[:n]

    def piece(self, token: int) -> bytes:
        """:meth:`token_bytes` with special tokens as text, remembered: drafts that read the text (lookups,
        renames) read the same tokens' pieces every round."""
        text = self._pieces.get(token)
        if text is None:
            text = self._pieces[token] = self.token_bytes(token, special=True)
        return text

    def detokenize(self, tokens, special: bool = False) -> bytes:
        return b"".join(self.token_bytes(t, special) for t in tokens)

    def token_text(self, token: int) -> bytes:
        """The vocabulary's stored text of a token (used to compare two vocabularies)."""
        return llama_cpp.llama_vocab_get_text(self._vocab, int(token)) or b""

    def close(self) -> None:
        if not self._closed and self._model:
            llama_cpp.llama_model_free(self._model)
        self._closed = True

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown order varies
        try:
            self.close()
        except Exception:
            pass


# ---------------------------------------------------------------- context
class LlamaContext:
    """One llama.cpp context on a model, with KV-memory helpers and a checked ``decode``."""

    def __init__(self, model: LlamaModel, settings: ContextSettings, ctx_other: "LlamaContext | None" = None) -> None:
        if not 1 <= settings.n_seq_max <= MAX_SEQ:
            raise TreeError(f"n_seq_max must be in 1..{MAX_SEQ}, got {settings.n_seq_max}")
        if settings.n_batch < 1 or settings.n_ctx < 8:
            raise Eagle2Error(f"invalid context size {settings.n_ctx} / batch {settings.n_batch}")
        self.model = model
        self.settings = settings
        self.n_batch = min(settings.n_batch, settings.n_ctx)
        p = llama_cpp.llama_context_default_params()
        p.n_ctx = settings.n_ctx
        p.n_batch = self.n_batch
        p.n_ubatch = self.n_batch  # a whole tree in one physical pass
        p.n_seq_max = settings.n_seq_max
        # llama.cpp reserves one output per sequence at creation and aborts if that exceeds n_outputs_max
        p.n_outputs_max = max(self.n_batch, settings.n_seq_max)
        p.n_threads = settings.threads()
        p.n_threads_batch = settings.threads()
        p.kv_unified = settings.kv_unified
        p.swa_full = True
        p.embeddings = settings.embeddings
        p.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_NONE
        p.no_perf = True
        p.flash_attn_type = FLASH_ATTN[settings.flash_attn]
        p.n_rs_seq = settings.n_rs_seq
        if settings.mtp:
            p.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_MTP
        if ctx_other is not None:  # e.g. an eagle3 head borrowing the target's token embedding / LM head
            p.ctx_other = ctx_other.ptr
        self.other = ctx_other  # keep the borrowed context alive as long as this one
        last_llama_errors()
        self._ctx = llama_cpp.llama_init_from_model(model.ptr, p)
        if not self._ctx:
            raise ModelError(f"cannot create a llama.cpp context for {model.path.name}: {last_llama_errors()}")
        self.n_ctx = int(llama_cpp.llama_n_ctx(self._ctx))
        self.n_seq_max = settings.n_seq_max
        self.mem = llama_cpp.llama_get_memory(self._ctx)  # None for embedding models, which keep no memory
        self.n_rs_seq = int(llama_cpp.llama_n_rs_seq(self._ctx))  # what llama.cpp granted of settings.n_rs_seq
        self.batch = Batch(self.n_batch, settings.n_seq_max)
        self.n_vocab = model.n_vocab
        self.n_embd = model.n_embd
        # decoder input rows (EAGLE-3 g; an MTP context reads the target's nextn rows)
        self.n_embd_inp = model.n_embd_out if settings.mtp else int(llama_cpp.llama_model_n_embd_inp(model.ptr))
        self.embeddings = settings.embeddings
        self._closed = False
        self.layer_ids = tuple(settings.layer_inputs)
        if self.layer_ids:
            self._enable_layer_inputs()
        self.nextn_features = settings.nextn_features or settings.mtp
        if self.nextn_features:
            try:
                llama_ext.set_nextn(self._ctx, True, masked=False)
            except ModelError:
                self.close()
                raise

    def _enable_layer_inputs(self) -> None:
        """Validate then switch on layer-input extraction (llama.cpp aborts on a layer its graph lacks)."""
        arch = self.model.architecture
        if arch not in llama_ext.LAYER_INPUT_ARCHS:
            self.close()
            raise ModelError(f"llama.cpp cannot expose layer inputs of a {arch!r} model (EAGLE-3 features); "
                             f"supported: {', '.join(sorted(llama_ext.LAYER_INPUT_ARCHS))}")
        bad = [i for i in self.layer_ids if not 0 <= i < self.model.n_layer]
        if bad:
            self.close()
            raise ModelError(f"layer ids {bad} are outside 0..{self.model.n_layer - 1} of {self.model.path.name}")
        for il in self.layer_ids:
            llama_ext.set_layer_input(self._ctx, il, True)

    @property
    def ptr(self):
        return self._ctx

    # ------------------------------------------------------------ decode
    def decode(self, tokens: np.ndarray | None, pos: np.ndarray | int, outputs: np.ndarray | int, *, seq: int = 0,
               seq_mask: np.ndarray | None = None, seq_ids: np.ndarray | list[int] | None = None,
               embd: np.ndarray | None = None, embd_rows: list[int] | None = None, encode: bool = False) -> None:
        """Submit one batch: every token in sequence ``seq``, or token i in ``seq_ids[i]`` (``seq_mask`` None),
        or in the sequences ``seq_ids[j]`` where ``seq_mask[i, j]``. ``pos`` and ``outputs``: per token, or one
        value for all (a tree level). ``embd``: an embedding row per entry, beside its token (decoder input rows,
        ``n_embd_inp`` wide) or alone (``tokens`` None; with ``encode``, the encoder graph's input rows); with
        ``embd_rows``, entry i takes row ``embd_rows[i]`` of ``embd`` (gathered into the batch). Sizes are
        checked here because llama.cpp aborts the process on oversize batches and reads embedding rows at the
        width its graph expects."""
        n = batch_entries(tokens, embd, embd_rows)
        if n == 0:
            return
        if n > self.n_batch:
            raise TreeError(f"batch of {n} tokens exceeds n_batch={self.n_batch}")
        last = pos if isinstance(pos, int) else int(pos.max())
        if last >= self.n_ctx:
            raise ContextFullError(f"position {last} is beyond the context size {self.n_ctx}")
        if seq_ids is not None:
            ids = seq_ids if isinstance(seq_ids, list) else seq_ids.tolist()  # a level's few ids: Python's min/max
            if min(ids, default=0) < 0 or max(ids, default=0) >= self.n_seq_max:
                raise TreeError(f"sequence id out of range 0..{self.n_seq_max - 1}")
        if not 0 <= seq < self.n_seq_max:
            raise TreeError(f"sequence id {seq} out of range 0..{self.n_seq_max - 1}")
        if embd is not None and not encode and embd.shape[1] != self.n_embd_inp:
            raise DecodeError(f"embedding rows of width {embd.shape[1]}; {self.model.path.name} reads "
                              f"{self.n_embd_inp}")
        self.batch.fill(tokens, pos, seq_mask, seq_ids, seq, outputs, embd, embd_rows)
        mark = error_mark()
        t0 = time.perf_counter()
        rc = (llama_cpp.llama_encode if encode else llama_cpp.llama_decode)(self._ctx, self.batch.struct)
        charge_llama(t0)
        if rc == 1:
            raise ContextFullError(f"no room in the KV cache for {n} tokens ({errors_since(mark)})")
        if rc != 0:
            raise DecodeError(f"llama_{'encode' if encode else 'decode'} failed with code {rc}: "
                              f"{errors_since(mark)}")

    def logits(self, n_out: int, copy: bool = True) -> np.ndarray:
        """Logits of the last batch's output tokens, in batch order.

        ``copy=False`` returns a view of llama.cpp's buffer (n_out x vocab floats, megabytes for large
        vocabularies): valid only until the next decode on this context or its release.
        """
        t0 = time.perf_counter()
        ptr = llama_cpp.llama_get_logits(self._ctx)  # waits for an asynchronous backend (GPU) to finish
        charge_llama(t0)
        view = llama_ext.buffer_view(ptr, (n_out, self.n_vocab))
        return view.copy() if copy else view

    def features(self, n_out: int, rows: np.ndarray | None = None) -> np.ndarray:
        """Post-final-norm hidden states of the last batch's outputs (needs ``embeddings=True``); only ``rows``
        of them when given."""
        if not self.embeddings:
            raise DecodeError("features need a context created with embeddings=True")
        t0 = time.perf_counter()
        ptr = llama_cpp.llama_get_embeddings(self._ctx)
        charge_llama(t0)
        view = llama_ext.buffer_view(ptr, (n_out, self.n_embd))
        return view.copy() if rows is None else view[rows]

    def nextn_rows(self, n_tokens: int, rows: np.ndarray | None = None, copy: bool = True) -> np.ndarray:
        """The last batch's nextn embeddings, one row per batch token in batch order (needs ``nextn_features`` or
        ``mtp``), or only ``rows`` of them; ``copy=False``: a view of llama.cpp's buffer, valid until the next
        decode."""
        if not self.nextn_features:
            raise DecodeError("nextn rows need a context created with nextn_features=True (or an MTP context)")
        t0 = time.perf_counter()
        ptr = llama_ext.nextn_ptr(self._ctx)  # waits for an asynchronous backend (GPU) to finish
        charge_llama(t0)
        if not ptr:
            raise DecodeError("llama.cpp returned no nextn embeddings for the last decode")
        view = llama_ext.buffer_view(ptr, (n_tokens, self.model.n_embd_out))
        if rows is not None:
            return view[rows]
        return view.copy() if copy else view

    def layer_inputs(self, n_tokens: int, rows: np.ndarray | None = None) -> np.ndarray:
        """Residual inputs of the configured layers for every token of the last batch (only ``rows`` of them
        when given), concatenated per token in ``layer_ids`` order: (n, len(layer_ids) * n_embd). Unlike
        logits, these exist for all tokens, output or not."""
        if not self.layer_ids:
            raise DecodeError("layer inputs need a context created with ContextSettings.layer_inputs")
        n, width = (n_tokens if rows is None else len(rows)), self.n_embd
        out = np.empty((n, len(self.layer_ids) * width), dtype=np.float32)
        t0 = time.perf_counter()
        ptrs = [llama_ext.layer_input_ptr(self._ctx, il) for il in self.layer_ids]
        charge_llama(t0)
        for i, (il, ptr) in enumerate(zip(self.layer_ids, ptrs)):
            view = llama_ext.layer_input_view(ptr, il, n_tokens, width)
            out[:, i * width:(i + 1) * width] = view if rows is None else view[rows]
        return out

    # ------------------------------------------------------------ memory
    # Each call is charged to llama_seconds(): a tree round makes one or two per node (sequence copies), and on a
    # unified KV cache each walks the cells, so together they are a visible part of a round.
    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        t0 = time.perf_counter()
        ok = bool(llama_cpp.llama_memory_seq_rm(self.mem, seq, p0, p1))
        charge_llama(t0)
        return ok

    def seq_keep(self, seq: int) -> None:
        """Drop every other sequence from every cell (cells of no other sequence become free) in one walk over
        the cells, where a seq_rm per sequence walks them once each."""
        t0 = time.perf_counter()
        llama_cpp.llama_memory_seq_keep(self.mem, seq)
        charge_llama(t0)

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        t0 = time.perf_counter()
        llama_cpp.llama_memory_seq_cp(self.mem, src, dst, p0, p1)
        charge_llama(t0)

    def seq_cp_many(self, srcs: list[int], dsts: list[int]) -> None:
        """``seq_cp(srcs[i], dsts[i])`` for every i, timed as one llama.cpp call: a tree level or a verify makes
        tens of them in a row, and two clock reads each cost more than the Python around the calls."""
        cp, mem = llama_cpp.llama_memory_seq_cp, self.mem
        t0 = time.perf_counter()
        for src, dst in zip(srcs, dsts):
            cp(mem, src, dst, -1, -1)
        charge_llama(t0)

    def seq_rm_many(self, seqs: list[int]) -> None:
        """``seq_rm(seq)`` (whole sequences) for every seq, timed as one llama.cpp call (see seq_cp_many)."""
        rm, mem = llama_cpp.llama_memory_seq_rm, self.mem
        t0 = time.perf_counter()
        for seq in seqs:
            rm(mem, seq, -1, -1)
        charge_llama(t0)

    def seq_pos_max(self, seq: int) -> int:
        t0 = time.perf_counter()
        pos = int(llama_cpp.llama_memory_seq_pos_max(self.mem, seq))
        charge_llama(t0)
        return pos

    def clear(self) -> None:
        t0 = time.perf_counter()
        llama_cpp.llama_memory_clear(self.mem, True)
        charge_llama(t0)

    def save_seq(self, seq: int, partial: bool = False) -> bytes:
        """Serialise one sequence's KV cells (in cell order); ``partial``: only its recurrent state (llama.cpp's
        ``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``: a hybrid's attention cells stay out)."""
        flags = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if partial else 0
        t0 = time.perf_counter()
        size = int(llama_cpp.llama_state_seq_get_size_ext(self._ctx, seq, flags))
        buf = (ctypes.c_uint8 * size)()
        written = int(llama_cpp.llama_state_seq_get_data_ext(self._ctx, buf, size, seq, flags))
        charge_llama(t0)
        return ctypes.string_at(buf, written)  # (bytes(buf[:written]) went through a list of Python ints)

    def load_seq(self, data: bytes, seq: int, partial: bool = False) -> None:
        """Put back what :meth:`save_seq` wrote (with the same ``partial``) into sequence ``seq``."""
        flags = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if partial else 0
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        t0 = time.perf_counter()
        ok = int(llama_cpp.llama_state_seq_set_data_ext(self._ctx, buf, len(data), seq, flags)) != 0
        charge_llama(t0)
        if not ok:
            raise ContextFullError(f"could not restore sequence {seq}: {last_llama_errors()}")

    def close(self) -> None:
        if not self._closed and self._ctx:
            llama_cpp.llama_free(self._ctx)
        self._closed = True

    def __del__(self) -> None:  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass
