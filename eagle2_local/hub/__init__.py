"""Models and drafts by Hugging Face repository name (``--hf-repo``, ``--head-hf``, ``--draft-model-hf``,
``Eagle2.from_pretrained``): downloaded through ``huggingface_hub`` (an optional extra), heads converted once.

This layer sits under the entry points (``commands/``, ``api.py``) and above ``formats/`` and the converters;
nothing below it imports it.
"""

from .files import HubError, HubRef, download_gguf, pretrained_file
from .heads import draft_model_from_hub, head_from_hub
from .names import HubNames

__all__ = ["HubError", "HubRef", "HubNames", "download_gguf", "head_from_hub", "draft_model_from_hub",
           "pretrained_file"]
