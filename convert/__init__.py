"""Converters from published draft-head checkpoints to eagle2-local's GGUF formats.

    eagle2-local convert HEAD_DIR -o head.gguf [--target TARGET.gguf] [--outtype f32|f16|q8_0]
    python -m convert HEAD_DIR -o head.gguf ...
"""

from .eagle1 import convert_head, load_checkpoint

__all__ = ["convert_head", "load_checkpoint"]
