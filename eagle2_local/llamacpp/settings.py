"""What a llama.cpp context is created with (:class:`ContextSettings`), and how many CPUs its threads may use."""

from __future__ import annotations

import os
from dataclasses import dataclass

FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}  # enum llama_flash_attn_type

@dataclass(frozen=True)
class ContextSettings:
    """What a context is created with. Plain and speculative runs use the same settings for fair figures."""

    n_ctx: int = 4096
    n_batch: int = 512
    n_seq_max: int = 64
    n_threads: int | None = None
    embeddings: bool = False  # post-norm hidden states for EAGLE heads; costs an output per token
    flash_attn: str = "auto"  # "auto" | "on" | "off" (llama.cpp's flash_attn_type)
    layer_inputs: tuple[int, ...] = ()  # layers whose residual inputs every decode copies out (EAGLE-3 features)
    # One KV buffer shared by all sequences: needed when a token belongs to several sequences (tree nodes). Many
    # independent sequences (batched generation) want False: each then attends over its own n_ctx/n_seq_max
    # cells instead of over every sequence's cells.
    kv_unified: bool = True
    # Recurrent-state snapshots per sequence (llama.cpp's n_rs_seq): how many of the last tokens of a recurrent or
    # hybrid model's state can be taken back. llama.cpp ignores it for attention-only models and clamps it to 0
    # for architectures that cannot roll back.
    n_rs_seq: int = 0
    # The post-norm hidden state of every decoded token (llama.cpp's unmasked nextn embeddings): what a model's
    # MTP layers read beside the next token. Costs a copy of one row per token, no extra output.
    nextn_features: bool = False
    # A context that runs the model's MTP (NextN) layers instead of its trunk (llama.cpp's LLAMA_CONTEXT_TYPE_MTP;
    # the model loaded with ``load_mtp``): entries carry a token and the hidden state before it; its own nextn
    # embeddings (one row per entry) feed a deeper draft step.
    mtp: bool = False

    def threads(self) -> int:
        """``n_threads``, else every CPU this process may run on."""
        return self.n_threads or usable_cpus()


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask where the OS has one (``taskset``, a container's cpuset, a
    pinned test worker), else the machine's count. llama.cpp's threads spin at every barrier, so one thread more
    than the CPUs that run them costs a scheduler slice per barrier."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS and Windows have no affinity mask
        return max(1, os.cpu_count() or 1)
