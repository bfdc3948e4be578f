"""BENCHMARKS.md (current figures) and benchmarks/ARCHIVE.md (every other run) are what
benchmarks/benchmarks_table.py writes from benchmarks/results/, so neither can drift from the reports."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _table_module():
    spec = importlib.util.spec_from_file_location("benchmarks_table", ROOT / "benchmarks" / "benchmarks_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_benchmarks_md_and_archive_are_what_the_table_script_writes():
    table = _table_module()
    current, archive = table.render(table.full_record(), table.bench_reports())
    stale = "is stale: run python benchmarks/make_record.py && python benchmarks/benchmarks_table.py"
    assert (ROOT / "BENCHMARKS.md").read_text() == current, f"BENCHMARKS.md {stale}"
    assert (ROOT / "benchmarks" / "ARCHIVE.md").read_text() == archive, f"benchmarks/ARCHIVE.md {stale}"


def test_current_table_is_short_and_every_row_links_to_a_section_in_the_file():
    table = _table_module()
    text = (ROOT / "BENCHMARKS.md").read_text()
    anchors = {table.anchor(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}
    rows, stems = table.current_rows(table.bench_reports())
    assert 0 < len(rows) <= 40
    assert stems and all(table.anchor(stem) in anchors for stem in stems)

