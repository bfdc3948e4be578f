"""A random-weight EAGLE-3 head shaped like the shipped SmolLM2 head but with a 32k draft vocabulary (a Llama-3
head's size), for measuring host time per round with a larger draft vocabulary.

    python benchmarks/synthetic_head.py [--draft-vocab 32768] [--out models/synthetic-smollm2-eagle3-32k.gguf]
    python benchmarks/host_time.py --threads 1 --total-tokens 60 --max-tokens 128 --head models/synthetic-smollm2-eagle3-32k.gguf

Random weights accept almost nothing, but a fixed 60-node tree is grown and verified every round all the same,
which is what the host-time figure measures.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from eagle2_local.convert.eagle3 import convert_eagle3
from eagle2_local.formats.models import default_model_path
from head_checkpoints import random_eagle3  # benchmarks/head_checkpoints.py, beside this script


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft-vocab", type=int, default=32768)
    ap.add_argument("--out", default="models/synthetic-smollm2-eagle3-32k.gguf")
    args = ap.parse_args()
    target = default_model_path()
    with tempfile.TemporaryDirectory() as tmp:
        # SmolLM2-135M's shape, the shipped head's feature layers and RoPE base
        folder, _, _ = random_eagle3(Path(tmp) / "head", hidden=576, target_hidden=576, n_head=9, n_head_kv=3,
                                     ffn=1536, vocab=49152, draft_vocab=args.draft_vocab, layers=[2, 15, 27],
                                     rope_theta=100000.0, norm_before_fc=True, scale=0.05)
        out = convert_eagle3(folder, args.out, target, outtype="q8_0")
    print(out)


if __name__ == "__main__":
    main()
