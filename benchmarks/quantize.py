"""Write a GGUF copy in another quantization type with llama.cpp's own quantizer (through llama-cpp-python).

    python benchmarks/quantize.py SRC DST [--type q4_0] [--threads 2]

Why: on this CPU Q4_0 weights batch better than Q4_K_M (the verify pass is a batch), so a Q4_0 copy of a model
fetched as Q4_K_M is the fairer target for speculative decoding; both plain and speculative runs then use it.
Requantizing an already quantized model is allowed (allow_requantize) and costs some quality, equally for
both sides of a comparison.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

TYPES = {"q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1", "q5_0": "LLAMA_FTYPE_MOSTLY_Q5_0",
         "q5_1": "LLAMA_FTYPE_MOSTLY_Q5_1", "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
         "q5_k_m": "LLAMA_FTYPE_MOSTLY_Q5_K_M", "q6_k": "LLAMA_FTYPE_MOSTLY_Q6_K", "f16": "LLAMA_FTYPE_MOSTLY_F16"}


class QuantizeError(Exception):
    """Bad arguments or a failed quantization, reported as one line."""


def quantize(src: Path, dst: Path, qtype: str, threads: int) -> None:
    """Quantize into DST.tmp and rename, so an interrupted run never leaves a truncated DST behind."""
    import llama_cpp

    if not src.is_file():
        raise QuantizeError(f"no model file at {src}")
    if src.resolve() == dst.resolve():
        raise QuantizeError("SRC and DST are the same file")
    if not dst.parent.is_dir():
        raise QuantizeError(f"no folder {dst.parent} for {dst.name}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, TYPES[qtype])
    params.allow_requantize = True
    params.nthread = threads
    tmp = dst.with_name(dst.name + ".tmp")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise QuantizeError(f"llama_model_quantize failed with code {rc} (is {src} a GGUF model?)")
    os.replace(tmp, dst)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path, help="input GGUF model")
    ap.add_argument("dst", type=Path, help="output GGUF model (replaced if it exists)")
    ap.add_argument("--type", default="q4_0", choices=sorted(TYPES), help="target type (default q4_0)")
    ap.add_argument("--threads", type=int, default=2, help="quantizer threads (default 2)")
    args = ap.parse_args(argv)
    try:
        if args.threads < 1:
            raise QuantizeError("--threads must be at least 1")
        quantize(args.src, args.dst, args.type, args.threads)
    except QuantizeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.dst} ({args.type}, {args.dst.stat().st_size / 2**20:.0f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
