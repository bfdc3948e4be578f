"""GGUF files by repository name on the Hugging Face Hub, through ``huggingface_hub``.

Everything goes through the library everyone's cache is shared with, so ``HF_HOME``, ``HF_HUB_CACHE``,
``HF_TOKEN``, ``HF_ENDPOINT`` and ``HF_HUB_OFFLINE`` mean what they mean for ``hf download`` and for
llama-cpp-python's ``Llama.from_pretrained``; its progress bars, its resumption of a cut transfer and its size
check apply. On top, an LFS file's bytes are checked against the sha256 the Hub lists for it (the library trusts
the transfer), and a file that fails is removed from the cache so the next run downloads it again.

Which file a name means follows llama.cpp's ``-hf REPO[:QUANT]``: the quant named (in any case), else Q4_K_M,
else Q4_0, else the first GGUF; multimodal projectors (``mmproj``) are never the model. ``--hf-file`` takes a
name or a glob, as ``Llama.from_pretrained``'s ``filename``. Offline (``HF_HUB_OFFLINE=1``, or the Hub
unreachable) the choice is made among the files of the cached snapshot, with no network call at all.
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import Eagle2Error

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'eagle2-local[hub]'"
DEFAULT_QUANTS = ("Q4_K_M", "Q4_0")  # llama.cpp's -hf preference when no quant is named
SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
LISTED_NAMES = 12  # how many of a repository's files an error line names


class HubError(Eagle2Error):
    """A name that does not lead to one file: no such repository or file, several matches, a bad download."""


@dataclass(frozen=True)
class HubRef:
    """A model by name: ``REPO`` with a file name or glob (``--hf-file``), or ``REPO:QUANT`` (llama.cpp's form)."""

    repo_id: str
    pattern: str | None = None
    quant: str | None = None

    @classmethod
    def parse(cls, text: str, hf_file: str | None = None) -> "HubRef":
        repo_id, _, quant = text.partition(":")
        if repo_id.count("/") != 1 or not all(repo_id.split("/")):
            raise HubError(f"{text!r} is not a Hugging Face repository name: give ORG/NAME[:QUANT]")
        if quant and hf_file:
            raise HubError(f"give the quant ({text}) or --hf-file ({hf_file}), not both")
        return cls(repo_id, hf_file or None, quant or None)

    def describe(self) -> str:
        return self.pattern or (self.quant and f"quant {self.quant}") or "a GGUF (Q4_K_M, Q4_0 or the first)"


def hub_library():
    """``huggingface_hub``, or one line saying how to install it (it is an optional extra)."""
    try:
        import huggingface_hub
        import huggingface_hub.constants
        import huggingface_hub.file_download  # noqa: F401  (submodules read below: the package loads lazily)
    except ImportError:
        raise HubError(f"models by name need huggingface_hub: {INSTALL_HINT}") from None
    return huggingface_hub


# ------------------------------------------------------------------ choosing a file
def choose_gguf(repo_id: str, names: list[str], ref: HubRef) -> str:
    """The one file ``ref`` names among a repository's files (the first shard of a split model)."""
    ggufs = sorted(n for n in names if n.endswith(".gguf") and "mmproj" not in os.path.basename(n).lower())
    if ref.pattern is not None:
        matches = [n for n in sorted(names) if fnmatch.fnmatch(n, ref.pattern)
                   or fnmatch.fnmatch(os.path.basename(n), ref.pattern)]
    elif ref.quant is not None:
        matches = _with_quant(ggufs, ref.quant)
    else:
        matches = next((m[:1] for m in (_with_quant(ggufs, q) for q in DEFAULT_QUANTS) if m), ggufs[:1])
    matches = [m for m in matches if not SHARD.search(m) or SHARD.search(m).group(1) == "00001"]
    if len(matches) == 1:
        return matches[0]
    held = ", ".join((ggufs or sorted(names))[:LISTED_NAMES]) or "no files"
    more = f" and {len(ggufs or names) - LISTED_NAMES} more" if len(ggufs or names) > LISTED_NAMES else ""
    what = "several files match" if matches else "nothing matches"
    raise HubError(f"{repo_id}: {what} {ref.describe()} ({', '.join(matches) or 'none'}); it holds {held}{more}")


def _with_quant(names: list[str], quant: str) -> list[str]:
    """The files whose name carries ``quant`` as a word (``-Q4_K_M.gguf``, ``.q4_k_m-00001-of-00002.gguf``)."""
    word = re.compile(rf"(^|[-._]){re.escape(quant)}([-._]|$)", re.IGNORECASE)
    return [n for n in names if word.search(os.path.basename(n).removesuffix(".gguf"))]


def shard_names(first: str, names: list[str]) -> list[str]:
    """Every file of a split GGUF (llama.cpp loads the rest from beside the first), or just ``first``."""
    m = SHARD.search(first)
    if m is None:
        return [first]
    stem = first[:m.start()]
    return sorted(n for n in names if n.startswith(stem) and SHARD.search(n)
                  and SHARD.search(n).group(2) == m.group(2))


# ------------------------------------------------------------------ the repository's files
@dataclass(frozen=True)
class Listing:
    """A repository's files: online, with each LFS file's sha256; offline, the cached snapshot's files."""

    repo_id: str
    sha256: dict[str, str | None]
    snapshot: Path | None = None  # set when the listing came from the cache (offline)

    @property
    def names(self) -> list[str]:
        return sorted(self.sha256)


def list_repo(repo_id: str, cache_dir: str | os.PathLike | None = None, revision: str | None = None,
              include: str | None = None) -> Listing:
    """The repository's files from the Hub, or from the cached snapshot when offline or unreachable (``include``:
    the glob an error line tells the user to download)."""
    hf = hub_library()
    if _offline(hf):
        return cached_listing(repo_id, cache_dir, revision, "HF_HUB_OFFLINE is set", include)
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError
    try:
        entries = list(hf.HfApi().list_repo_tree(repo_id, recursive=True, revision=revision))
    except RepositoryNotFoundError:
        raise HubError(f"{repo_id}: no such model repository on {hf.constants.ENDPOINT} (a private or gated one "
                       "needs HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise HubError(f"{repo_id}: no revision {revision!r} on {hf.constants.ENDPOINT}") from None
    except HfHubHTTPError as exc:
        raise HubError(f"{repo_id}: the Hub answered {_first_line(exc)}") from None
    except Exception as exc:  # the Hub unreachable: the cache answers, as llama.cpp's -hf falls back on its own
        if not network_error(exc):
            raise
        return cached_listing(repo_id, cache_dir, revision, f"{hf.constants.ENDPOINT} is unreachable ({exc})",
                              include)
    files = [e for e in entries if hasattr(e, "size")]
    return Listing(repo_id, {f.path: f.lfs.sha256 if f.lfs is not None else None for f in files})


def _offline(hf) -> bool:
    """``HF_HUB_OFFLINE``, as the installed huggingface_hub reads it (a function since 1.0, a constant before)."""
    read = getattr(hf.constants, "is_offline_mode", None)
    return bool(read() if callable(read) else hf.constants.HF_HUB_OFFLINE)


def cached_listing(repo_id: str, cache_dir, revision: str | None, why: str, include: str | None = None) -> Listing:
    """The files of the cached snapshot (refs/REVISION → snapshots/COMMIT), read without any network call."""
    hf = hub_library()
    storage = Path(cache_dir or hf.constants.HF_HUB_CACHE) / hf.file_download.repo_folder_name(
        repo_id=repo_id, repo_type="model")
    ref = storage / "refs" / (revision or "main")
    commit = ref.read_text().strip() if ref.is_file() else revision
    snapshot = storage / "snapshots" / commit if commit else None
    if snapshot is None or not snapshot.is_dir():
        raise HubError(f"{repo_id} is not in the Hugging Face cache ({storage.parent}) and {why}: download it "
                       f"first: {download_command(repo_id, include)}")
    names = [p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()]
    return Listing(repo_id, {n: None for n in names}, snapshot=snapshot)


# ------------------------------------------------------------------ downloading
def fetch(listing: Listing, name: str, cache_dir=None, local_dir=None, revision: str | None = None) -> Path:
    """One file of the repository on disk: from the cache (offline: only there), else downloaded and checked."""
    if listing.snapshot is not None:
        return listing.snapshot / name
    hf = hub_library()
    from huggingface_hub.errors import HfHubHTTPError
    before = None if local_dir else hf.try_to_load_from_cache(listing.repo_id, name, cache_dir=cache_dir,
                                                             revision=revision)
    try:
        path = Path(hf.hf_hub_download(listing.repo_id, name, cache_dir=cache_dir, local_dir=local_dir,
                                       revision=revision))
    except HfHubHTTPError as exc:
        raise HubError(f"{listing.repo_id}/{name}: the Hub answered {_first_line(exc)}") from None
    except Exception as exc:
        if not network_error(exc):
            raise
        raise HubError(f"{listing.repo_id}/{name}: the download failed ({_first_line(exc)}); run again to "
                       "download it") from None
    expected = listing.sha256.get(name)
    if expected and str(path) != str(before):
        _check_sha256(path, expected, f"{listing.repo_id}/{name}")
    return path


def _check_sha256(path: Path, expected: str, what: str) -> None:
    """The downloaded bytes against the Hub's sha256; on a mismatch the file leaves the cache (link and blob), so
    the cache holds only good files and the next run downloads it afresh."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() == expected:
        return
    blob = path.resolve()
    path.unlink(missing_ok=True)
    blob.unlink(missing_ok=True)
    raise HubError(f"{what}: checksum mismatch (sha256 {digest.hexdigest()[:16]}..., the Hub lists "
                   f"{expected[:16]}...); the file was removed from the cache, run again to download it afresh")


def download_command(repo_id: str, include: str | None) -> str:
    """The ``hf`` command that puts what is missing into the cache."""
    return f"hf download {repo_id}" + (f" --include '{include}'" if include else "")


def download_gguf(ref: HubRef, cache_dir=None, local_dir=None, revision: str | None = None) -> Path:
    """The local path of the GGUF ``ref`` names (every shard of a split model downloaded beside it)."""
    include = ref.pattern or (f"*{ref.quant}*.gguf" if ref.quant else "*.gguf")
    listing = list_repo(ref.repo_id, cache_dir, revision, include)
    try:
        first = choose_gguf(ref.repo_id, listing.names, ref)
    except HubError as exc:
        if listing.snapshot is None:
            raise
        raise HubError(f"{exc} in the cache, offline: {download_command(ref.repo_id, include)}") from None
    paths = [fetch(listing, name, cache_dir, local_dir, revision) for name in shard_names(first, listing.names)]
    log.info("%s: %s", ref.repo_id, paths[0])
    return paths[0]


NETWORK_ERRORS = {"TransportError", "ConnectionError", "Timeout", "OSError"}


def network_error(exc: BaseException) -> bool:
    """A connection refused, reset or timed out, whichever HTTP library the installed huggingface_hub uses (httpx
    since 1.0, requests before): by the names of the error's classes, as the library re-raises them."""
    return any(cls.__name__ in NETWORK_ERRORS for cls in type(exc).__mro__)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def pretrained_file(repo_id: str, filename: str | None, additional_files=None, cache_dir=None,
                    local_dir=None) -> Path:
    """``Llama.from_pretrained``'s download: the one file ``filename`` (a name or glob; None: llama.cpp's quant
    choice) matches, and each of ``additional_files`` (names or globs, one match each) beside it."""
    ref = HubRef.parse(repo_id, filename)
    model = download_gguf(ref, cache_dir, local_dir)
    if additional_files:
        listing = list_repo(repo_id, cache_dir)
        for pattern in additional_files:
            fetch(listing, choose_gguf(repo_id, listing.names, HubRef(repo_id, pattern=pattern)), cache_dir,
                  local_dir)
    return model
