"""What a command line names on the Hub (``--hf-repo``, ``--hf-file``, ``--head-hf``, ``--draft-model-hf``), turned
into the local paths of the options of the same roles."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .files import HubError, HubRef, download_gguf
from .heads import draft_model_from_hub, head_from_hub


@dataclass(frozen=True)
class HubNames:
    """What the command line names on the Hub; each one given replaces the path option of the same role."""

    hf_repo: str | None = None
    hf_file: str | None = None
    head_hf: str | None = None
    draft_model_hf: str | None = None

    def any(self) -> bool:
        return any((self.hf_repo, self.hf_file, self.head_hf, self.draft_model_hf))

    def resolve(self, model, head, draft_model, say: Callable[[str], None] | None = None
                ) -> tuple[Path | None, Path | None, Path | None]:
        """``(model, head, draft_model)`` as local paths, the named ones downloaded (and a head converted for the
        model); a name given beside the path of the same role is refused."""
        for name, value, path_option, path in (("--hf-repo", self.hf_repo, "--model", model),
                                               ("--head-hf", self.head_hf, "--head", head),
                                               ("--draft-model-hf", self.draft_model_hf, "--draft-model",
                                                draft_model)):
            if value and path:
                raise HubError(f"give {name} or {path_option}, not both")
        if self.hf_file and not self.hf_repo:
            raise HubError("--hf-file names a file of the --hf-repo repository: give --hf-repo too")
        if self.hf_repo:
            model = download_gguf(HubRef.parse(self.hf_repo, self.hf_file))
        if self.draft_model_hf:
            draft_model = draft_model_from_hub(self.draft_model_hf)
        if self.head_hf:
            from ..formats.models import resolve_model
            head = head_from_hub(self.head_hf, resolve_model(model), say=say)
        return model, head, draft_model
