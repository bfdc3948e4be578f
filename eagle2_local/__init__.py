"""eagle2-local: EAGLE-2 speculative decoding with dynamic draft trees for local GGUF models on llama.cpp."""

from .errors import (ContextFullError, DecodeError, Eagle2Error, EmptyPromptError, IncompatibleDraftError, ModelError,
                     TreeError, UnsupportedModelError)

__version__ = "0.1.0"

__all__ = ["Eagle2", "Eagle2Error", "ModelError", "UnsupportedModelError", "IncompatibleDraftError", "TreeError",
           "ContextFullError", "EmptyPromptError", "DecodeError", "__version__"]


def __getattr__(name: str):
    # Importing Eagle2 loads llama.cpp's shared library; do it only when asked for.
    if name == "Eagle2":
        from .api import Eagle2
        return Eagle2
    raise AttributeError(name)
