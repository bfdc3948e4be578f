"""The one folder the package keeps files in between runs: the auto budget's calibrations and translated heads.

``$EAGLE2_LOCAL_CACHE`` names it outright (the tests point it at a folder of their own, so a run never touches
the user's cache); otherwise it is ``eagle2-local`` in the XDG cache folder, ``$XDG_CACHE_HOME`` or
``~/.cache``.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "EAGLE2_LOCAL_CACHE"


def cache_root() -> Path:
    """``$EAGLE2_LOCAL_CACHE``, else ``$XDG_CACHE_HOME/eagle2-local``, else ``~/.cache/eagle2-local``; read at every
    call, so a change of the environment (a test's, a server's) takes effect at once."""
    own = os.environ.get(CACHE_ENV)
    if own:
        return Path(own).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "eagle2-local"
