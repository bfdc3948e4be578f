"""The package's own exception types.

Everything that can go wrong because of user input (a bad file, an oversize tree, a full context) raises one of
these *before* llama.cpp is called, because llama.cpp aborts the whole process on several of those conditions.
"""


class Eagle2Error(Exception):
    """Base class: the CLI prints these as one-line errors instead of a traceback."""


class ModelError(Eagle2Error):
    """A model or head file is missing, not GGUF, truncated, or cannot be loaded by llama.cpp."""


class UnsupportedModelError(ModelError):
    """A model llama.cpp cannot generate with token by token (an encoder, a diffusion or an embedding model)."""


class IncompatibleDraftError(Eagle2Error):
    """A draft model or head does not fit its target (vocabulary, hidden size, ...)."""


class TreeError(Eagle2Error):
    """A draft tree is malformed or does not fit the context's batch / sequence limits."""


class ContextFullError(Eagle2Error):
    """The prompt plus what is being generated no longer fits the context window."""


class EmptyPromptError(Eagle2Error):
    """A prompt without a single token (an empty text on a model that adds no BOS): there is nothing to decode."""


class ParameterError(Eagle2Error):
    """A value out of its range (a temperature below 0, a top_p above 1); ``param`` names it, so that an API
    client is told which field to change."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class PrefillCancelled(Eagle2Error):
    """A prompt's evaluation stopped between two batches because its caller asked (a client that left)."""


class DecodeError(Eagle2Error):
    """llama_decode returned an error code (it did not abort, but produced nothing usable)."""
