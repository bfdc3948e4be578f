"""Training loop: training-time test losses, AdamW with warmup + cosine decay, checkpoints, resume, evaluation.

Labels are the target's own next-token distributions (top-K log-probs, renormalised over the draft
vocabulary), so the head learns what the quantized target would say, which is what verification checks.
Everything random is seeded (head init, batch order), so a run repeats exactly on the same machine; a resumed
run continues the same batch order from the checkpointed step.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..formats.atomic_write import atomic_path
from .features import FeatureSet
from .head import Eagle3Head

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings (saved in checkpoints and in the exported head's provenance)."""

    epochs: float = 1.0
    lr: float = 1e-3
    warmup_steps: int = 50
    batch_tokens: int = 4096
    ttt_steps: int = 3  # unrolled draft steps per position (training-time test)
    step_decay: float = 0.8  # loss weight of step j is step_decay**j
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    seed: int = 0
    checkpoint_every: int = 100  # optimizer steps
    max_minutes: float | None = None  # stop (and still export) when this much training time is used

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class TrainBatch:
    feats: torch.Tensor  # (B, T, 3Ht) float32
    tokens: torch.Tensor  # (B, T) int64
    top_ids: torch.Tensor  # (B, T, K) int64 target ids
    top_logp: torch.Tensor  # (B, T, K) float32
    lengths: torch.Tensor  # (B,)

    @property
    def n_tokens(self) -> int:
        return int(self.lengths.sum())


def plan_batches(lengths: np.ndarray, batch_tokens: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Documents grouped into batches of about ``batch_tokens`` padded tokens, in a random but seeded order.

    Documents are shuffled, then sorted by length inside pools of 64 so that padding stays small."""
    order = rng.permutation(len(lengths))
    pools = [order[i: i + 64] for i in range(0, len(order), 64)]
    batches: list[np.ndarray] = []
    for pool in pools:
        pool = pool[np.argsort(-lengths[pool], kind="stable")]
        cur: list[int] = []
        for d in pool:
            width = max([lengths[i] for i in cur] + [lengths[d]])
            if cur and width * (len(cur) + 1) > batch_tokens:
                batches.append(np.array(cur))
                cur = []
            cur.append(int(d))
        if cur:
            batches.append(np.array(cur))
    return [batches[i] for i in rng.permutation(len(batches))]


def make_batch(fs: FeatureSet, docs: np.ndarray, starts: np.ndarray, device: str = "cpu") -> TrainBatch:
    """Pad the chosen documents into tensors (padding rows are masked by their lengths)."""
    lens = fs.lengths[docs]
    B, T, K = len(docs), int(lens.max()), fs.top_ids.shape[1]
    feats = np.zeros((B, T, fs.feats.shape[1]), np.float32)
    tokens = np.zeros((B, T), np.int64)
    top_ids = np.zeros((B, T, K), np.int64)
    top_logp = np.full((B, T, K), -1e4, np.float32)
    for b, d in enumerate(docs):
        s, n = int(starts[d]), int(lens[b])
        feats[b, :n] = fs.feats[s: s + n]
        tokens[b, :n] = fs.tokens[s: s + n]
        top_ids[b, :n] = fs.top_ids[s: s + n]
        top_logp[b, :n] = fs.top_logp[s: s + n]
    arrays = (feats, tokens, top_ids, top_logp, lens.astype(np.int64))
    return TrainBatch(*(torch.from_numpy(a).to(device) for a in arrays))


def step_rows(batch: TrainBatch, j: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask of rows P with a label at step j, label row index P+1+j). A label row r needs r <= length-2:
    the last row's distribution predicts past the text (and is a copy for self-generated documents)."""
    T = batch.tokens.shape[1]
    label_row = torch.arange(T, device=batch.tokens.device) + 1 + j
    mask = label_row[None, :] <= (batch.lengths[:, None] - 2)
    return mask, label_row.clamp(max=T - 1)


def soft_labels(head: Eagle3Head, top_ids: torch.Tensor, top_logp: torch.Tensor):
    """(draft indices, probabilities) of the target's top-K, renormalised over tokens in the draft vocabulary."""
    d = head.target_to_draft[top_ids]
    p = top_logp.exp() * (d >= 0)
    total = p.sum(-1, keepdim=True)
    return d.clamp(min=0), p / total.clamp(min=1e-9), total.squeeze(-1) > 0


def ttt_losses(head: Eagle3Head, batch: TrainBatch, cfg: TrainConfig):
    """Weighted loss over the unrolled steps, plus per-step loss and top-1 agreement with the target."""
    logits = head.unroll(batch.feats, batch.tokens, cfg.ttt_steps)
    total, per_loss, per_acc = 0.0, [], []
    weights = [cfg.step_decay ** j for j in range(cfg.ttt_steps)]
    for j, lg in enumerate(logits):
        mask, label_row = step_rows(batch, j)
        ids = batch.top_ids[:, label_row]
        d, p, has = soft_labels(head, ids, batch.top_logp[:, label_row])
        mask = mask & has
        logq = F.log_softmax(lg.float(), dim=-1)
        row_loss = -(p * logq.gather(-1, d)).sum(-1)
        n = mask.sum().clamp(min=1)
        loss = (row_loss * mask).sum() / n
        pred = head.draft_ids[lg.argmax(-1)]
        acc = ((pred == ids[..., 0]) & mask).sum().float() / n
        total = total + weights[j] * loss
        per_loss.append(float(loss.detach()))
        per_acc.append(float(acc))
    return total / sum(weights), per_loss, per_acc


def lr_at(step: int, total: int, cfg: TrainConfig, time_frac: float = 0.0) -> float:
    """Linear warmup, then cosine decay to a tenth of the peak, by steps or by the time limit (``time_frac``
    of ``max_minutes`` used), whichever is further along, so a time-limited run still ends fully decayed."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = min(1.0, max((step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps), time_frac))
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def load_train_checkpoint(path: Path) -> dict:
    """A checkpoint written by :meth:`Trainer.save` (head and optimiser state, schedule position), on the CPU."""
    return torch.load(path, map_location="cpu", weights_only=False)


@dataclass
class Progress:
    step: int
    total: int
    loss: float
    acc: list
    tokens_per_s: float
    eta_s: float


class Trainer:
    """Owns the head, optimiser and the position in the seeded batch schedule; saves and resumes checkpoints."""

    def __init__(self, head: Eagle3Head, data: FeatureSet, cfg: TrainConfig, checkpoint: Path | None) -> None:
        self.head, self.data, self.cfg, self.checkpoint = head, data, cfg, checkpoint
        self.device = str(next(head.parameters()).device)
        params = [p for p in head.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
        self.starts = data.starts
        # epochs pack documents differently (seeded shuffles), so they may differ by a batch: one flat schedule
        n_epochs = max(1, math.ceil(cfg.epochs))
        self.schedule = [b for e in range(n_epochs)
                         for b in plan_batches(data.lengths, cfg.batch_tokens, np.random.default_rng([cfg.seed, e]))]
        self.total_steps = max(1, min(len(self.schedule), int(round(len(self.schedule) * cfg.epochs / n_epochs))))
        self.step = 0
        self.tokens_seen = 0
        self.train_seconds = 0.0

    def _time_frac(self) -> float:
        return self.train_seconds / (60 * self.cfg.max_minutes) if self.cfg.max_minutes else 0.0

    def save(self) -> None:
        if self.checkpoint is None:
            return
        with atomic_path(self.checkpoint) as tmp:
            torch.save({"head": self.head.state_dict(), "opt": self.opt.state_dict(), "step": self.step,
                        "tokens_seen": self.tokens_seen, "train_seconds": self.train_seconds,
                        "train_config": self.cfg.as_dict(), "head_config": self.head.config.as_dict()}, tmp)

    def load(self, path: Path) -> None:
        """Resume from a checkpoint file written by :meth:`save`."""
        self.load_state(load_train_checkpoint(path), source=path)

    def load_state(self, state: dict, source: object = "a checkpoint") -> None:
        """Resume from a checkpoint already read (the pipeline reads it once for its vocabulary too);
        ``source`` only names it in the log."""
        self.head.load_state_dict(state["head"])
        self.opt.load_state_dict(state["opt"])
        self.step, self.tokens_seen = int(state["step"]), int(state["tokens_seen"])
        self.train_seconds = float(state["train_seconds"])
        log.info("resumed from %s at step %d", source, self.step)

    def run(self, progress: Callable[[Progress], None] | None = None) -> dict:
        """Train to the planned number of steps (or the time limit); return a summary.

        Denormal floats are flushed to zero (process-wide, where the CPU supports it): a fresh SmolLM2 head
        otherwise produces them and trains ~5x slower on x86 (108 vs 528 steps in 8 minutes), with no gain."""
        torch.set_flush_denormal(True)
        self.head.train()
        t_start, seen_start = time.perf_counter() - self.train_seconds, self.tokens_seen
        t_run, step0 = time.perf_counter(), self.step
        loss, acc = float("nan"), []
        while self.step < self.total_steps:
            if self._time_frac() >= 1.0:
                log.info("time limit of %.1f min reached at step %d", self.cfg.max_minutes, self.step)
                break
            batch = make_batch(self.data, self.schedule[self.step], self.starts, self.device)
            for group in self.opt.param_groups:
                group["lr"] = lr_at(self.step, self.total_steps, self.cfg, self._time_frac())
            total, _, acc = ttt_losses(self.head, batch, self.cfg)
            self.opt.zero_grad(set_to_none=True)
            total.backward()
            torch.nn.utils.clip_grad_norm_(self.head.parameters(), self.cfg.grad_clip)
            self.opt.step()
            self.step += 1
            self.tokens_seen += batch.n_tokens
            self.train_seconds = time.perf_counter() - t_start
            loss = float(total.detach())
            if self.step % self.cfg.checkpoint_every == 0:
                self.save()
            if progress:
                rate = (self.tokens_seen - seen_start) / max(time.perf_counter() - t_run, 1e-9)
                left = (self.total_steps - self.step) * (time.perf_counter() - t_run) / (self.step - step0)
                progress(Progress(self.step, self.total_steps, loss, acc, rate, left))
        self.save()
        return {"steps": self.step, "planned_steps": self.total_steps, "tokens_seen": self.tokens_seen,
                "train_seconds": round(self.train_seconds, 1), "final_loss": loss, "final_acc": acc,
                "tokens_per_s": round(self.tokens_seen / max(self.train_seconds, 1e-9), 1)}


@torch.no_grad()
def chain_acceptance(head: Eagle3Head, data: FeatureSet, depth: int, batch_tokens: int = 4096,
                     count_from: np.ndarray | None = None) -> float:
    """Teacher-forced estimate of τ for a greedy draft *chain* of ``depth`` tokens (1 + accepted per position).

    At each position the head drafts ``depth`` tokens, step j fed the text's token and its own previous output
    (as at run time). Step j counts as accepted when it and all earlier steps equal the target's argmax and
    the text follows that argmax (so the fed token is the accepted one). Positions too close to the end
    cannot accept the missing steps, so this slightly underestimates on short texts. ``count_from[d]``: the
    first row of document d to count (e.g. the last prompt row, to score only the answer as at run time)."""
    head.eval()
    starts = data.starts
    accepted, positions = 0.0, 0
    for docs in plan_batches(data.lengths, batch_tokens, np.random.default_rng(0)):
        batch = make_batch(data, docs, starts, str(head.d2t.device))
        logits = head.unroll(batch.feats, batch.tokens, depth)
        alive = step_rows(batch, 0)[0]
        if count_from is not None:
            first = torch.from_numpy(count_from[docs].astype(np.int64)).to(alive.device)
            alive &= torch.arange(alive.shape[1], device=alive.device)[None, :] >= first[:, None]
        base = alive.clone()
        T = batch.tokens.shape[1]
        for j, lg in enumerate(logits):
            mask, label_row = step_rows(batch, j)
            target = batch.top_ids[:, label_row, 0]
            nxt = batch.tokens[:, (label_row + 1).clamp(max=T - 1)]
            ok = (head.draft_ids[lg.argmax(-1)] == target) & (target == nxt) & mask
            alive = alive & ok
            accepted += float(alive.sum())
        positions += int(base.sum())
    head.train()
    return 1.0 + accepted / max(positions, 1)
