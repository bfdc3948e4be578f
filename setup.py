"""Package discovery for the wheel: every package under ``eagle2_local/`` is found, and ``convert/`` (the head
converter, kept at the repository's top level) installs as ``eagle2_local.convert``.

Metadata lives in ``pyproject.toml``; this file only says where the code is, so that a new subpackage can never be
left out of what ``pip install .`` installs (a hand-kept list once forgot one).
"""

from setuptools import find_namespace_packages, find_packages, setup

PACKAGE = "eagle2_local"
CONVERT = "convert"


def discovered_packages() -> list[str]:
    """The package, its subpackages and data folders, plus ``convert`` and its subpackages mapped under the package."""
    own = find_packages(include=[PACKAGE, f"{PACKAGE}.*"])
    # data folders (the default head, chat templates) hold no Python; listed so setuptools ships them as package data
    data = find_namespace_packages(include=[f"{PACKAGE}.data", f"{PACKAGE}.data.*"])
    converter = [f"{PACKAGE}.{name}" for name in find_packages(include=[CONVERT, f"{CONVERT}.*"])]
    return own + data + converter


setup(packages=discovered_packages(), package_dir={f"{PACKAGE}.{CONVERT}": CONVERT})
