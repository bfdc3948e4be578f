"""One cache folder for everything the package keeps between runs: ``$EAGLE2_LOCAL_CACHE`` first, then the XDG
cache folder, then ``~/.cache``; the calibrations and the translated heads both live under it."""

from __future__ import annotations

from pathlib import Path

from eagle2_local.formats.cache_root import CACHE_ENV, cache_root


def test_the_own_variable_wins_then_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "own"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "own"
    monkeypatch.delenv(CACHE_ENV)
    assert cache_root() == tmp_path / "xdg" / "eagle2-local"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "eagle2-local"


def test_empty_variables_count_as_unset(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, "")
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_root() == Path(tmp_path) / ".cache" / "eagle2-local"
