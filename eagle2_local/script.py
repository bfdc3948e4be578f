"""The ``eagle2-local`` console script.

The click layer is the repository's top-level ``cli.py``. A wheel installs it inside this package, as
``eagle2_local.cli.cli`` (pyproject's ``package-dir``), so site-packages gains no top-level ``cli``; an editable
install leaves it in the checkout, next to this package, where setuptools' editable finder cannot map a single
file under the package, so it is loaded from there.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def main():
    """Run the click group, wherever the install put ``cli.py``."""
    try:
        from eagle2_local.cli.cli import main as run
    except ModuleNotFoundError as exc:
        if exc.name not in ("eagle2_local.cli", "eagle2_local.cli.cli"):
            raise
        run = _checkout_cli().main
    return run()


def _checkout_cli():
    path = Path(__file__).resolve().parents[1] / "cli.py"
    spec = importlib.util.spec_from_file_location("cli", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["cli"] = module
    spec.loader.exec_module(module)
    return module
