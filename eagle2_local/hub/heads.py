"""Drafts by repository name: an EAGLE head folder as its publisher ships it, converted once against the target.

A head repository holds either a folder (``config.json`` and weights: SafeAILab, SpecForge, speculators, ModelOpt,
AngelSlim) or an ``eagle3`` GGUF (llama.cpp's converter). A folder is converted with the ``convert`` package, as
``eagle2-local convert HEAD -o H.gguf --target M.gguf`` would, into ``hub-heads/`` of the cache folder, named by
the head's commit and the target file's identity: the next run (offline too) finds it there and converts
nothing. The conversion checks the head against the target (vocabulary, hidden size, layers) and refuses a
mismatch in one line before anything loads. A GGUF head is used as downloaded (the runtime checks it at open).
"""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path
from typing import Callable

from ..errors import Eagle2Error, IncompatibleDraftError
from ..formats.atomic_write import atomic_path
from ..formats.cache_root import cache_root
from ..measure.cost_cache import file_identity
from .files import HubError, HubRef, Listing, choose_gguf, download_gguf, fetch, list_repo

log = logging.getLogger(__name__)

HEADS_FOLDER = "hub-heads"
WEIGHT_FILES = re.compile(r"(^|/)(config\.json|[^/]*\.safetensors|[^/]*\.safetensors\.index\.json|pytorch_model"
                          r"[^/]*\.bin|pytorch_model\.bin\.index\.json)$")


def head_from_hub(repo_id: str, target: str | Path, cache_dir=None,
                  say: Callable[[str], None] | None = None) -> Path:
    """A head GGUF for ``target`` from the head repository ``repo_id`` (downloaded and converted once)."""
    listing = list_repo(repo_id, cache_dir, include="*")
    names = listing.names
    if "config.json" not in names:
        return fetch(listing, choose_gguf(repo_id, names, HubRef(repo_id, pattern="*.gguf")), cache_dir)
    wanted = [n for n in names if WEIGHT_FILES.search(n) and "/" not in n]
    if any(n.endswith(".safetensors") for n in wanted):  # both formats published: the safetensors are enough
        wanted = [n for n in wanted if not n.endswith(".bin") and not n.endswith(".bin.index.json")]
    folder = _folder_of(listing, wanted, cache_dir)
    out = converted_path(repo_id, folder.name, target)
    if out.is_file():
        log.info("%s: the head converted for this target before: %s", repo_id, out)
        return out
    if say is not None:
        say(f"converting the head {repo_id} for {Path(target).name} (once; kept in {out.parent})")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_path(out) as tmp:
            convert_folder(folder, tmp, target, on_choices=None if say is None else lambda choices: say(
                "choices made for you (stored in the GGUF): " + "; ".join(f"{k}: {v}" for k, v in choices.items())))
    except Eagle2Error as exc:
        raise IncompatibleDraftError(f"the head {repo_id} does not fit {Path(target).name}: {exc}") from None
    return out


def _folder_of(listing: Listing, names: list[str], cache_dir) -> Path:
    """The snapshot folder holding ``names`` (each downloaded and checked first when online)."""
    if listing.snapshot is not None:
        missing = [n for n in names if not (listing.snapshot / n).is_file()]
        if missing:
            raise HubError(f"{listing.repo_id}: {', '.join(missing)} missing from the cache, offline: "
                           f"hf download {listing.repo_id}")
        return listing.snapshot
    paths = [fetch(listing, n, cache_dir) for n in names]
    return paths[0].parent


def converted_path(repo_id: str, commit: str, target: str | Path) -> Path:
    """Where the head converted for ``target`` is kept: one file per head commit and target file."""
    key = hashlib.sha256(f"{repo_id}@{commit}|{file_identity(target)}".encode()).hexdigest()[:16]
    return cache_root() / HEADS_FOLDER / f"{repo_id.replace('/', '--')}-{key}.gguf"


def convert_folder(folder: Path, out: Path, target: str | Path,
                   on_choices: Callable[[dict], None] | None = None) -> Path:
    """``eagle2-local convert FOLDER -o OUT --target TARGET`` (EAGLE-3 or EAGLE-1/2, by the config);
    ``on_choices`` hears what the converter decided on the user's behalf, as ``convert`` prints it."""
    try:
        from ..convert.checkpoint import read_config
        from ..convert.eagle1 import convert_head
        from ..convert.eagle3 import convert_eagle3, is_eagle3_config
    except ModuleNotFoundError as exc:  # a checkout used without installing has convert/ at the top level
        if exc.name != "eagle2_local.convert":
            raise
        from convert.checkpoint import read_config
        from convert.eagle1 import convert_head
        from convert.eagle3 import convert_eagle3, is_eagle3_config
    if is_eagle3_config(read_config(folder)):
        return convert_eagle3(folder, out, target, on_choices=on_choices)
    return convert_head(folder, out, target=target, on_choices=on_choices)


def draft_model_from_hub(text: str, cache_dir=None) -> Path:
    """``--draft-model-hf REPO[:QUANT]``: a draft model's GGUF, chosen as the target's is."""
    return download_gguf(HubRef.parse(text), cache_dir)
