"""Target features and target distributions for training, extracted through llama.cpp and cached on disk.

The head is judged at run time against the *quantized* target that llama.cpp runs, so its training inputs (the
residual inputs of three target layers) and labels (the target's next-token distribution) come from that same
model through the same llama.cpp code path, not from a float reimplementation.

Cache layout: one ``shard_NNNNN.npz`` per group of documents, each holding the concatenated ``tokens`` (int32),
per-document ``lengths``, ``feats`` (n, 3·H) as float16 (float32 when a value would overflow float16),
``top_ids`` (n, K) int32 and ``top_logp`` (n, K) float16: the K most likely next tokens of the target at each
position and their log-probabilities over the *full* vocabulary. A finished shard is never rewritten, so an
interrupted extraction resumes at the next shard; ``meta.json`` records what the cache was made from.
"""

from __future__ import annotations

import itertools
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, TypeVar

import numpy as np

from ..errors import Eagle2Error
from ..formats.atomic_write import atomic_path
from ..llamacpp.llama import LlamaContext, LlamaModel
from ..llamacpp.settings import ContextSettings

log = logging.getLogger(__name__)

F16_MAX = 60000.0
T = TypeVar("T")
N_BATCH = 256  # tokens per llama_decode while extracting features


class CacheMismatchError(Eagle2Error):
    """A feature cache on disk was made from another target, layer set or top-K than the one asked for."""


@dataclass(frozen=True)
class ExtractSettings:
    """What a cache holds; two caches with different settings must not be mixed."""

    target_sha256: str
    layers: tuple[int, ...]
    top_k: int = 32
    max_len: int = 1024
    n_batch: int = N_BATCH

    def key(self) -> dict:
        d = asdict(self)
        d.pop("n_batch")  # batch size does not change what is stored (beyond float rounding)
        d["layers"] = list(self.layers)
        return d


def default_layers(n_layer: int) -> tuple[int, int, int]:
    """EAGLE-3's feature layers (low, middle, high): 2, L/2 and L-3, kept inside small models."""
    return tuple(min(max(i, 0), n_layer - 1) for i in (2, n_layer // 2, n_layer - 3))


def bytes_per_token(n_embd: int, n_layers: int, top_k: int) -> int:
    """On-disk size of one cached token (float16 features, top-K ids and log-probs, the token id)."""
    return 2 * n_embd * n_layers + top_k * (4 + 2) + 4


def top_logprobs(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k most likely tokens per row, most likely first, with log-probabilities over the whole vocabulary."""
    idx = np.argpartition(-logits, k - 1, axis=1)[:, :k]
    vals = np.take_along_axis(logits, idx, axis=1)
    order = np.argsort(-vals, axis=1, kind="stable")
    idx = np.take_along_axis(idx, order, axis=1)
    vals = np.take_along_axis(vals, order, axis=1)
    mx = logits.max(axis=1, keepdims=True)
    lse = mx + np.log(np.exp(logits - mx).sum(axis=1, keepdims=True))
    return idx.astype(np.int32), (vals - lse).astype(np.float16)


@dataclass
class DocumentRows:
    """One document's training rows: its tokens and, per token, target features and top-K next-token log-probs."""

    tokens: np.ndarray
    feats: np.ndarray
    top_ids: np.ndarray
    top_logp: np.ndarray


class _Answer:
    """One prompt being answered in a sequence slot: its tokens so far and the rows of each decoded token."""

    def __init__(self, index: int, prompt: DocumentRows, limit: int) -> None:
        self.index = index  # position of the prompt in the input order
        self.tokens = [int(t) for t in prompt.tokens]
        self.parts = [(prompt.feats, prompt.top_ids, prompt.top_logp)]
        self.limit = limit  # the answer ends when the document reaches this many tokens

    def next_token(self) -> int:
        """The target's greedy choice after the last decoded token."""
        return int(self.parts[-1][1][-1, 0])

    def rows(self) -> DocumentRows:
        """The finished document. Its last token (EOG or the cut) was never decoded: its row repeats the one
        before, whose prediction is that token; it predicts nothing itself."""
        n = len(self.tokens)
        feats, ids, logps = (np.concatenate(x)[:n] for x in zip(*self.parts))
        pad = n - len(feats)
        if pad > 0:
            feats, ids, logps = (np.concatenate([a, np.repeat(a[-1:], pad, 0)]) for a in (feats, ids, logps))
        return DocumentRows(np.asarray(self.tokens, np.int32), feats, ids, logps)


class FeatureExtractor:
    """One llama.cpp context that decodes documents and returns (features, top-K distribution) per token.

    ``n_parallel`` > 1 answers that many prompts at once (one KV sequence each, unified KV off so a sequence
    attends only to its own cells): on 2 CPU cores a step of 16 tokens costs ~8 single-token steps, so
    self-generation runs about twice as fast."""

    def __init__(self, model: LlamaModel, layers: tuple[int, ...], top_k: int, max_len: int, n_batch: int,
                 n_threads: int | None, n_parallel: int = 1) -> None:
        if top_k < 1 or top_k > model.n_vocab:
            raise Eagle2Error(f"top-K must be in 1..{model.n_vocab}, got {top_k}")
        self.model = model
        self.top_k = top_k
        self.max_len = max_len
        self.n_parallel = n_parallel
        self.n_batch = max(min(n_batch, max_len), n_parallel)
        self.ctx = LlamaContext(model, ContextSettings(
            n_ctx=max(max_len, 16) * n_parallel, n_batch=self.n_batch, n_seq_max=n_parallel,
            n_threads=n_threads, layer_inputs=tuple(layers), kv_unified=n_parallel == 1))

    def _decode(self, tokens: np.ndarray, pos: np.ndarray, seqs: np.ndarray) -> tuple[np.ndarray, ...]:
        n = len(tokens)
        if len(set(seqs.tolist())) == 1:
            self.ctx.decode(tokens, pos, np.ones(n, dtype=np.int8), seq=int(seqs[0]))
        else:
            self.ctx.decode(tokens, pos, np.ones(n, dtype=np.int8), seq_mask=np.eye(n, dtype=bool), seq_ids=seqs)
        ids, logps = top_logprobs(self.ctx.logits(n, copy=False), self.top_k)
        return self.ctx.layer_inputs(n), ids, logps

    def document(self, tokens: list[int], seq: int = 0) -> DocumentRows:
        """Features (n, 3H) float32, top ids (n, K) and top log-probs (n, K) for one token sequence."""
        tokens = np.asarray(tokens[: self.max_len], dtype=np.int32)
        positions = np.arange(len(tokens), dtype=np.int32)
        self.ctx.seq_rm(seq)
        parts = [self._decode(tokens[s: s + self.n_batch], positions[s: s + self.n_batch], np.array([seq], np.int32))
                 for s in range(0, len(tokens), self.n_batch)]
        return DocumentRows(tokens, *(np.concatenate(p) for p in zip(*parts)))

    def generate(self, prompt: list[int], max_new: int) -> DocumentRows:
        """The target's greedy answer to ``prompt``, with the rows of prompt and answer, in one pass."""
        return next(self.generate_many([prompt], max_new))

    def generate_many(self, prompts: Iterable[list[int]], max_new: int) -> Iterator[DocumentRows]:
        """Greedy answers to ``prompts`` with their rows, ``n_parallel`` at a time, yielded in prompt order.

        Self-generated text costs one decode per token anyway; reading the features and distributions of
        that same decode makes its training rows free."""
        source = iter(prompts)
        slots: dict[int, _Answer] = {}  # KV sequence id -> the answer decoded in it
        done: dict[int, DocumentRows] = {}
        n_started = n_yielded = 0
        exhausted = False
        while True:
            while not exhausted and len(slots) < self.n_parallel:
                prompt = next(source, None)
                if prompt is None:
                    exhausted = True
                    break
                slot = min(set(range(self.n_parallel)) - set(slots))
                prompt = list(prompt[: self.max_len - 1])
                slots[slot] = _Answer(n_started, self.document(prompt, seq=slot),
                                      min(len(prompt) + max_new, self.max_len))
                n_started += 1
            if not slots and n_yielded == n_started:
                return
            self._step(slots, done)
            while n_yielded in done:
                yield done.pop(n_yielded)
                n_yielded += 1

    def _step(self, slots: dict[int, _Answer], done: dict[int, DocumentRows]) -> None:
        """Append each slot's next token; decode those that go on as one batch, retire those that ended."""
        active = []
        for slot, answer in list(slots.items()):
            nxt = answer.next_token()
            answer.tokens.append(nxt)
            if nxt in self.model.eog_tokens or len(answer.tokens) >= answer.limit:
                done[answer.index] = answer.rows()
                del slots[slot]
                self.ctx.seq_rm(slot)
            else:
                active.append(slot)
        if not active:
            return
        answers = [slots[s] for s in active]
        tokens = np.array([a.tokens[-1] for a in answers], np.int32)
        pos = np.array([len(a.tokens) - 1 for a in answers], np.int32)
        feats, ids, logps = self._decode(tokens, pos, np.array(active, np.int32))
        for i, a in enumerate(answers):
            a.parts.append((feats[i: i + 1], ids[i: i + 1], logps[i: i + 1]))

    def close(self) -> None:
        self.ctx.close()


class ShardWriter:
    """Appends documents' rows to a cache as numbered shards; on restart it skips documents already stored.

    Callers feed documents in a fixed order; ``skip`` says how many of them finished shards already hold
    (shards are full except possibly the last one of a finished extraction)."""

    def __init__(self, cache: Path, settings: ExtractSettings, docs_per_shard: int = 64) -> None:
        check_meta(cache, settings)
        self.cache = cache
        self.docs_per_shard = docs_per_shard
        shards = shard_files(cache)
        self.n_shards = len(shards)
        self.n_tokens = self.skip = 0
        for p in shards:
            with np.load(p) as z:
                self.n_tokens += int(z["lengths"].sum())
                self.skip += len(z["lengths"])
        self.pending: list[DocumentRows] = []

    def add(self, rows: DocumentRows) -> None:
        self.pending.append(rows)
        self.n_tokens += len(rows.tokens)
        if len(self.pending) >= self.docs_per_shard:
            self.flush()

    def flush(self) -> None:
        """Write pending documents as one shard (atomically: a crash never leaves half a shard)."""
        if not self.pending:
            return
        docs, self.pending = self.pending, []
        feats = np.concatenate([d.feats for d in docs])
        feats = feats.astype(np.float16) if np.abs(feats).max() < F16_MAX else feats.astype(np.float32)
        path = self.cache / f"shard_{self.n_shards:05d}.npz"
        with atomic_path(path) as tmp, tmp.open("wb") as f:  # a file, so that savez adds no .npz to the name
            np.savez(f, tokens=np.concatenate([d.tokens for d in docs]),
                     lengths=np.array([len(d.tokens) for d in docs], np.int32), feats=feats,
                     top_ids=np.concatenate([d.top_ids for d in docs]),
                     top_logp=np.concatenate([d.top_logp for d in docs]))
        self.n_shards += 1


def shard_files(cache: Path) -> list[Path]:
    """Finished shards of a cache, in order (a shard being written has another name until it is complete)."""
    return sorted(cache.glob("shard_*.npz"))


def check_meta(cache: Path, settings: ExtractSettings) -> None:
    """Create ``meta.json`` or refuse a cache that was made differently (mixing would poison training)."""
    meta_path = cache / "meta.json"
    if meta_path.is_file():
        old = json.loads(meta_path.read_text())
        if old != settings.key():
            raise CacheMismatchError(f"{cache} holds features made with {old}, not {settings.key()}; "
                                     f"use another cache directory")
    else:
        cache.mkdir(parents=True, exist_ok=True)
        meta_path.write_text(json.dumps(settings.key(), indent=1))


def fill_cache(model: LlamaModel, cache: Path, settings: ExtractSettings, items: Iterable[T],
               rows_of: Callable[[FeatureExtractor, Iterator[T]], Iterator[DocumentRows]], *, max_tokens: int,
               docs_per_shard: int, n_threads: int | None, progress: Callable[[int, int], None] | None,
               n_parallel: int = 1) -> int:
    """Turn ``items`` into rows with ``rows_of`` (one DocumentRows per item, in item order) until ``cache`` holds
    ``max_tokens`` tokens; return that count.

    Items already stored by an earlier (interrupted) run are skipped, so the item order must not change."""
    writer = ShardWriter(cache, settings, docs_per_shard)
    if writer.n_tokens >= max_tokens:
        return writer.n_tokens
    extractor = FeatureExtractor(model, settings.layers, settings.top_k, settings.max_len, settings.n_batch,
                                 n_threads, n_parallel=n_parallel)
    try:
        for rows in rows_of(extractor, itertools.islice(iter(items), writer.skip, None)):
            writer.add(rows)
            if progress:
                progress(writer.n_tokens, max_tokens)
            if writer.n_tokens >= max_tokens:
                break
        writer.flush()
    finally:
        extractor.close()
    return writer.n_tokens


def extract_to_cache(model: LlamaModel, token_docs: Iterable[list[int]], cache: Path, settings: ExtractSettings,
                     *, max_tokens: int, n_threads: int | None = None,
                     progress: Callable[[int, int], None] | None = None) -> int:
    """Fill ``cache`` with up to ``max_tokens`` tokens of ``token_docs``; return the number of tokens cached.

    Long documents make small shards (8 documents), so an interrupted run loses little."""
    return fill_cache(model, cache, settings, _nonempty(token_docs),
                      lambda ex, docs: (ex.document(tokens) for tokens in docs),
                      max_tokens=max_tokens, docs_per_shard=8, n_threads=n_threads, progress=progress)


def _nonempty(docs: Iterable[list[int]]) -> Iterator[list[int]]:
    for d in docs:
        if len(d) >= 2:
            yield d


@dataclass
class FeatureSet:
    """All cached documents in memory: ``starts[i]:starts[i]+lengths[i]`` are document i's rows."""

    tokens: np.ndarray
    feats: np.ndarray
    top_ids: np.ndarray
    top_logp: np.ndarray
    lengths: np.ndarray

    @property
    def starts(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)

    @property
    def n_tokens(self) -> int:
        return int(self.lengths.sum())

    def split(self, n_heldout_docs: int) -> tuple["FeatureSet", "FeatureSet"]:
        """(training set, held-out set): the last ``n_heldout_docs`` documents are held out."""
        n_keep = max(len(self.lengths) - n_heldout_docs, 0)
        cut = int(self.lengths[:n_keep].sum())
        a = FeatureSet(self.tokens[:cut], self.feats[:cut], self.top_ids[:cut], self.top_logp[:cut],
                       self.lengths[:n_keep])
        b = FeatureSet(self.tokens[cut:], self.feats[cut:], self.top_ids[cut:], self.top_logp[cut:],
                       self.lengths[n_keep:])
        return a, b


def _npy_header(z, key: str) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of one array of an opened ``.npz`` without reading its data."""
    with z.zip.open(key + ".npy") as f:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(f)
    return shape, dtype


def _empty_set(n_rows: int, n_docs: int, width: int, k: int, feat_dtype) -> FeatureSet:
    return FeatureSet(np.empty(n_rows, np.int32), np.empty((n_rows, width), feat_dtype),
                      np.empty((n_rows, k), np.int32), np.empty((n_rows, k), np.float16), np.empty(n_docs, np.int32))


def load_split(caches: Iterable[Path], n_heldout_docs: int = 0) -> tuple[FeatureSet, FeatureSet]:
    """(training set, held-out set) of every shard of the given caches; each cache gives its last
    ``n_heldout_docs`` documents to the held-out set.

    Why two passes: the feature rows of a few million tokens take gigabytes (3.5 KB per SmolLM2 token), so the
    first pass reads only the shards' headers and document lengths, and the second copies each shard straight
    into arrays of the final size (peak memory: the result plus one shard, not three copies of it)."""
    caches = [Path(c) for c in caches]
    shards = []  # (path, lengths, number of training documents): held-out documents end their cache
    width = k = None
    feat_dtype = np.dtype(np.float16)
    for cache in caches:
        files = shard_files(cache)
        lengths = []
        for path in files:
            with np.load(path) as z:
                lengths.append(z["lengths"])
                (_, width), dtype = _npy_header(z, "feats")
                (_, k), _ = _npy_header(z, "top_ids")
                if dtype != np.float16:
                    feat_dtype = np.dtype(np.float32)
        first_held = max(sum(len(x) for x in lengths) - n_heldout_docs, 0)
        doc = 0
        for path, lens in zip(files, lengths):
            shards.append((path, lens, int(np.clip(first_held - doc, 0, len(lens)))))
            doc += len(lens)
    if not shards:
        raise Eagle2Error(f"no cached features in {', '.join(map(str, caches))}")
    train = _empty_set(sum(int(lens[:cut].sum()) for _, lens, cut in shards),
                       sum(cut for _, _, cut in shards), width, k, feat_dtype)
    held_out = _empty_set(sum(int(lens[cut:].sum()) for _, lens, cut in shards),
                          sum(len(lens) - cut for _, lens, cut in shards), width, k, feat_dtype)
    at = [[0, 0], [0, 0]]  # next (row, document) to fill in the training and the held-out set
    for path, lens, cut_doc in shards:
        with np.load(path) as z:
            arrays = {key: z[key] for key in ("tokens", "feats", "top_ids", "top_logp")}
        cut_row = int(lens[:cut_doc].sum())
        for i, (dest, rows, docs) in enumerate(((train, slice(0, cut_row), slice(0, cut_doc)),
                                                (held_out, slice(cut_row, None), slice(cut_doc, None)))):
            row, doc = at[i]
            n, m = int(lens[docs].sum()), len(lens[docs])
            for key, src in arrays.items():
                getattr(dest, key)[row: row + n] = src[rows]
            dest.lengths[doc: doc + m] = lens[docs]
            at[i] = [row + n, doc + m]
    return train, held_out
